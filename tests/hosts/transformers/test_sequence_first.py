"""An attention output projection fed sequence-first (MLCD permutes the attention output to
(tokens, batch, hidden) before its biased ``out_proj``): its bias is gated by pᵀ, and a batch
with as many items as tokens, where the order cannot be checked, is refused.

MLCD takes the rotary angles of its patch grid by sequence index, so the contracts' null
insertion at the patch embeddings is not defined for it; here the zero carriers are inserted
where the encoder reads the stream, with rotary rows of their own (a null token's queries and
keys never weigh: its presence is 0), so the old tokens keep their positions."""

from __future__ import annotations

import pytest
import torch

from oretrofit import RetrofitError, retrofitted
from hosts.transformers import zoo
from oretrofit.hosts.transformers.contracts import agreement, hidden_states, _insert
from oretrofit.hosts.transformers.gates import OSequenceFirstBias

MLCD = zoo.Architecture("MLCD (vision)", "mlcd", "vision", zoo._IMAGE)


@pytest.fixture(scope="module")
def mlcd() -> torch.nn.Module:
    return zoo.build(MLCD)


def _run_with_nulls(model: torch.nn.Module, pixels: torch.Tensor, at: int, count: int) -> None:
    """The model on ``pixels`` with ``count`` zero carriers inserted before token ``at`` of the
    encoder's input, each with a copy of its neighbour's rotary row."""
    def insert(module, args, kwargs):
        cos, sin = kwargs["position_embeddings"]
        grow = lambda t: torch.cat([t[:at], t[at - 1:at].expand(count, -1), t[at:]])  # noqa: E731
        kwargs["inputs_embeds"] = _insert(kwargs["inputs_embeds"], at, count)
        kwargs["position_embeddings"] = [grow(cos), grow(sin)]
        return args, kwargs
    handle = model.encoder.register_forward_pre_hook(insert, with_kwargs=True)
    try:
        model(pixel_values=pixels)
    finally:
        handle.remove()


@pytest.mark.parametrize("arm", ["oa", "full-o"])
def test_tau_to_zero_agrees(mlcd: torch.nn.Module, arm: str) -> None:
    result = agreement(mlcd, zoo.example_inputs(mlcd), arm, tau=1e-12, eps=1e-12)
    assert result["relative_max_diff"] <= 1e-4
    assert result["revert_bit_identical"] and result["state_dict_keys_unchanged"]


def test_the_output_projection_is_gated_sequence_first(mlcd: torch.nn.Module) -> None:
    with retrofitted(mlcd, "full-o", 1e-6):
        assert all(isinstance(layer.self_attn.out_proj, OSequenceFirstBias)
                   for layer in mlcd.encoder.layers)


def test_inserted_null_tokens_stay_zero_and_move_no_old_token(mlcd: torch.nn.Module) -> None:
    pixels = zoo.example_inputs(mlcd)["pixel_values"][:1]
    n = mlcd.embeddings.num_positions                       # the class token and the patches
    at, count = n // 2, 2
    old = torch.cat([torch.arange(at), torch.arange(at + count, n + count)])

    def measure() -> tuple[float, float]:
        reference = hidden_states(mlcd, lambda: mlcd(pixel_values=pixels))
        inserted = hidden_states(mlcd, lambda: _run_with_nulls(mlcd, pixels, at, count))
        keys = [k for k in reference if not k.endswith(".input")]
        assert len(keys) >= 3
        moved = max(((inserted[k][:, old] - reference[k]).abs().max()
                     / reference[k].abs().max()).item() for k in keys)
        return moved, max(inserted[k][:, at:at + count].abs().max().item() for k in keys)

    unpatched = measure()
    with retrofitted(mlcd, "full-o", 1e-6):
        moved, null = measure()
    assert null == 0 and moved <= 1e-4
    assert unpatched[1] > 1e-2 and unpatched[0] > 1e-3      # not inert unpatched


def test_a_batch_as_long_as_the_sequence_is_refused(mlcd: torch.nn.Module) -> None:
    n = mlcd.embeddings.num_positions
    pixels = torch.randn(n, 3, 8, 8)                        # batch == tokens: order unknowable
    with retrofitted(mlcd, "oa", 1e-6), pytest.raises(RetrofitError,
                                                      match="as many items as tokens"):
        mlcd(pixel_values=pixels)
