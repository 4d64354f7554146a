"""Attention-pooling heads (``oretrofit/hosts/transformers/pooling.py``): a learned probe of
presence 1 attending over the tokens is O cross-attention, so null tokens carry no mass into
``pooler_output`` and τ → 0 recovers the head; a head the host cannot give that form is refused."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from torch import nn  # noqa: E402

from oretrofit import RetrofitError, retrofit, retrofitted  # noqa: E402
from hosts.transformers import zoo  # noqa: E402
from oretrofit.hosts.transformers.contracts import (agreement, hidden_states,  # noqa: E402
                                                    null_insertion)

SIGLIP = next(a for a in zoo.ARCHITECTURES if a.model_type == "siglip_vision_model")


@pytest.fixture(scope="module")
def siglip() -> tuple[nn.Module, dict]:
    model = zoo.build(SIGLIP)
    return model, zoo.example_inputs(model)


def _pooled(model: nn.Module, inputs: dict) -> torch.Tensor:
    with torch.no_grad():
        return model(**inputs).pooler_output                                     # (B, d)


def test_the_contracts_measure_the_pooled_vector(siglip: tuple) -> None:
    model, inputs = siglip
    states = hidden_states(model, lambda: model(**inputs))
    assert torch.equal(states["pooled"], _pooled(model, inputs))


@pytest.mark.parametrize("arm", ["oa", "full-o"])
def test_tau_to_zero_recovers_the_head(siglip: tuple, arm: str) -> None:
    model, inputs = siglip
    reference = _pooled(model, inputs)
    with retrofitted(model, arm, 1e-12, eps=1e-30) as r:
        assert "head.attention" in [row["site"] for row in r.report()]
        pooled = _pooled(model, inputs)
    assert ((pooled - reference).abs().max() / reference.abs().max()).item() <= 1e-4
    assert agreement(model, inputs, arm, 1e-12, 1e-30)["relative_max_diff"] <= 1e-4


def test_null_tokens_carry_no_mass_into_the_pooled_vector(siglip: tuple) -> None:
    """Nulls inserted in the middle leave ``pooler_output`` as it was; the host's head (softmax,
    every key weighted 1) over the very same gated tokens moves it."""
    model, inputs = siglip
    seen: list[torch.Tensor] = []
    handle = model.head.register_forward_pre_hook(lambda m, args: seen.append(args[0]))
    try:
        with retrofitted(model, "full-o", 1e-6):
            result = null_insertion(model, inputs)
    finally:
        handle.remove()
    assert result["inserted_max_abs"] == 0 and result["old_max_delta"] <= 1e-4
    # the head's inputs: the reference run's first image, then the one with 2 nulls inserted
    before, after = seen[-2], seen[-1]
    assert after.shape[1] == before.shape[1] + 2 and not after[:, 2:4].any()
    with torch.no_grad():
        moved = (model.head(after) - model.head(before)).abs().max() / model.head(before).abs().max()
    assert moved.item() > 1e-2                     # ungated, the nulls take softmax mass


def test_a_query_other_than_the_probe_is_refused(siglip: tuple) -> None:
    model, inputs = siglip
    tokens = torch.randn(2, 4, model.config.hidden_size)
    with retrofitted(model, "oa", 1e-6), pytest.raises(RetrofitError, match="not the head's probe"):
        model.head.attention(tokens, tokens, tokens)


def test_a_head_whose_attention_appends_keys_is_refused() -> None:
    model = zoo.build(SIGLIP)
    size = model.config.hidden_size
    model.head.attention = nn.MultiheadAttention(size, 4, batch_first=True, add_bias_kv=True)
    with pytest.raises(RetrofitError, match=r"head\.attention.*add_bias_kv"):
        retrofit(model, "oa")
    assert not hasattr(model, "_oretrofit_retrofit")
