"""OAttention contracts (paper Tables 1 and 6) for both paths against a direct fp64 evaluation."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import given, settings
from hypothesis import strategies as st

from oretrofit import o_attention, o_attention_fused, o_attention_reference, presence
from oretrofit.sweep.direct import direct_o_attention

PATHS = {
    "reference": lambda *a, **kw: o_attention_reference(*a, **kw)[0],
    "fused": lambda *a, **kw: o_attention_fused(*a, **kw),
}
TOL = {torch.float64: 1e-12, torch.float32: 2e-6, torch.bfloat16: 2e-2, torch.float16: 2e-3}


def make(b: int = 2, h: int = 4, hkv: int | None = None, nq: int = 5, nk: int = 7, d: int = 8,
         dv: int | None = None, presence_heads: int | None = None, dtype: torch.dtype = torch.float32,
         requires_grad: bool = False) -> tuple[torch.Tensor, ...]:
    """Random q, k, v and presences in (0, 1); presence_heads gives per-head p of that head count."""
    hkv, dv = hkv or h, dv or d
    q, k, v = torch.randn(b, h, nq, d), torch.randn(b, hkv, nk, d), torch.randn(b, hkv, nk, dv)
    p_q = torch.rand((b, nq) if presence_heads is None else (b, h, nq)) * 0.9 + 0.1
    p_k = torch.rand((b, nk) if presence_heads is None else (b, presence_heads, nk)) * 0.9 + 0.1
    return tuple(t.to(dtype).requires_grad_(requires_grad) for t in (q, k, v, p_q, p_k))


def mask_of(kind: str, b: int, nq: int, nk: int) -> torch.Tensor | None:
    """Masks of every accepted layout; each leaves at least one visible key per row."""
    if kind == "none":
        return None
    visible = torch.rand(b, 1, nq, nk) > 0.4
    visible[..., 0] = True
    if kind == "bool":
        return visible
    if kind == "key_padding":
        pad = torch.ones(b, 1, 1, nk, dtype=torch.bool)
        pad[..., -2:] = False
        return pad
    if kind == "causal_2d":
        return torch.ones(nq, nk, dtype=torch.bool).tril(diagonal=nk - nq)
    additive = torch.zeros(b, 1, nq, nk).masked_fill(~visible, float("-inf"))
    if kind == "additive":
        return additive
    if kind == "additive_bias":                                      # finite bias values too
        return additive + torch.randn(b, 1, nq, nk) * visible
    raise AssertionError(kind)


LAYOUTS = {                                           # (h, hkv, presence_heads)
    "mha": (4, 4, None), "gqa": (4, 2, None), "mqa": (4, 1, None),
    "per_head": (4, 4, 4), "gqa_per_query_head": (4, 2, 4), "gqa_per_kv_head": (4, 2, 2),
}
MASKS = ["none", "bool", "key_padding", "causal_2d", "additive", "additive_bias"]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("mask_kind", MASKS)
@pytest.mark.parametrize("path", PATHS)
def test_matches_direct_fp64_evaluation(layout: str, mask_kind: str, path: str) -> None:
    h, hkv, ph = LAYOUTS[layout]
    q, k, v, p_q, p_k = make(h=h, hkv=hkv, presence_heads=ph, nq=5, nk=7)
    mask = mask_of(mask_kind, 2, 5, 7)
    want, want_w = direct_o_attention(q, k, v, p_q, p_k, mask)
    out = PATHS[path](q, k, v, p_q, p_k, mask=mask)
    assert out.shape == want.shape and out.dtype == torch.float32
    assert (out.double() - want).abs().max() <= TOL[torch.float32]
    _, w = o_attention_reference(q, k, v, p_q, p_k, mask=mask, need_weights=True)
    assert (w.double() - want_w).abs().max() <= TOL[torch.float32]


@settings(max_examples=25, deadline=None)
@given(b=st.integers(1, 2), group=st.sampled_from([1, 2, 3]), hkv=st.integers(1, 2),
       nq=st.integers(1, 6), nk=st.integers(0, 6), d=st.sampled_from([1, 4, 16]),
       dv=st.sampled_from([2, 16]), eps=st.sampled_from([1e-6, 1e-2, 1.0]),
       scale=st.sampled_from([None, 0.3]), seed=st.integers(0, 2**16))
def test_property_both_paths_equal_formula_fp64(b: int, group: int, hkv: int, nq: int, nk: int,
                                                d: int, dv: int, eps: float, scale: float | None,
                                                seed: int) -> None:
    torch.manual_seed(seed)
    q, k, v, p_q, p_k = make(b, group * hkv, hkv, nq, nk, d, dv, dtype=torch.float64)
    p_k = p_k * (torch.rand_like(p_k) > 0.3)                         # some null sources
    want, want_w = direct_o_attention(q, k, v, p_q, p_k, eps=eps, scale=scale)
    ref, w = o_attention_reference(q, k, v, p_q, p_k, eps=eps, scale=scale, need_weights=True)
    fused = o_attention_fused(q, k, v, p_q, p_k, eps=eps, scale=scale)
    for got in (ref, fused):
        assert got.dtype == torch.float64
        assert torch.allclose(got, want, rtol=1e-10, atol=1e-12)
    assert torch.allclose(w, want_w, rtol=1e-10, atol=1e-12)


def test_dispatch_fused_unless_weights_requested() -> None:
    args = make()
    out, w = o_attention(*args)
    assert w is None and torch.equal(out, o_attention_fused(*args))
    out, w = o_attention(*args, need_weights=True)
    ref, ref_w = o_attention_reference(*args, need_weights=True)
    assert torch.equal(out, ref) and torch.equal(w, ref_w)


@pytest.mark.parametrize("eps", [1e-6, 0.0], ids=["eps=1e-6", "eps=0"])
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("layout", ["mha", "gqa", "per_head"])
def test_null_receiver_is_exactly_zero(path: str, layout: str, eps: float) -> None:
    h, hkv, ph = LAYOUTS[layout]
    q, k, v, p_q, p_k = make(h=h, hkv=hkv, presence_heads=ph)
    p_q[:, ..., 2] = 0.0
    out = PATHS[path](q, k, v, p_q, p_k, eps=eps)
    assert torch.equal(out[:, :, 2], torch.zeros_like(out[:, :, 2]))
    assert (out[:, :, 1].abs() > 0).any()


def insert_sources(k: torch.Tensor, v: torch.Tensor, p_k: torch.Tensor, where: list[int]
                   ) -> tuple[torch.Tensor, ...]:
    """Insert arbitrary (large) finite k/v with presence 0 at the positions ``where`` of the result."""
    for pos in sorted(where):
        k = torch.cat([k[:, :, :pos], 50 * torch.randn_like(k[:, :, :1]), k[:, :, pos:]], 2)
        v = torch.cat([v[:, :, :pos], 50 * torch.randn_like(v[:, :, :1]), v[:, :, pos:]], 2)
        p_k = torch.cat([p_k[..., :pos], torch.zeros_like(p_k[..., :1]), p_k[..., pos:]], -1)
    return k, v, p_k


@pytest.mark.parametrize("where", [[7], [7, 8], [0], [3], [0, 4, 9]], ids=str)
@pytest.mark.parametrize("layout", ["mha", "gqa", "per_head"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("eps", [1e-6, 0.0], ids=["eps=1e-6", "eps=0"])
def test_null_source_insertion(where: list[int], layout: str, dtype: torch.dtype, eps: float) -> None:
    h, hkv, ph = LAYOUTS[layout]
    q, k, v, p_q, p_k = make(h=h, hkv=hkv, presence_heads=ph, nk=7, dtype=dtype)
    old = [i for i in range(7 + len(where)) if i not in where]
    k2, v2, p_k2 = insert_sources(k, v, p_k, where)
    ref, w = o_attention_reference(q, k, v, p_q, p_k, eps=eps, need_weights=True)
    ref2, w2 = o_attention_reference(q, k2, v2, p_q, p_k2, eps=eps, need_weights=True)
    tol = TOL[dtype] * 2
    assert (ref2.float() - ref.float()).abs().max() <= tol
    assert (w2[..., old].float() - w.float()).abs().max() <= tol
    assert torch.equal(w2[..., where], torch.zeros_like(w2[..., where]))
    fused = o_attention_fused(q, k, v, p_q, p_k, eps=eps)
    fused2 = o_attention_fused(q, k2, v2, p_q, p_k2, eps=eps)
    assert (fused2.float() - fused.float()).abs().max() <= tol


@pytest.mark.parametrize("path", PATHS)
def test_empty_key_axis_gives_exact_zeros(path: str) -> None:
    q, k, v, p_q, p_k = make(nk=0, dv=3)
    out = PATHS[path](q, k, v, p_q, p_k)
    assert out.shape == (2, 4, 5, 3) and torch.equal(out, torch.zeros_like(out))
    _, w = o_attention_reference(q, k, v, p_q, p_k, need_weights=True)
    assert w.shape == (2, 4, 5, 0)


@pytest.mark.parametrize("eps", [1e-6, 0.0], ids=["eps=1e-6", "eps=0"])
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("how", ["bool", "additive", "all_null", "null_and_masked"])
def test_fully_masked_or_all_null_rows_give_exact_zeros(path: str, how: str, eps: float) -> None:
    q, k, v, p_q, p_k = make(nq=4, nk=6)
    visible = torch.ones(2, 1, 4, 6, dtype=torch.bool)
    if how in ("bool", "additive"):
        visible[:, :, 1] = False                                  # row 1 sees nothing
    if how == "all_null":
        p_k[1] = 0.0                                              # batch 1 has no live source
    if how == "null_and_masked":
        p_k[:, :3] = 0.0
        visible[:, :, 1, 3:] = False                              # row 1: live sources all masked
    mask = visible if how != "additive" else torch.zeros(visible.shape).masked_fill(
        ~visible, float("-inf"))
    out = PATHS[path](q, k, v, p_q, p_k, mask=mask, eps=eps)
    _, w = o_attention_reference(q, k, v, p_q, p_k, mask=mask, eps=eps, need_weights=True)
    dead = (slice(None), slice(None), 1) if how != "all_null" else (1,)
    assert torch.equal(out[dead], torch.zeros_like(out[dead]))
    assert torch.equal(w[dead], torch.zeros_like(w[dead]))
    assert torch.isfinite(out).all() and (out[0, :, 0].abs() > 0).any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("layout", ["mha", "gqa"])
@pytest.mark.parametrize("path", PATHS)
def test_half_precision_is_finite_accurate_and_keeps_dtype(dtype: torch.dtype, layout: str,
                                                           path: str) -> None:
    h, hkv, _ = LAYOUTS[layout]
    q, k, v, p_q, p_k = make(h=h, hkv=hkv, nq=6, nk=9, dtype=dtype)
    q = q * 8                                                      # scores beyond fp16's exp range
    out = PATHS[path](q, k, v, p_q, p_k, mask=mask_of("bool", 2, 6, 9).to(q.device))
    assert out.dtype == dtype and torch.isfinite(out).all()


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("path", PATHS)
def test_half_precision_rounds_only_the_inputs_and_output(dtype: torch.dtype, path: str) -> None:
    q, k, v, p_q, p_k = make(nq=6, nk=9, dtype=dtype)
    out = PATHS[path](q, k, v, p_q, p_k)
    want, _ = direct_o_attention(q, k, v, p_q, p_k)                # fp64 from the rounded inputs
    ulp = torch.finfo(dtype).eps
    assert ((out.double() - want).abs() <= ulp * want.abs() + 1e-6).all()


def carriers_with_zeros(b: int, n: int, width: int, zero: list[int]) -> torch.Tensor:
    x = torch.randn(b, n, width, dtype=torch.float64)
    x[:, zero] = 0.0
    return x.requires_grad_()


@pytest.mark.parametrize("eps", [1e-3, 0.0], ids=["eps=1e-3", "eps=0"])
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("layout", ["mha", "gqa", "per_head"])
def test_gradcheck_fp64_through_presence_with_zero_carriers(path: str, layout: str,
                                                            eps: float) -> None:
    h, hkv, ph = LAYOUTS[layout]
    q, k, v, _, _ = make(b=1, h=h, hkv=hkv, nq=3, nk=4, d=3, dtype=torch.float64,
                         requires_grad=True)
    hq = carriers_with_zeros(1, 3, 5, [1]) if ph is None else carriers_with_zeros(1, 3 * h, 5, [1])
    hk = carriers_with_zeros(1, 4, 5, [0, 2]) if ph is None else carriers_with_zeros(1, 4 * h, 5, [2])
    mask = torch.tensor([[1, 1, 1, 0], [0, 1, 0, 1], [1, 1, 1, 1]], dtype=torch.bool)

    def f(q, k, v, hq, hk):
        p_q, p_k = presence(hq, 0.5), presence(hk, 0.5)
        if ph is not None:
            p_q, p_k = p_q.view(1, h, 3), p_k.view(1, h, 4)
        return PATHS[path](q, k, v, p_q, p_k, mask=mask, eps=eps)

    # Full Jacobian for MHA; a random-projection check (fast_mode) for the other layouts.
    assert torch.autograd.gradcheck(f, (q, k, v, hq, hk), fast_mode=layout != "mha")
    f(q, k, v, hq, hk).sum().backward()
    assert torch.equal(hq.grad[:, 1], torch.zeros_like(hq.grad[:, 1]))


@pytest.mark.parametrize("path", PATHS)
def test_gradients_through_a_learned_additive_bias(path: str) -> None:
    q, k, v, p_q, p_k = make(b=1, h=2, nq=3, nk=4, d=3, dtype=torch.float64)
    bias = torch.zeros(1, 1, 3, 4, dtype=torch.float64, requires_grad=True)   # all-zero yet learned
    assert torch.autograd.gradcheck(lambda m: PATHS[path](q, k, v, p_q, p_k, mask=m), (bias,))
    PATHS[path](q, k, v, p_q, p_k, mask=bias).sum().backward()
    assert bias.grad.abs().sum() > 0


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("mask_kind", ["none", "bool", "additive", "additive_bias"])
@pytest.mark.parametrize("layout", ["mha", "gqa"])
def test_small_tau_and_eps_limit_is_softmax_attention(path: str, mask_kind: str,
                                                      layout: str) -> None:
    h, hkv, _ = LAYOUTS[layout]
    q, k, v, _, _ = make(h=h, hkv=hkv, nq=5, nk=7)
    carriers_q, carriers_k = torch.randn(2, 5, 16), torch.randn(2, 7, 16)
    mask = mask_of(mask_kind, 2, 5, 7)
    out = PATHS[path](q, k, v, presence(carriers_q, 1e-12), presence(carriers_k, 1e-12),
                      mask=mask, eps=1e-12)
    sdpa = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=hkv != h)
    assert (out - sdpa).abs().max() <= 2e-6


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("mask_kind", ["none", "causal_2d", "additive_bias"])
@pytest.mark.parametrize("level", [0.0, -40.0, 60.0])
def test_eps_limit_is_the_host_softmax_at_any_logit_level(path: str, mask_kind: str,
                                                          level: float) -> None:
    """ε = 0 (a retrofit's default): present tokens give the host's softmax exactly, wherever its
    logits sit. An absolute ε = 1e-6 silences rows whose logits sit around −40 (a pretrained
    softmax never cared about the level)."""
    q, k, v, _, _ = make(h=4, hkv=2, nq=5, nk=7)
    carriers_q, carriers_k = torch.randn(2, 5, 16), torch.randn(2, 7, 16)
    p_q, p_k = presence(carriers_q, 1e-8), presence(carriers_k, 1e-8)
    mask = mask_of(mask_kind, 2, 5, 7)
    shifted = torch.full((5, 7), level) if mask is None else (
        torch.zeros(mask.shape).masked_fill(~mask, float("-inf")) + level
        if mask.dtype == torch.bool else mask + level)
    out = PATHS[path](q, k, v, p_q, p_k, mask=shifted, eps=0.0)
    sdpa = F.scaled_dot_product_attention(q, k, v, attn_mask=shifted, enable_gqa=True)
    assert (out - sdpa).abs().max() <= 2e-6 * sdpa.abs().max()
    if level == -40.0:
        sink = PATHS[path](q, k, v, p_q, p_k, mask=shifted, eps=1e-6)
        assert (sink - sdpa).abs().max() > 0.1


def test_near_origin_output_is_quadratic_in_the_receiver() -> None:
    q, k, v, _, p_k = make(b=1, dtype=torch.float64)
    carrier = F.normalize(torch.randn(1, 5, 16, dtype=torch.float64), dim=-1)
    scales = torch.logspace(-7, -5, 9, dtype=torch.float64)
    norms = torch.stack([o_attention_fused(q, k, v, presence(s * carrier, 1e-6), p_k).abs().max()
                         for s in scales])
    x, y = scales.log() - scales.log().mean(), norms.log() - norms.log().mean()
    slope = (x * y).sum() / (x * x).sum()                       # least-squares log–log slope
    assert abs(slope - 2.0) <= 1e-3


def test_non_finite_carriers_propagate_nan_to_who_sees_them() -> None:
    """A NaN/inf carrier is a data error, never silently null: NaN reaches its own output and the
    output of every receiver that sees it (masking it out does not promise isolation)."""
    q, k, v, _, _ = make(b=1, h=2, nq=3, nk=4)
    carriers = torch.randn(1, 4, 8)
    carriers[0, 1, 0] = float("inf")                   # presence NaN for source 1
    p_k = presence(carriers, 1e-6)
    for path in PATHS:
        out = PATHS[path](q, k, v, torch.ones(1, 3), p_k)
        assert torch.isnan(out).all()
        out = PATHS[path](q, k, v, torch.tensor([[1.0, float("nan"), 1.0]]), p_k.nan_to_num(0.5))
        assert torch.isnan(out[:, :, 1]).all() and torch.isfinite(out[:, :, [0, 2]]).all()


GOOD = dict(q=torch.randn(2, 4, 3, 8), k=torch.randn(2, 2, 5, 8), v=torch.randn(2, 2, 5, 6),
            p_q=torch.rand(2, 3), p_k=torch.rand(2, 5))
BAD = [
    ("q must be a 4-D", dict(q=torch.randn(4, 3, 8))),
    ("batch size", dict(k=torch.randn(3, 2, 5, 8), v=torch.randn(3, 2, 5, 6))),
    ("same head size", dict(k=torch.randn(2, 2, 5, 7))),
    ("v must be", dict(v=torch.randn(2, 2, 4, 6))),
    ("multiple of the key/value heads", dict(k=torch.randn(2, 3, 5, 8), v=torch.randn(2, 3, 5, 6))),
    ("p_q must be", dict(p_q=torch.rand(2, 4))),
    ("p_k must be", dict(p_k=torch.rand(2, 3, 5))),
    ("p_k must be a floating", dict(p_k=torch.ones(2, 5, dtype=torch.long))),
    ("mask must be a bool", dict(mask=torch.ones(3, 5, dtype=torch.long))),
    ("does not broadcast", dict(mask=torch.ones(3, 4, dtype=torch.bool))),
    ("mask must broadcast", dict(mask=torch.ones(1, 1, 2, 4, 3, 5, dtype=torch.bool))),
    ("eps must be a finite number ≥ 0", dict(eps=-1e-6)),
    ("eps must be a finite number ≥ 0", dict(eps=float("nan"))),
    ("eps must be a finite number ≥ 0", dict(eps=True)),
]


@pytest.mark.parametrize("fn", [o_attention_reference, o_attention_fused, o_attention])
@pytest.mark.parametrize("message, override", BAD, ids=[m for m, _ in BAD])
def test_bad_input_raises_value_error_naming_the_argument(fn, message: str, override: dict) -> None:
    with pytest.raises(ValueError, match=message):
        fn(**{**GOOD, **override})


def test_default_scale_is_inverse_sqrt_head_size() -> None:
    args = make(d=9)
    assert torch.allclose(o_attention_fused(*args), o_attention_fused(*args, scale=1 / math.sqrt(9)))


@pytest.mark.parametrize("mask_kind", ["none", "additive_bias"])
def test_softcap_caps_scores_before_the_bias(mask_kind: str) -> None:
    """s_ij = c·tanh(scale·q·k/c) + b_ij: against the direct formula in fp64 (Gemma2's eager path)."""
    q, k, v, p_q, p_k = make(h=4, hkv=2, dtype=torch.float64)
    q = q * 4                                              # scores well past the cap
    mask = mask_of(mask_kind, 2, 5, 7)
    mask = None if mask is None else mask.double()
    out, _ = o_attention(q, k, v, p_q, p_k, mask=mask, eps=1e-3, softcap=0.5)
    kk, vv = k.repeat_interleave(2, dim=1), v.repeat_interleave(2, dim=1)
    scores = 0.5 * torch.tanh(q @ kk.transpose(-1, -2) / math.sqrt(8) / 0.5)
    if mask is not None:
        scores = scores + mask
    u = p_k[:, None, None, :] * scores.exp()
    expected = p_q[:, None, :, None] * (u / (1e-3 + u.sum(-1, keepdim=True))) @ vv
    assert (out - expected).abs().max() <= 1e-12
    capped_off, _ = o_attention(q, k, v, p_q, p_k, mask=mask, eps=1e-3)
    assert (out - capped_off).abs().max() > 1e-2           # the cap changes the result
    with pytest.raises(ValueError, match="softcap"):
        o_attention(q, k, v, p_q, p_k, softcap=0.0)


# Attention-weight dropout (training): out_i = p_i Σ_j δ_ij w_ij v_j on the (B, H, Nq, Nk) weights.

def dropout_mask(shape: tuple[int, ...], p: float, seed: int, dtype: torch.dtype) -> torch.Tensor:
    """δ_ij ∈ {0, 1/(1-p)} as torch draws it for a weight tensor of ``shape`` after ``seed``."""
    torch.manual_seed(seed)
    return F.dropout(torch.ones(shape, dtype=dtype), p)


@pytest.mark.parametrize("layout", ["mha", "gqa", "per_head", "gqa_per_kv_head"])
@pytest.mark.parametrize("mask_kind", ["none", "causal_2d", "additive_bias"])
def test_dropout_is_the_formula_on_the_same_mask(layout: str, mask_kind: str) -> None:
    h, hkv, ph = LAYOUTS[layout]
    q, k, v, p_q, p_k = make(h=h, hkv=hkv, presence_heads=ph, dtype=torch.float64)
    p_k = p_k * (torch.rand_like(p_k) > 0.3)                          # some null sources
    mask = mask_of(mask_kind, 2, 5, 7)
    if mask is not None and mask.is_floating_point():
        mask = mask.double()
    want, want_w = direct_o_attention(q, k, v, p_q, p_k, mask)
    delta = dropout_mask(want_w.shape, 0.4, seed=3, dtype=torch.float64)
    pq = p_q[:, None, :, None] if p_q.dim() == 2 else p_q[..., None]
    expected = pq * (delta * want_w) @ v.repeat_interleave(h // hkv, dim=1)
    torch.manual_seed(3)
    out, w = o_attention(q, k, v, p_q, p_k, mask=mask, dropout_p=0.4, need_weights=True)
    assert torch.allclose(w, delta * want_w, rtol=1e-12, atol=1e-15)
    assert (out - expected).abs().max() <= 1e-12
    assert (out - want).abs().max() > 1e-2                            # the mask does act
    assert set(delta.unique().tolist()) == {0.0, 1 / 0.6}


@pytest.mark.parametrize("mask_kind", ["none", "bool", "additive_bias"])
@pytest.mark.parametrize("layout", ["mha", "gqa"])
def test_dropout_tau_to_zero_is_eager_softmax_dropout_under_the_same_seed(mask_kind: str,
                                                                           layout: str) -> None:
    """p ≡ 1, ε → 0: the host's eager ``dropout(softmax(s + mask)) @ v`` drawn from the same seed."""
    h, hkv, _ = LAYOUTS[layout]
    q, k, v, _, _ = make(h=h, hkv=hkv, nq=5, nk=7)
    p_q, p_k = presence(torch.randn(2, 5, 16), 1e-12), presence(torch.randn(2, 7, 16), 1e-12)
    mask = mask_of(mask_kind, 2, 5, 7)
    scores = q @ k.repeat_interleave(h // hkv, dim=1).transpose(-1, -2) / math.sqrt(8)
    if mask is not None:
        scores = scores + (mask if mask.is_floating_point() else torch.zeros(mask.shape).masked_fill(
            ~mask, float("-inf")))
    torch.manual_seed(11)
    eager = F.dropout(scores.softmax(-1), 0.25) @ v.repeat_interleave(h // hkv, dim=1)
    torch.manual_seed(11)
    out, _ = o_attention(q, k, v, p_q, p_k, mask=mask, eps=1e-12, dropout_p=0.25)
    assert (out - eager).abs().max() <= 2e-6
    torch.manual_seed(12)
    other, _ = o_attention(q, k, v, p_q, p_k, mask=mask, eps=1e-12, dropout_p=0.25)
    assert (other - eager).abs().max() > 1e-2                         # another seed, another mask


@pytest.mark.parametrize("seed", range(4))
def test_dropout_keeps_null_tokens_exact_and_empty_support_zero(seed: int) -> None:
    q, k, v, p_q, p_k = make(nq=4, nk=6)
    p_q[:, 2], p_k[:, [1, 4]] = 0.0, 0.0
    visible = torch.ones(2, 1, 4, 6, dtype=torch.bool)
    visible[:, :, 3] = False                                          # row 3 sees nothing
    torch.manual_seed(seed)
    out, w = o_attention(q, k, v, p_q, p_k, mask=visible, dropout_p=0.5, need_weights=True)
    v_loud = v.clone()
    v_loud[:, :, [1, 4]] = 1e6                                        # a null source's value
    torch.manual_seed(seed)
    loud, _ = o_attention(q, k, v_loud, p_q, p_k, mask=visible, dropout_p=0.5)
    assert torch.equal(w[..., [1, 4]], torch.zeros_like(w[..., [1, 4]]))
    assert torch.equal(loud, out)                                     # null sources contribute 0
    for row in (2, 3):                                                # null receiver, empty support
        assert torch.equal(out[:, :, row], torch.zeros_like(out[:, :, row]))
    assert torch.isfinite(out).all() and (out[:, :, 0].abs() > 0).any()
    empty, _ = o_attention(*make(nk=0, dv=3), dropout_p=0.5)
    assert empty.shape == (2, 4, 5, 3) and torch.equal(empty, torch.zeros_like(empty))


def test_dropout_gradcheck_fp64_with_zero_carriers_on_a_fixed_mask() -> None:
    q, k, v, _, _ = make(b=1, h=2, nq=3, nk=4, d=3, dtype=torch.float64, requires_grad=True)
    hq, hk = carriers_with_zeros(1, 3, 5, [1]), carriers_with_zeros(1, 4, 5, [0, 2])

    def f(q, k, v, hq, hk):
        torch.manual_seed(5)                                          # one mask for every call
        return o_attention(q, k, v, presence(hq, 0.5), presence(hk, 0.5), eps=1e-3,
                           dropout_p=0.3)[0]

    assert torch.autograd.gradcheck(f, (q, k, v, hq, hk))
    f(q, k, v, hq, hk).sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in (q, k, v, hq, hk))
    assert torch.equal(hq.grad[:, 1], torch.zeros_like(hq.grad[:, 1]))


def test_dropout_zero_keeps_the_fused_path_and_bad_values_are_refused() -> None:
    args = make()
    assert torch.equal(o_attention(*args, dropout_p=0.0)[0], o_attention_fused(*args))
    assert torch.equal(o_attention(*args, dropout_p=1.0)[0], torch.zeros(2, 4, 5, 8))
    for bad in (-0.1, 1.5, True, None):
        with pytest.raises(ValueError, match="dropout_p must be a probability"):
            o_attention(*args, dropout_p=bad)


@pytest.mark.parametrize("nq, nk", [(5, 5), (3, 7), (7, 4)])
@pytest.mark.parametrize("mask_kind", ["none", "bool", "additive_bias"])
@pytest.mark.parametrize("need_weights", [False, True])
def test_causal_is_the_lower_triangle_aligned_to_the_last_key(nq: int, nk: int, mask_kind: str,
                                                              need_weights: bool) -> None:
    """``causal=True`` is exactly the mask ``j ≤ i + Nk − Nq`` combined with the caller's (a
    query with no key left gets zeros), on the fused and the reference path."""
    q, k, v, p_q, p_k = make(nq=nq, nk=nk)
    mask = mask_of(mask_kind, 2, nq, nk)
    lower = torch.ones(nq, nk, dtype=torch.bool).tril(nk - nq)
    built = (lower if mask is None else mask & lower if mask.dtype == torch.bool
             else mask.masked_fill(~lower, float("-inf")))
    got = o_attention(q, k, v, p_q, p_k, mask=mask, causal=True, need_weights=need_weights)
    want = o_attention(q, k, v, p_q, p_k, mask=built, need_weights=need_weights)
    assert torch.equal(got[0], want[0])
    assert (got[1] is None) == (not need_weights)
    if need_weights:
        assert torch.equal(got[1], want[1])
