"""Serving a retrofitted transformers model: switching its attention implementation after the
retrofit is followed, and revert restores the user's latest choice."""

from __future__ import annotations

import os

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pytest  # noqa: E402
import torch  # noqa: E402
from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

from oretrofit import Retrofit, retrofit  # noqa: E402
from oretrofit.hosts.transformers.report import EPS, TAU, null_insertion  # noqa: E402
from oretrofit.hosts.transformers.releases import zero_padded_inputs  # noqa: E402

_SHAPE = dict(vocab_size=100, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
              num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64)


def _tiny(implementation: str) -> LlamaForCausalLM:
    return LlamaForCausalLM(LlamaConfig(**_SHAPE, attn_implementation=implementation)).eval()


def _mask_free_padding_delta(model: torch.nn.Module) -> float:
    """Largest logit difference of a left-padded row without a mask from the row alone."""
    rows = [[5, 6, 7, 8, 9], [10, 11]]
    with torch.no_grad():
        batch = model(**zero_padded_inputs(model, rows, side="left")).logits
        alone = model(torch.tensor([rows[1]])).logits
    return (batch[1, -2:] - alone[0]).abs().max().item()


@pytest.mark.parametrize("before, after", [("sdpa", "eager"), ("eager", "sdpa")])
def test_set_attn_implementation_after_retrofit_is_followed(before: str, after: str) -> None:
    """The switch used to leave the retrofit silently (mask-free padding off by 27.6 on SmolLM2,
    ``Retrofit.of`` still active) and ``revert`` reset the user's choice."""
    model = _tiny(before)
    handle = retrofit(model, "full-o", TAU, eps=EPS)
    model.set_attn_implementation(after)
    assert Retrofit.of(model) is handle and model.config._attn_implementation == "oretrofit"
    assert _mask_free_padding_delta(model) < 1e-5
    assert null_insertion(model, torch.randint(1, 100, (1, 6)), 3)["inserted_max_abs"] == 0
    handle.revert()
    assert model.config._attn_implementation == after
    assert _mask_free_padding_delta(model) > 1e-2           # the unpatched model needs its mask
