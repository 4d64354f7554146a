"""HiddenCarrierOAttention (eq. 7) and QKVOAttention (A.1, eq. 23) as modules."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from oretrofit import HiddenCarrierOAttention, QKVOAttention, presence
from oretrofit.sweep.direct import direct_projected
from oretrofit.sweep.measure import insert_zero_rows

TAU = 1e-6


def heads(x: torch.Tensor, n: int) -> torch.Tensor:
    b, t, _ = x.shape
    return x.view(b, t, n, -1).transpose(1, 2)                     # (B, H, N, hd)


MODULES = {"hidden": HiddenCarrierOAttention, "qkv": QKVOAttention}


@pytest.mark.parametrize("kind", MODULES)
@pytest.mark.parametrize("kv_heads", [4, 2])
@pytest.mark.parametrize("cross", [False, True])
def test_module_matches_direct_formula(kind: str, kv_heads: int, cross: bool) -> None:
    attn = MODULES[kind](16, 4, kv_heads, tau=TAU, d_context=12 if cross else None)
    x = torch.randn(2, 5, 16)
    context = torch.randn(2, 7, 12) if cross else x
    want, want_w = direct_projected(attn, x, context, TAU)
    for need_weights in (False, True):
        out, w = attn(x, context if cross else None, need_weights=need_weights)
        assert out.shape == (2, 5, 16) and (w is not None) == need_weights
        assert (out.double() - want).abs().max() <= 2e-6
    assert (w.double() - want_w).abs().max() <= 2e-6


@pytest.mark.parametrize("kind", MODULES)
@pytest.mark.parametrize("pos", [0, 2, 5])
@pytest.mark.parametrize("kv_heads", [4, 2])
def test_self_attention_insertion_of_a_zero_carrier(kind: str, pos: int, kv_heads: int) -> None:
    attn = MODULES[kind](16, 4, kv_heads, tau=TAU)
    x = torch.randn(2, 5, 16)
    x2 = insert_zero_rows(x, [pos])
    old = [i for i in range(6) if i != pos]
    out, w = attn(x, need_weights=True)
    out2, w2 = attn(x2, need_weights=True)
    assert torch.equal(out2[:, pos], torch.zeros(2, 16))                    # inserted receiver
    assert torch.equal(w2[..., pos], torch.zeros_like(w2[..., pos]))         # inserted source
    assert (out2[:, old] - out).abs().max() <= 1e-6
    assert (w2[:, :, old][..., old] - w).abs().max() <= 1e-6
    fused, fused2 = attn(x)[0], attn(x2)[0]
    assert torch.equal(fused2[:, pos], torch.zeros(2, 16))
    assert (fused2[:, old] - fused).abs().max() <= 1e-6


@pytest.mark.parametrize("kind", MODULES)
def test_cross_attention_null_context_and_empty_context(kind: str) -> None:
    attn = MODULES[kind](8, 2, tau=TAU)
    x, context = torch.randn(1, 3, 8), torch.randn(1, 4, 8)
    padded = torch.cat([context, torch.zeros(1, 2, 8)], dim=1)
    assert (attn(x, padded)[0] - attn(x, context)[0]).abs().max() <= 1e-6
    for empty in (torch.zeros(1, 4, 8), torch.zeros(1, 0, 8)):
        out, w = attn(x, empty, need_weights=True)
        assert torch.equal(out, torch.zeros_like(out)) and torch.equal(w, torch.zeros_like(w))


def test_hidden_carrier_presence_is_shared_across_heads_qkv_is_not() -> None:
    """A non-zero carrier whose key projects to zero in one head: the canonical operator keeps
    its shared presence there, the Q/K/V variant drops that head's support (paper A.1)."""
    torch.manual_seed(1)
    hidden, qkv = HiddenCarrierOAttention(8, 2, tau=TAU), QKVOAttention(8, 2, tau=TAU)
    qkv.load_state_dict(hidden.state_dict())
    for m in (hidden, qkv):
        with torch.no_grad():
            m.k_proj.weight[:4] = 0.0                                 # head 0 keys are all zero
    x = torch.randn(1, 3, 8)
    _, w_hidden = hidden(x, need_weights=True)
    _, w_qkv = qkv(x, need_weights=True)
    assert torch.equal(w_qkv[:, 0], torch.zeros_like(w_qkv[:, 0]))
    assert (w_hidden[:, 0] > 0.3).all()                              # uniform-ish weights in head 0
    assert (w_qkv[:, 1] - w_hidden[:, 1]).abs().max() <= 1e-5


@pytest.mark.parametrize("kind", MODULES)
def test_small_tau_limit_is_standard_multi_head_attention(kind: str) -> None:
    attn = MODULES[kind](16, 4, 2, tau=1e-12, eps=1e-12)
    x = torch.randn(2, 6, 16)
    q, k, v = heads(attn.q_proj(x), 4), heads(attn.k_proj(x), 2), heads(attn.v_proj(x), 2)
    ref = F.scaled_dot_product_attention(q, k, v, enable_gqa=True)
    want = attn.out_proj(ref.transpose(1, 2).reshape(2, 6, 16))
    assert (attn(x)[0] - want).abs().max() <= 2e-6


@pytest.mark.parametrize("kind", MODULES)
def test_near_origin_receiver_output_has_log_log_slope_two(kind: str) -> None:
    attn = MODULES[kind](16, 4, tau=TAU).double()
    context = torch.randn(1, 5, 16, dtype=torch.float64)
    query = F.normalize(torch.randn(1, 1, 16, dtype=torch.float64), dim=-1)
    scales = torch.logspace(-7, -5, 9, dtype=torch.float64)
    norms = torch.stack([attn(s * query, context)[0].abs().max() for s in scales])
    x, y = scales.log() - scales.log().mean(), norms.log() - norms.log().mean()
    assert abs((x * y).sum() / (x * x).sum() - 2.0) <= 2e-3


def test_explicit_presences_and_masks_reach_the_operator() -> None:
    attn = HiddenCarrierOAttention(8, 2, tau=TAU)
    x = torch.randn(2, 4, 8)
    p = torch.tensor([[1.0, 0.0, 0.5, 1.0], [0.2, 1.0, 1.0, 0.0]])
    mask = torch.ones(2, 1, 1, 4, dtype=torch.bool)
    mask[0, ..., 3] = False
    out, w = attn(x, p_x=p, mask=mask, need_weights=True)
    assert torch.equal(out[0, 1], torch.zeros(8)) and torch.equal(w[0, ..., 3], torch.zeros(2, 4))
    assert torch.equal(w[1, ..., 3], torch.zeros(2, 4))               # p = 0 source
    assert torch.allclose(attn(x, p_x=p, mask=mask)[0], out, atol=1e-6)


@pytest.mark.parametrize("kind", MODULES)
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
def test_half_precision_module(kind: str, dtype: torch.dtype) -> None:
    attn = MODULES[kind](16, 4, 2, tau=TAU).to(dtype)
    x = torch.cat([torch.randn(2, 5, 16), torch.zeros(2, 1, 16)], dim=1).to(dtype)
    out = attn(x)[0]
    assert out.dtype == dtype and torch.isfinite(out).all()
    assert torch.equal(out[:, -1], torch.zeros_like(out[:, -1]))


@pytest.mark.parametrize("kwargs, message", [
    (dict(d_model=10, n_heads=4), "divisible by n_heads"),
    (dict(d_model=16, n_heads=4, n_kv_heads=3), "multiple of n_kv_heads"),
    (dict(d_model=16, n_heads=4, tau=0.0), "tau"),
    (dict(d_model=16, n_heads=4, eps=-1.0), "eps"),
])
@pytest.mark.parametrize("kind", MODULES)
def test_bad_configuration(kind: str, kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        MODULES[kind](**kwargs)


@pytest.mark.parametrize("kind", MODULES)
def test_bad_input_shapes(kind: str) -> None:
    attn = MODULES[kind](8, 2)
    with pytest.raises(ValueError, match="x and context must be"):
        attn(torch.randn(3, 8))
    with pytest.raises(ValueError, match="x and context must be"):
        attn(torch.randn(2, 3, 8), torch.randn(1, 3, 8))


def test_operators_page_example_runs(capsys) -> None:
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "operators.md").read_text()
    code = page.split("```python\n", 1)[1].split("```", 1)[0]
    assert len(code.strip().splitlines()) <= 12
    exec(compile(code, "docs/operators.md", "exec"), {})
    lines = capsys.readouterr().out.splitlines()
    assert lines[1] == "tensor(0., grad_fn=<MaxBackward1>) tensor(0., grad_fn=<MaxBackward1>)"
    assert lines[2] == "tensor(0.)"
