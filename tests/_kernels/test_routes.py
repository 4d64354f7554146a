"""The half-precision route chain (oretrofit/_kernels/routes.py) and its cuDNN, FlexAttention and
memory-efficient routes, on the CPU: each route's kernel by a CPU stand-in with the op's
signature and outputs, its glue and the shared composition ``out_i = p_i σ(L_i − log ε) o_i``
(forward and every gradient) against the fp64 reference; the chain's order and fallbacks.

FlexAttention cannot run for real here: torch 2.13's CPU FlexAttention has no backward and,
compiled, no ``return_lse`` ("torch.compile on CPU only supports inference and `return_lse` is
not supported yet"), so its stand-in evaluates the route's ``score_mod`` on the full score matrix
as FlexAttention's eager reference does.
"""

from __future__ import annotations

import dataclasses
import warnings

import pytest
import torch

from oretrofit._kernels import lse as kernels, routes as route
from oretrofit._operators import attention as _attention
from oretrofit._operators.attention import o_attention, o_attention_fused, o_attention_reference
from oretrofit._kernels.cudnn import cudnn_backend
from oretrofit._kernels.flex import o_attention_flex

from _operators.test_attention import LAYOUTS, make, mask_of
from _kernels.test_triton import triton_module  # noqa: F401 (a fixture)
from _kernels.test_lse import (GRAD_TOL, _efficient_arguments, compare_with_reference,
                                    fake_efficient_backward, fake_efficient_forward, grads,
                                    with_nulls)

# bf16/fp16 inputs against the fp64 reference of the same rounded inputs, relative to
# max(1, |reference|): the kernels' outputs and gradients are rounded to 8 (11) mantissa bits.
HALF_TOL = {torch.bfloat16: 2e-2, torch.float16: 4e-3}
TOL = {**GRAD_TOL, **HALF_TOL}


def _compute(t: torch.Tensor) -> torch.Tensor:
    """A stand-in kernel computes as the real one: products and statistics in ≥ fp32."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


# ---- stand-ins with the ops' signatures and outputs


def fake_cudnn_forward(q, k, v, attn_bias, compute_log_sumexp, dropout_p, is_causal,
                       return_debug_mask, *, scale):
    assert compute_log_sumexp and dropout_p == 0.0 and not is_causal and not return_debug_mask
    b, h, n_q, _ = q.shape
    assert k.shape[1] == v.shape[1] == h, "equal head counts"
    assert attn_bias.dtype == q.dtype and attn_bias.dim() == 4
    assert all(s % 16 == 0 for s in attn_bias.stride()[:-1]), "aligned bias"
    o, lse = kernels._math_forward(*map(_compute, (q, k, v, attn_bias)), scale)
    seed = torch.zeros((), dtype=torch.long)
    return o.to(q.dtype), lse[..., None], None, None, n_q, k.shape[2], seed, seed, None


def fake_cudnn_backward(grad_out, q, k, v, out, logsumexp, philox_seed, philox_offset, attn_bias,
                        cum_seq_q, cum_seq_k, max_q, max_k, dropout_p, is_causal, *, scale):
    assert dropout_p == 0.0 and not is_causal and cum_seq_q is None and cum_seq_k is None
    assert (max_q, max_k) == (q.shape[2], k.shape[2]) and k.shape[1] == q.shape[1]
    assert logsumexp.shape == (*q.shape[:3], 1) and grad_out.stride() == out.stride()
    grads_ = kernels._math_backward(*map(_compute, (grad_out, q, k, v, attn_bias, out)),
                                    logsumexp[..., 0].to(_compute(q).dtype), scale)
    return tuple(g.to(q.dtype) for g in grads_)


def half_efficient_forward(q, k, v, bias, compute_log_sumexp, dropout_p, is_causal, *, scale):
    """The memory-efficient forward's contract in the inputs' dtype (statistics in ≥ fp32)."""
    _efficient_arguments(q, k, v, bias)
    o, lse, seed, offset = fake_efficient_forward(*map(_compute, (q, k, v)), _compute(bias),
                                                  compute_log_sumexp, dropout_p, is_causal,
                                                  scale=scale, checked=True)
    return o.to(q.dtype), lse, seed, offset


def half_efficient_backward(d_out, q, k, v, bias, out, lse, *args, scale):
    _efficient_arguments(q, k, v, bias)
    *g, _ = fake_efficient_backward(*map(_compute, (d_out, q, k, v, bias, out)), lse, *args,
                                    scale=scale, checked=True)
    return (*(t.to(q.dtype) for t in g), None)


def fake_flex(q, k, v, score_mod, scale, enable_gqa):
    """FlexAttention's contract: ``score_mod`` on the scaled scores with broadcast indices,
    ``(o in q's dtype, lse in ≥ fp32)``, differentiable (also through ``score_mod``'s captures)."""
    (b, h, n_q, _), (hk, n_k) = q.shape, k.shape[1:3]
    assert enable_gqa == (hk != h)
    kk, vv = (kernels._repeat_kv(_compute(t), h) for t in (k, v))
    s = scale * _compute(q) @ kk.transpose(-1, -2)
    index = [torch.arange(n).view([n if a == i else 1 for a in range(4)])
             for i, n in enumerate((b, h, n_q, n_k))]
    t = score_mod(s, *index)
    return (torch.softmax(t, -1) @ vv).to(q.dtype), torch.logsumexp(t, -1)


CUDNN = cudnn_backend(fake_cudnn_forward, fake_cudnn_backward)
EFFICIENT = kernels.efficient_backend(half_efficient_forward, half_efficient_backward,
                                      tiled=False)


def _flex_run(q, k, v, p_q, p_k, visible, bias, eps, scale, softcap, dropout_p):
    return o_attention_flex(q, k, v, p_q, p_k, visible, bias, eps, scale, softcap, fake_flex)


ROUTES = {"cudnn": route.Route("cudnn", ("cpu",), lambda: True, route.backend_run(lambda: CUDNN),
                               head_multiple=8),
          "flex": route.Route("flex", ("cpu",), lambda: True, _flex_run, softcap=True),
          "efficient": route.Route("efficient", ("cpu",), lambda: True,
                                   route.backend_run(lambda: EFFICIENT), head_multiple=8)}


# the routes in the compute dtype, after the chain in q's dtype
COMPUTE_ROUTES = tuple(r for r in route.ROUTES if not r.in_q_dtype)


@pytest.fixture
def chain(monkeypatch: pytest.MonkeyPatch):
    """``use(*routes)``: the routes in q's dtype are these (a fresh check cache)."""
    monkeypatch.setattr(route, "_CHECKED", {})

    def use(*routes: route.Route) -> None:
        monkeypatch.setattr(route, "ROUTES", (*routes, *COMPUTE_ROUTES))
    return use


def chosen(dtype: torch.dtype, head_size: int, softcap: bool = False,
           dropout: bool = False) -> route.Route | None:
    """The route of a call on CPU inputs of ``dtype`` and ``head_size``."""
    q = torch.zeros(1, 1, 1, head_size, dtype=dtype)
    return route.route_for(q, q, q, None, softcap, dropout)


def on_route(name: str):
    """The route's run as ``fn(q, k, v, p_q, p_k, mask=, eps=, softcap=)``."""
    def fn(q, k, v, p_q, p_k, mask=None, eps=1e-6, softcap=None):
        visible, bias = _attention._split_mask(mask, torch.float32)
        return ROUTES[name].run(q, k, v, p_q, p_k, visible, bias, eps, q.shape[-1] ** -0.5,
                                softcap, 0.0)
    return fn


def half_inputs(dtype: torch.dtype, layout: str = "gqa_per_kv_head", nq: int = 7, nk: int = 9,
                d: int = 16) -> list[torch.Tensor]:
    """q, k, v in ``dtype``, fp32 presences with a null receiver (row 1), a null source (key 2)
    and, in batch 1, no live source at all."""
    h, hkv, ph = LAYOUTS[layout]
    q, k, v, p_q, p_k = make(h=h, hkv=hkv, presence_heads=ph, nq=nq, nk=nk, d=d)
    p_q, p_k = with_nulls(p_q, p_k)
    return [q.to(dtype), k.to(dtype), v.to(dtype), p_q, p_k]


# ---- each route's algebra against the fp64 reference


@pytest.mark.parametrize("name", list(ROUTES))
@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("mask_kind", ["none", "bool", "key_padding", "additive_bias"])
def test_each_route_is_the_operator_in_fp64(name: str, layout: str, mask_kind: str) -> None:
    inputs = [t.double().requires_grad_() for t in half_inputs(torch.float32, layout)]
    mask = mask_of(mask_kind, 2, 7, 9)
    mask = mask.double() if mask is not None and mask.is_floating_point() else mask
    compare_with_reference(on_route(name), inputs, GRAD_TOL[torch.float64], mask=mask, eps=1e-3)


@pytest.mark.parametrize("eps", [1e-3, 0.0], ids=["eps=1e-3", "eps=0"])
@pytest.mark.parametrize("name", list(ROUTES))
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16, torch.float32], ids=str)
def test_each_route_in_the_inputs_dtype(name: str, dtype: torch.dtype, eps: float) -> None:
    """Outputs and gradients in the inputs' dtypes, within their rounding of the reference;
    null receivers, null sources and empty rows exact (ε = 0, the limit, included)."""
    inputs = [t.requires_grad_() for t in half_inputs(dtype)]
    compare_with_reference(on_route(name), inputs, TOL[dtype], eps=eps)
    out, dq, dk, dv, d_pq, d_pk = grads(on_route(name), inputs, torch.randn(2, 4, 7, 16), eps=eps)
    assert out.dtype == dq.dtype == dk.dtype == dv.dtype == dtype
    assert d_pq.dtype == d_pk.dtype == torch.float32
    assert torch.equal(out[1], torch.zeros_like(out[1]))                # no live source
    assert torch.equal(out[0, :, 1], torch.zeros_like(out[0, :, 1]))    # a null receiver
    assert bool((d_pk[..., 2] == 0).all()) and torch.isfinite(d_pq).all()
    assert all(torch.isfinite(g).all() for g in (dq, dk, dv, d_pk))


@pytest.mark.parametrize("name", list(ROUTES))
def test_each_route_passes_its_check(name: str) -> None:
    for dtype in (torch.bfloat16, torch.float16, torch.float32):
        assert route.check_route(ROUTES[name].run, torch.device("cpu"), dtype) == "", dtype


def test_flex_fuses_the_softcap() -> None:
    inputs = [t.double().requires_grad_() for t in half_inputs(torch.float32, "mha")]
    compare_with_reference(on_route("flex"), inputs, GRAD_TOL[torch.float64], softcap=1.5,
                           mask=mask_of("additive_bias", 2, 7, 9).double())


def test_only_the_presence_gradients(monkeypatch: pytest.MonkeyPatch) -> None:
    """p_q alone needs no kernel backward; p_k alone one augmented call (one, not tiles)."""
    calls = []
    counted = dataclasses.replace(CUDNN, backward=lambda *a: calls.append(1) or CUDNN.backward(*a))
    monkeypatch.setitem(ROUTES, "cudnn", dataclasses.replace(
        ROUTES["cudnn"], run=route.backend_run(lambda: counted)))
    monkeypatch.setattr(kernels, "BACKWARD_TILE", (3, 3))
    for alone, n_calls in (("p_q", 0), ("p_k", 1)):
        calls.clear()
        inputs = [t.requires_grad_(i == ("q", "k", "v", "p_q", "p_k").index(alone))
                  for i, t in enumerate(half_inputs(torch.bfloat16))]
        compare_with_reference(on_route("cudnn"), inputs, HALF_TOL[torch.bfloat16])
        assert len(calls) == n_calls, alone


def test_fp16_null_sources_get_a_finite_bias() -> None:
    p_k = torch.tensor([[0.5, 0.0]])
    logit = kernels.score_bias(p_k, 1, None, None, torch.float16)
    assert logit.dtype == torch.float16 and torch.isfinite(logit).all()
    assert float(logit[..., 1]) == kernels.null_logit(torch.float16) == -32752.0
    assert kernels.null_logit(torch.bfloat16) == kernels._NULL_LOGIT


def test_a_broken_composition_is_caught() -> None:
    def shifted(q, k, v, bias, *args, scale):
        out = fake_cudnn_forward(q, k, v, bias, *args, scale=scale)
        return (out[0], out[1] + 1.0, *out[2:])             # e.g. an LSE in another convention
    broken = cudnn_backend(shifted, fake_cudnn_backward)
    failure = route.check_route(route.backend_run(lambda: broken), torch.device("cpu"),
                                torch.bfloat16)
    assert "differs (relative error" in failure


# ---- the chain


def failing(name: str) -> route.Route:
    def run(*args):
        raise RuntimeError(f"{name}: no kernel for these inputs")
    return route.Route(name, ("cpu",), lambda: True, run)


def test_the_table_is_the_chain_in_q_dtype_on_cuda_then_the_compute_dtype_routes() -> None:
    assert [r.name for r in route.ROUTES] == ["triton", "cudnn", "flex", "efficient",
                                              "cpu-flash", "cuda-efficient", "augmented-copy"]
    assert [r.in_q_dtype for r in route.ROUTES] == [True] * 4 + [False] * 3
    assert all(r.devices == ("cuda",) for r in route.ROUTES if r.in_q_dtype)
    assert chosen(torch.bfloat16, 16).name == "cpu-flash"                  # computed in fp32
    assert chosen(torch.bfloat16, 16, softcap=True) is None                # the reference path


def test_a_failing_check_falls_to_the_next_route_and_warns_once(chain) -> None:
    chain(failing("first"), ROUTES["cudnn"], ROUTES["flex"])
    with pytest.warns(RuntimeWarning, match=r"the first OAttention route fails its check on cpu "
                      r"torch.bfloat16 \(head dim 16: RuntimeError: first: no kernel"):
        assert chosen(torch.bfloat16, 16).name == "cudnn"
    with warnings.catch_warnings():
        warnings.simplefilter("error")                       # reported once, then silent
        assert chosen(torch.bfloat16, 16).name == "cudnn"
        q, k, v, p_q, p_k = half_inputs(torch.bfloat16)
        out, _ = o_attention(q, k, v, p_q, p_k)
    assert torch.equal(out, on_route("cudnn")(q, k, v, p_q, p_k))


@pytest.mark.parametrize("context", [torch.no_grad, torch.inference_mode])
def test_a_first_call_without_autograd_still_checks_the_route(chain, context) -> None:
    chain(ROUTES["cudnn"])
    q, k, v, p_q, p_k = half_inputs(torch.bfloat16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with context():
            out, _ = o_attention(q, k, v, p_q, p_k)
    assert route._CHECKED == {("cudnn", "cpu", torch.bfloat16, 16, torch.__version__): True}
    assert torch.equal(out, on_route("cudnn")(q, k, v, p_q, p_k))


def test_routes_that_do_not_serve_a_call_are_skipped_without_a_check(chain) -> None:
    absent = route.Route("absent", ("cpu",), lambda: False, failing("absent").run)
    chain(absent, ROUTES["cudnn"], ROUTES["flex"])
    with warnings.catch_warnings():
        warnings.simplefilter("error")                       # not ready: skipped silently
        assert chosen(torch.bfloat16, 16).name == "cudnn"
        assert chosen(torch.bfloat16, 12).name == "flex"
        assert chosen(torch.bfloat16, 16, softcap=True).name == "flex"
        assert chosen(torch.bfloat16, 16, dropout=True) is None
        assert chosen(torch.float64, 16).name == "cpu-flash"
    assert ("absent", "cpu", torch.bfloat16, 16, torch.__version__) in route._CHECKED


def test_with_no_route_half_precision_is_computed_in_fp32(chain) -> None:
    chain(failing("only"))
    q, k, v, p_q, p_k = half_inputs(torch.bfloat16)
    with pytest.warns(RuntimeWarning, match="only OAttention route fails"):
        out, _ = o_attention(q, k, v, p_q, p_k)
    assert out.dtype == torch.bfloat16 and torch.equal(out, o_attention_fused(q, k, v, p_q, p_k))


def test_precision_fp32_and_weights_skip_the_chain(chain) -> None:
    chain(ROUTES["cudnn"])
    q, k, v, p_q, p_k = half_inputs(torch.bfloat16)
    want = o_attention_fused(q, k, v, p_q, p_k)
    assert torch.equal(o_attention(q, k, v, p_q, p_k, precision="fp32")[0], want)
    out, weights = o_attention(q, k, v, p_q, p_k, need_weights=True)
    assert weights is not None and torch.equal(out, o_attention_reference(
        q, k, v, p_q, p_k, need_weights=True)[0])
    assert not [key for key in route._CHECKED if key[0] == "cudnn"]    # never asked


def test_fp32_softcap_takes_a_route_that_computes_it(chain) -> None:
    chain(ROUTES["cudnn"], ROUTES["flex"])
    q, k, v, p_q, p_k = half_inputs(torch.float32, "mha")
    out, _ = o_attention(q, k, v, p_q, p_k, softcap=2.0)
    assert torch.equal(out, on_route("flex")(q, k, v, p_q, p_k, softcap=2.0))
    want = o_attention_reference(q, k, v, p_q, p_k, softcap=2.0)[0]
    assert (out - want).abs().max() <= 1e-5
    assert torch.equal(o_attention(q, k, v, p_q, p_k)[0], o_attention_fused(q, k, v, p_q, p_k))


def test_describe_names_the_route_each_dtype_takes(chain) -> None:
    chain(ROUTES["cudnn"])
    cpu = torch.device("cpu")
    assert route.describe(cpu, torch.bfloat16, 16) == "cudnn"
    assert route.describe(cpu, torch.float16, 12) == "cpu-flash (fp32 compute)"
    assert route.describe(cpu, torch.float32, 16) == "cpu-flash"


def test_a_first_call_inside_an_autocast_region_checks_the_dtype_asked(monkeypatch) -> None:
    """A bf16 autocast on the CPU (tabpfn's default precision there) around the first call must
    not make an fp32 route fail its check and stay off for the process."""
    monkeypatch.setattr(route, "_CHECKED", {})
    q, k, v, p_q, p_k = make()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch.autocast("cpu", dtype=torch.bfloat16):
            o_attention(q, k, v, p_q, p_k)
    assert route._CHECKED and all(route._CHECKED.values())


def test_causality_is_a_flag_only_for_a_route_that_takes_it(chain) -> None:
    """A route with ``causal=True`` gets the flag and the caller's mask untouched; any other
    gets the (Nq, Nk) relation ``j ≤ i + Nk − Nq`` built into its mask and no flag."""
    calls = []

    def recording(q, k, v, p_q, p_k, visible, bias, eps, scale, softcap, dropout_p, **flags):
        calls.append((visible, flags))
        return on_route("cudnn")(q, k, v, p_q, p_k, mask=visible)

    padding = torch.ones(2, 1, 1, 9, dtype=torch.bool)
    padding[..., -2:] = False
    q, k, v, p_q, p_k = half_inputs(torch.bfloat16)
    lower = torch.ones(7, 9, dtype=torch.bool).tril(2)
    for takes_flag in (True, False):
        chain(route.Route("recording", ("cpu",), lambda: True, recording, causal=takes_flag,
                          check=lambda device, dtype: ""))
        calls.clear()
        o_attention(q, k, v, p_q, p_k, mask=padding, causal=True)
        (visible, flags), = calls
        assert flags == ({"causal": True} if takes_flag else {})
        assert torch.equal(visible, padding if takes_flag else padding & lower)


def test_the_triton_route_takes_causality_as_its_kernel_flag(triton_module, monkeypatch) -> None:
    """No mask is built for a causal call on the Triton route: the kernel gets the flag."""
    calls, real = [], triton_module.o_attention_triton

    def recording(q, k, v, p_q, p_k, visible, bias, eps, scale, softcap, dropout_p, seed, causal):
        calls.append((visible, causal))
        return real(q, k, v, p_q, p_k, visible, bias, eps, scale, softcap, dropout_p, seed, causal)

    q, k, v, p_q, p_k = half_inputs(torch.bfloat16, nq=5, nk=6)
    assert route.route_for(q, k, v).name == "triton"                    # checked before recording
    monkeypatch.setattr(triton_module, "o_attention_triton", recording)
    out, _ = o_attention(q, k, v, p_q, p_k, causal=True)
    assert calls == [(None, True)]
    lower = torch.ones(5, 6, dtype=torch.bool).tril(1)
    assert torch.allclose(out.float(), o_attention(q, k, v, p_q, p_k, mask=lower)[0].float(),
                          atol=1e-2)
