"""The copy-free kernel route of fused OAttention (oretrofit/_kernels/lse.py): forward and
every gradient against the fp64 reference, its fallbacks, and the CUDA kernel's adaptation
checked on CPU against an emulation of that kernel's contract."""

from __future__ import annotations

import dataclasses
import math
import warnings

import pytest
import torch

from oretrofit._kernels import lse as kernels, routes as route
from oretrofit._operators import attention as _attention
from oretrofit import o_attention_fused, o_attention_reference

from _operators.test_attention import LAYOUTS, make, mask_of

CPU = kernels._cpu_backend()
# Against the fp64 reference, relative to max(1, |reference|): fp64 inputs show the algebra is
# exact; fp32 inputs sit at fp32 round-off (the fp32 *reference* path itself reaches ~1e-6 on these
# gradients), the same bound as the forward's fp32 tolerance in test_attention.py.
GRAD_TOL = {torch.float64: 1e-10, torch.float32: 2e-6}


@pytest.fixture
def small_tiles(monkeypatch: pytest.MonkeyPatch) -> None:
    """Tiles of 3 rows/columns, so every backward below runs several query and key tiles."""
    monkeypatch.setattr(kernels, "BACKWARD_TILE", (3, 3))


def with_nulls(p_q: torch.Tensor, p_k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Null receivers (row 1), null sources (key 2) and, in batch 1, no live source at all."""
    p_q, p_k = p_q.detach().clone(), p_k.detach().clone()
    p_q[..., 1] = 0.0
    p_k[..., 2] = 0.0
    p_k[1] = 0.0
    return p_q, p_k


def grads(fn, inputs: list[torch.Tensor], d_out: torch.Tensor, **kw) -> list[torch.Tensor | None]:
    leaves = [t.detach().clone().requires_grad_(t.requires_grad) for t in inputs]
    out = fn(*leaves, **kw)
    out.backward(d_out.to(out.dtype))
    return [out.detach()] + [t.grad for t in leaves]


def compare_with_reference(fn, inputs: list[torch.Tensor], tol: float, **kw) -> None:
    """Output and the gradients of every input requiring one, against the fp64 reference."""
    reference = lambda *a, **k: o_attention_reference(*a, **k)[0]      # noqa: E731
    d_out = torch.randn(fn(*inputs, **kw).shape, dtype=torch.float64)
    want = grads(reference, [t.double() for t in inputs], d_out, **kw)
    got = grads(fn, inputs, d_out, **kw)
    for name, g, w in zip(["out", "q", "k", "v", "p_q", "p_k"], got, want):
        if w is None:
            assert g is None, name
            continue
        assert g is not None and g.shape == w.shape, name
        assert (g.double() - w).abs().max() <= tol * max(1.0, w.abs().max().item()), name


def test_the_cpu_kernel_passes_its_check() -> None:
    assert CPU is not None and CPU.name == "cpu-flash"
    assert kernels.check_backend(CPU, torch.device("cpu"), torch.float64) == ""


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("mask_kind", ["none", "bool", "key_padding", "causal_2d", "additive_bias"])
@pytest.mark.parametrize("pk_grad", [True, False], ids=["pk_grad", "pk_detached"])
def test_forward_and_gradients_match_the_fp64_reference(layout: str, mask_kind: str, pk_grad: bool,
                                                        dtype: torch.dtype, small_tiles: None
                                                        ) -> None:
    h, hkv, ph = LAYOUTS[layout]
    q, k, v, p_q, p_k = make(h=h, hkv=hkv, presence_heads=ph, nq=7, nk=8, dtype=dtype)
    p_q, p_k = with_nulls(p_q, p_k)
    inputs = [t.requires_grad_(t is not p_k or pk_grad) for t in (q, k, v, p_q, p_k)]
    mask = mask_of(mask_kind, 2, 7, 8)
    mask = mask.to(dtype) if mask is not None and mask.is_floating_point() else mask
    compare_with_reference(o_attention_fused, inputs, GRAD_TOL[dtype], mask=mask, eps=1e-3)


@pytest.mark.parametrize("tile", [2, 3, 512])
@pytest.mark.parametrize("layout", ["mha", "gqa_per_query_head", "gqa_per_kv_head"])
def test_gradcheck_fp64_on_the_kernel_route(layout: str, tile: int,
                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kernels, "BACKWARD_TILE", (tile, tile + 1))
    h, hkv, ph = LAYOUTS[layout]
    inputs = make(b=1, h=h, hkv=hkv, presence_heads=ph, nq=4, nk=5, d=3, dtype=torch.float64,
                  requires_grad=True)
    mask = torch.rand(1, 1, 4, 5) > 0.3
    mask[..., 0] = True
    assert torch.autograd.gradcheck(lambda *a: o_attention_fused(*a, mask=mask, eps=1e-2), inputs,
                                    fast_mode=layout != "mha")


@pytest.mark.parametrize("alone", ["q", "k", "v", "p_q", "p_k"])
def test_one_input_requiring_grad(alone: str, small_tiles: None) -> None:
    q, k, v, p_q, p_k = make(h=4, hkv=2, presence_heads=4, nq=7, nk=8)
    p_q, p_k = with_nulls(p_q, p_k)
    inputs = [t.requires_grad_(name == alone)
              for name, t in zip(["q", "k", "v", "p_q", "p_k"], (q, k, v, p_q, p_k))]
    compare_with_reference(o_attention_fused, inputs, GRAD_TOL[torch.float32])


def test_null_receivers_and_sources_get_the_reference_presence_gradients(small_tiles: None) -> None:
    q, k, v, p_q, p_k = make(h=4, hkv=2, presence_heads=4, nq=7, nk=8)
    p_q, p_k = with_nulls(p_q, p_k)
    p_q[:, :, 4] = 0.0                                      # more null receivers in some heads
    p_q[0, 1, :] = 0.0                                      # and one head with no live receiver
    inputs = [t.requires_grad_() for t in (q, k, v, p_q, p_k)]
    compare_with_reference(o_attention_fused, inputs, GRAD_TOL[torch.float32])
    _, _, _, _, d_pq, d_pk = grads(o_attention_fused, inputs, torch.randn(2, 4, 7, 8))
    assert (d_pq[0, :, 1] != 0).all()                       # ∂/∂p_i = dO·o′ at a null receiver
    assert torch.equal(d_pk[..., 2], torch.zeros_like(d_pk[..., 2]))   # null source: 0


def test_no_grad_is_the_same_output_and_builds_no_graph() -> None:
    inputs = [t.requires_grad_() for t in make(h=4, hkv=2, nq=6, nk=9)]
    with_grad = o_attention_fused(*inputs)
    with torch.no_grad():
        frozen = o_attention_fused(*inputs)
    assert frozen.grad_fn is None and torch.equal(frozen, with_grad.detach())
    assert type(with_grad.grad_fn).__name__ == "_LSEOAttentionBackward"


@pytest.mark.parametrize("nq", [1, 6])
def test_a_batch_of_one_is_its_row_of_the_batch(nq: int) -> None:
    """A batch of one gates by its (1, Nq) presences without the heads axis added (the kernel
    route's one shortcut for a batch of one): each row alone gives its row of the batch."""
    q, k, v, p_q, p_k = make(b=3, h=4, hkv=2, nq=nq, nk=9)
    with torch.no_grad():
        batch = o_attention_fused(q, k, v, p_q, p_k)
        for row in range(3):
            one = o_attention_fused(*(t[row:row + 1] for t in (q, k, v, p_q, p_k)))
            torch.testing.assert_close(one, batch[row:row + 1], atol=1e-6, rtol=1e-6)


def test_empty_support_is_an_exact_zero_with_finite_gradients() -> None:
    q, k, v, p_q, p_k = make(nq=4, nk=6)
    p_k[1] = 0.0
    mask = torch.ones(2, 1, 4, 6, dtype=torch.bool)
    mask[0, :, 2] = False
    inputs = [t.requires_grad_() for t in (q, k, v, p_q, p_k)]
    out = o_attention_fused(*inputs, mask=mask)
    assert torch.equal(out[1], torch.zeros_like(out[1]))
    assert torch.equal(out[0, :, 2], torch.zeros_like(out[0, :, 2]))
    out.sum().backward()
    assert all(torch.isfinite(t.grad).all() for t in inputs)


def test_half_precision_inputs_are_computed_in_fp32_on_the_kernel_route() -> None:
    inputs = [t.requires_grad_() for t in make(h=4, hkv=2, nq=6, nk=9, dtype=torch.bfloat16)]
    out = o_attention_fused(*inputs)
    want = o_attention_fused(*[t.detach().float() for t in inputs])
    assert out.dtype == torch.bfloat16 and torch.equal(out, want.to(torch.bfloat16))
    out.float().sum().backward()
    assert all(t.grad is not None and t.grad.dtype == torch.bfloat16 for t in inputs)


def test_host_layout_views_are_taken_as_they_are() -> None:
    """(B, S, H, D) projections transposed to (B, H, S, D), as the hosts pass them."""
    q, k, v, p_q, p_k = make(h=4, hkv=2, nq=6, nk=9)
    views = [t.transpose(1, 2).contiguous().transpose(1, 2) for t in (q, k, v)]
    assert not views[0].is_contiguous()
    assert torch.equal(o_attention_fused(*views, p_q, p_k), o_attention_fused(q, k, v, p_q, p_k))


@pytest.mark.parametrize("case", ["dv", "empty_keys", "empty_queries", "empty_batch",
                                  "learned_bias", "half_compute"])
def test_cases_the_kernel_cannot_serve_take_the_augmented_path(case: str) -> None:
    q, k, v, p_q, p_k = make(nq=5, nk=7)
    mask = None
    if case == "dv":
        v = torch.randn(2, 4, 7, 3)
    if case == "empty_keys":
        k, v, p_k = k[:, :, :0], v[:, :, :0], p_k[:, :0]
    if case == "empty_queries":
        q, p_q = q[:, :, :0], p_q[:, :0]
    if case == "empty_batch":
        q, k, v, p_q, p_k = (t[:0] for t in (q, k, v, p_q, p_k))
    if case == "learned_bias":
        mask = torch.zeros(1, 1, 5, 7, requires_grad=True)
    if case == "half_compute":                  # no route computes in fp16 on upcast copies
        assert all(torch.float16 not in r.dtypes for r in route.ROUTES if not r.in_q_dtype)
    else:
        assert route.route_for(q, k, v, mask, precision="fp32").name == "augmented-copy"
    assert route.route_for(*make(nq=5, nk=7)[:3], precision="fp32").name == "cpu-flash"
    out = o_attention_fused(q, k, v, p_q, p_k, mask=mask)
    assert torch.allclose(out, o_attention_reference(q, k, v, p_q, p_k, mask=mask)[0], atol=2e-6)


def kernel_route(backend: kernels.Backend, **fields) -> route.Route:
    """The cpu-flash route of :data:`route.ROUTES` on ``backend`` (and ``fields``)."""
    cpu_flash = next(r for r in route.ROUTES if r.name == "cpu-flash")
    return dataclasses.replace(cpu_flash, ready=lambda: True,
                               run=route.backend_run(lambda: backend),
                               check=route.backend_check(lambda: backend), **fields)


def only_route(monkeypatch: pytest.MonkeyPatch, chosen: route.Route) -> None:
    """The route table is ``chosen`` and the augmented-copy fallback (a fresh check cache)."""
    monkeypatch.setattr(route, "ROUTES", (chosen, route.ROUTES[-1]))
    monkeypatch.setattr(route, "_CHECKED", {})


def test_head_sizes_a_kernel_does_not_take_fall_back(monkeypatch: pytest.MonkeyPatch) -> None:
    only_route(monkeypatch, kernel_route(EFFICIENT, head_multiple=8))
    assert route.route_for(*make(d=12)[:3]).name == "augmented-copy"
    assert route.route_for(*make(d=16)[:3]).name == "cpu-flash"


def test_a_kernel_that_breaks_its_contract_is_not_used(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> kernels.Backend:
        def forward(q, k, v, bias, scale):
            o, lse = CPU.forward(q, k, v, bias, scale)
            return o, lse + 1.0                              # e.g. a changed LSE convention
        return kernels.Backend("broken", forward, CPU.backward)

    only_route(monkeypatch, kernel_route(broken()))
    with pytest.warns(RuntimeWarning, match="the cpu-flash OAttention route fails its check on "
                                            r"cpu torch.float32 \(forward differs"):
        assert route.route_for(*make(nq=5, nk=7)[:3]).name == "augmented-copy"
    args = make(nq=5, nk=7)
    with warnings.catch_warnings():
        warnings.simplefilter("error")                       # reported once, then silent
        out = o_attention_fused(*args)
    assert (out - o_attention_reference(*args)[0]).abs().max() <= 2e-6


# ---- the CUDA kernel's adaptation, on CPU: an emulation of the memory-efficient ops' contract


def _efficient_arguments(q, k, v, bias) -> None:
    b, h, n_q, _ = q.shape
    assert k.shape[1] == v.shape[1] == h, "equal head counts (no GQA)"
    assert bias.dim() == 4 and tuple(bias.shape) == (b, h, n_q, k.shape[2]), "full 4-D bias"
    assert bias.stride(-1) == 1 and all(s % 16 == 0 for s in bias.stride()[:-1]), "aligned bias"


def fake_efficient_forward(q, k, v, bias, compute_log_sumexp, dropout_p, is_causal, *, scale,
                           checked=False):
    """``checked``: the caller has asserted the arguments' layout (on tensors it then upcast)."""
    assert compute_log_sumexp and dropout_p == 0.0 and not is_causal
    if not checked:
        _efficient_arguments(q, k, v, bias)
    o, lse = kernels._math_forward(q, k, v, bias, scale)
    padded = lse.new_full((*lse.shape[:2], -(-lse.shape[2] // 32) * 32), float("nan"))
    padded[..., : lse.shape[2]] = lse
    seed = torch.empty((), dtype=torch.long)
    return o, padded, seed, seed


def fake_efficient_backward(d_out, q, k, v, bias, out, lse, seed, offset, dropout_p, mask,
                            is_causal, *, scale, checked=False):
    assert dropout_p == 0.0 and not is_causal and list(mask) == [True, True, True, False]
    if not checked:
        _efficient_arguments(q, k, v, bias)
    assert lse.shape[2] % 32 == 0 and lse.shape[2] >= q.shape[2] and d_out.is_contiguous()
    return (*kernels._math_backward(d_out, q, k, v, bias, out, lse[..., : q.shape[2]], scale),
            None)


EFFICIENT = kernels.efficient_backend(fake_efficient_forward, fake_efficient_backward)


def on_efficient(q, k, v, p_q, p_k, mask=None, eps=1e-6):
    visible, bias = _attention._split_mask(mask, q.dtype)
    scale = 1 / math.sqrt(q.shape[-1])
    return kernels.o_attention_lse(q, k, v, p_q, p_k, visible, bias, eps, scale, EFFICIENT)


def test_the_emulated_efficient_kernel_passes_the_check() -> None:
    assert kernels.check_backend(EFFICIENT, torch.device("cpu"), torch.float32) == ""


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("mask_kind", ["none", "bool", "causal_2d", "additive_bias"])
@pytest.mark.parametrize("pk_grad", [True, False], ids=["pk_grad", "pk_detached"])
@pytest.mark.parametrize("eps", [1e-3, 0.0], ids=["eps=1e-3", "eps=0"])
def test_cuda_adaptation_matches_the_fp64_reference(layout: str, mask_kind: str, pk_grad: bool,
                                                    eps: float, small_tiles: None) -> None:
    h, hkv, ph = LAYOUTS[layout]
    q, k, v, p_q, p_k = make(h=h, hkv=hkv, presence_heads=ph, nq=7, nk=8)
    p_q, p_k = with_nulls(p_q, p_k)
    inputs = [t.requires_grad_(t is not p_k or pk_grad) for t in (q, k, v, p_q, p_k)]
    compare_with_reference(on_efficient, inputs, GRAD_TOL[torch.float32],
                           mask=mask_of(mask_kind, 2, 7, 8), eps=eps)


def test_efficient_bias_is_padded_only_when_its_strides_are_not_aligned() -> None:
    aligned = torch.randn(2, 1, 1, 32)
    assert kernels._efficient_bias(aligned, (2, 4, 5, 32)).data_ptr() == aligned.data_ptr()
    odd = torch.randn(2, 1, 1, 7)
    wide = kernels._efficient_bias(odd, (2, 4, 5, 7))
    assert wide.shape == (2, 4, 5, 7) and torch.equal(wide, odd.expand(2, 4, 5, 7))
    assert all(s % 16 == 0 for s in wide.stride()[:-1])
