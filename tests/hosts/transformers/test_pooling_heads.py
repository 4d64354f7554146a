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


# --- position terms an embeddings module computes itself (gates.gate_position_term) ----------

_WIDE = dict(hidden_size=32, num_hidden_layers=2, num_attention_heads=4, intermediate_size=64)
TOWERS = {"siglip2_vision_model": dict(_WIDE, patch_size=4, num_patches=64),
          "gemma4_vision": dict(_WIDE, num_key_value_heads=2, head_dim=8, patch_size=4)}


def _tower(model_type: str) -> tuple[nn.Module, dict]:
    from transformers import AutoConfig, AutoModel
    torch.manual_seed(0)
    model = zoo.jitter(AutoModel.from_config(AutoConfig.for_model(model_type,
                                                                  **TOWERS[model_type])))
    return model, zoo.example_inputs(model)


def _embeddings(model: nn.Module) -> nn.Module:
    return getattr(model, "embeddings", None) or model.patch_embedder


@pytest.mark.parametrize("model_type", list(TOWERS))
def test_a_zero_patch_embedding_gets_no_position_term(model_type: str) -> None:
    """SigLIP2's table resized per image and Gemma4's lookup by pixel positions: a row whose
    patch embedding is zero leaves the embeddings as exactly 0 under full-o; ungated it takes
    its position's embedding. τ → 0 recovers the host."""
    model, inputs = _tower(model_type)
    embeddings = _embeddings(model)
    owner = type(embeddings).__name__
    patches = next(m for m in embeddings.children() if isinstance(m, nn.Linear))
    zero_row = patches.register_forward_hook(
        lambda m, args, out: torch.cat([torch.zeros_like(out[:, :1]), out[:, 1:]], dim=1))
    seen: list[torch.Tensor] = []
    record = embeddings.register_forward_hook(lambda m, args, out: seen.append(out))
    try:
        with torch.no_grad():
            model(**inputs)
            with retrofitted(model, "full-o", 1e-6) as r:
                assert any(row["kind"] == "inject" and owner in row["carrier"]
                           for row in r.report())
                model(**inputs)
    finally:
        zero_row.remove(), record.remove()
    assert seen[0][:, 0].abs().max() > 1e-2                   # ungated: the position's embedding
    assert torch.equal(seen[1][:, 0], torch.zeros_like(seen[1][:, 0]))
    assert agreement(model, inputs, "full-o", 1e-12, 1e-30)["relative_max_diff"] <= 1e-4


def test_siglip2_padding_rows_keep_their_mask_and_the_head_pools_live_tokens() -> None:
    """Rows past an image's ``spatial_shapes`` (``pixel_attention_mask`` 0) take the first cell's
    resized embedding in the host and here alike; the pooled vector agrees at τ → 0 with them."""
    model, inputs = _tower("siglip2_vision_model")
    inputs = dict(inputs, spatial_shapes=torch.tensor([[4, 4], [3, 4]]))
    inputs["pixel_attention_mask"] = inputs["pixel_attention_mask"].clone()
    inputs["pixel_attention_mask"][1, 12:] = 0
    with torch.no_grad():
        reference = model(**inputs).pooler_output
        with retrofitted(model, "full-o", 1e-12, eps=1e-30):
            pooled = model(**inputs).pooler_output
    assert ((pooled - reference).abs().max() / reference.abs().max()).item() <= 1e-4


def test_an_embeddings_module_that_transforms_the_sum_is_refused() -> None:
    model, inputs = _tower("siglip2_vision_model")
    with retrofitted(model, "full-o", 1e-6):
        handle = model.embeddings.patch_embedding.register_forward_hook(lambda m, a, out: 2 * out)
        try:
            # h is read before the doubling hook runs: the sum is no longer h + ρτ(h)·e
            with pytest.raises(RetrofitError, match="h \\+ ρτ\\(h\\)·e"), torch.no_grad():
                model(**inputs)
        finally:
            handle.remove()


@pytest.mark.parametrize("model_type", list(TOWERS))
def test_null_insertion_on_patch_rows(model_type: str) -> None:
    """Nulls among patch rows, the rows given per patch grown with them (a mask by ones, so the
    nulls are live to it): exactly 0 and inert under full-o, pooled vectors included; Gemma4's
    come as one whole cell of its pooler (9 at kernel 3) at position (0, 0), where each adds 0
    to the cell's average (divided by 9 whatever it holds)."""
    model, inputs = _tower(model_type)
    unpatched = null_insertion(model, inputs)
    with retrofitted(model, "full-o", 1e-6):
        result = null_insertion(model, inputs)
    assert result["count"] == (9 if model_type == "gemma4_vision" else 2)
    assert result["inserted_max_abs"] == 0 and result["old_max_delta"] <= 1e-4
    assert unpatched["inserted_max_abs"] > 1e-2 and unpatched["old_max_delta"] > 1e-3
