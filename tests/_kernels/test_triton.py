"""The fused Triton OAttention kernels, run on the CPU by Triton's interpreter (TRITON_INTERPRET=1).

Every case is checked against ``o_attention_reference`` evaluated in fp64 on the same (rounded)
inputs: output and every gradient (q, k, v, p_q, p_k). Shapes are tiny: the interpreter runs each
tile in numpy and takes seconds per call.
"""

from __future__ import annotations

import dataclasses
import importlib

import pytest
import torch

from oretrofit._kernels import routes as route
from oretrofit._operators.attention import (PRECISIONS, _split_mask, o_attention, o_attention_fused,
                                  o_attention_reference, o_weights)

# Relative error to the fp64 reference of the same rounded inputs: fp32/fp64 compute the softmax
# statistics in fp32; bf16 rounds the probabilities and products to 8 bits of mantissa.
REL_TOL = {torch.float64: 1e-6, torch.float32: 1e-5, torch.bfloat16: 2e-2}


@pytest.fixture()
def triton_module(monkeypatch: pytest.MonkeyPatch):
    """``oretrofit._kernels.triton`` with the CPU enabled for its route, the only route of the
    chain here (a fresh route cache). tests/conftest.py sets TRITON_INTERPRET=1 before Triton is
    imported."""
    triton_route = next(r for r in route.ROUTES if r.name == "triton")
    on_cpu = dataclasses.replace(triton_route, devices=("cuda", "cpu"))
    monkeypatch.setattr(route, "ROUTES", (on_cpu, *(r for r in route.ROUTES if not r.in_q_dtype)))
    monkeypatch.setattr(route, "_CHECKED", {})
    module = importlib.import_module("oretrofit._kernels.triton")
    assert module._INTERPRET, "TRITON_INTERPRET=1 must be set before triton is imported"
    return module


def make(dtype: torch.dtype, h: int = 4, hkv: int = 2, nq: int = 19, nk: int = 23, d: int = 8,
         per_head: bool = False, seed: int = 0) -> list[torch.Tensor]:
    """q, k, v in ``dtype`` (GQA), presences in (0.1, 1.1) with a null receiver (query 3, where
    there is one), a null source and (batch 1 of p_k all null) empty rows."""
    g = torch.Generator().manual_seed(seed)
    q, k, v = (torch.randn(s, generator=g).to(dtype)
               for s in ((2, h, nq, d), (2, hkv, nk, d), (2, hkv, nk, d)))
    pdt = torch.float64 if dtype == torch.float64 else torch.float32
    p_q = torch.rand((2, h, nq) if per_head else (2, nq), generator=g).to(pdt) + 0.1
    p_k = torch.rand((2, hkv, nk) if per_head else (2, nk), generator=g).to(pdt) + 0.1
    p_q[0, ..., 3:4] = 0.0
    p_k[0, ..., 5] = 0.0
    p_k[1] = 0.0
    return [q, k, v, p_q, p_k]


def run_both(module, inputs, mask=None, softcap=None, dropout_p=0.0, seed=None, reference=None,
             eps=1e-6, causal=False):
    """(kernel out, kernel grads, fp64 reference out, reference grads) for one random d_out;
    ``causal``: the kernel's flag, against the reference with the causal mask added to ``mask``."""
    ours = [t.detach().clone().requires_grad_() for t in inputs]
    theirs = [t.detach().double().requires_grad_() for t in inputs]
    visible, bias = _split_mask(mask, torch.float32)
    d = inputs[0].shape[-1]
    out = module.o_attention_triton(*ours, visible, bias, eps, d ** -0.5, softcap, dropout_p,
                                    seed, causal)
    if causal:
        mask = with_causal(mask, inputs[0].shape[2], inputs[1].shape[2])
    d_out = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(out.dtype)
    out.backward(d_out)
    want = (reference or (lambda *t: o_attention_reference(*t, mask=mask, softcap=softcap,
                                                           eps=eps)[0]))(
        *theirs)
    want.backward(d_out.double())
    return out, [t.grad for t in ours], want, [t.grad for t in theirs]


def with_causal(mask: torch.Tensor | None, n_q: int, n_k: int) -> torch.Tensor:
    """``mask`` (None, bool or additive) with keys ``j > i + Nk − Nq`` hidden: a dense mask."""
    tril = torch.ones(n_q, n_k, dtype=torch.bool).tril(n_k - n_q)
    if mask is None:
        return tril
    if mask.dtype == torch.bool:
        return mask & tril
    return mask.masked_fill(~tril, float("-inf"))


def assert_close(got: torch.Tensor, want: torch.Tensor, tol: float, what: str) -> None:
    error = float((got.detach().double() - want.detach()).abs().max() / want.detach().abs().max())
    assert error <= tol, f"{what}: relative error {error:.3g} > {tol}"


@pytest.mark.parametrize("eps", [1e-6, 0.0], ids=["eps=1e-6", "eps=0"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.bfloat16])
def test_forward_and_every_gradient_match_the_reference(triton_module, dtype, eps) -> None:
    inputs = make(dtype)
    out, grads, want, want_grads = run_both(triton_module, inputs, eps=eps)
    assert out.dtype == dtype
    assert_close(out, want, REL_TOL[dtype], "out")
    for name, given, got, expected in zip(("dq", "dk", "dv", "dp_q", "dp_k"), inputs, grads,
                                          want_grads):
        assert got.dtype == given.dtype, name
        assert_close(got, expected, REL_TOL[dtype], name)
    assert torch.equal(out[1], torch.zeros_like(out[1]))          # empty rows: exact zeros
    assert torch.equal(out[0, :, 3], torch.zeros_like(out[0, :, 3]))    # a null receiver
    assert grads[4][0, 5] == 0 and torch.equal(grads[4][1], torch.zeros_like(grads[4][1]))


def test_masks_biases_softcap_and_per_head_presences(triton_module) -> None:
    inputs = make(torch.float64, per_head=True)
    mask = torch.randn(1, 1, 19, 23, dtype=torch.float64)          # a finite bias …
    mask[..., 2:5] = float("-inf")                                 # … masked keys …
    mask[0, 0, 4] = float("-inf")                                  # … and a fully masked row
    out, grads, want, want_grads = run_both(triton_module, inputs, mask=mask, softcap=2.0)
    assert_close(out, want, 1e-6, "out")
    for got, expected in zip(grads, want_grads):
        assert_close(got, expected, 1e-6, "grad")
    assert torch.equal(out[:, :, 4], torch.zeros_like(out[:, :, 4]))


def test_key_presences_shared_per_kv_head_and_per_query_head_agree(triton_module) -> None:
    """One p_k given shared ``(B, Nk)``, per KV head ``(B, Hkv, Nk)`` and per query head
    ``(B, H, Nk)`` under GQA (4→2): each matches the reference (and so does a p_k that differs
    between query heads); the output and dq, dk, dv are the same bits, and the per-head presence
    gradients sum to the shared one (fp32 column sums, summed in another order)."""
    q, k, v, p_q, p_k = make(torch.float64)
    forms = {"shared": p_k, "per KV head": p_k[:, None].repeat(1, 2, 1),
             "per query head": p_k[:, None].repeat(1, 4, 1),
             "distinct per query head": p_k[:, None] * torch.rand(
                 4, 23, generator=torch.Generator().manual_seed(2), dtype=torch.float64)}
    results = {name: run_both(triton_module, [q, k, v, p_q, form]) for name, form in forms.items()}
    for name, (out, grads, want, want_grads) in results.items():
        assert_close(out, want, 1e-6, f"{name} out")
        for grad, got, expected in zip(("dq", "dk", "dv", "dp_q", "dp_k"), grads, want_grads):
            assert_close(got, expected, 1e-6, f"{name} {grad}")
    shared_out, shared_grads = results["shared"][:2]
    for name in ("per KV head", "per query head"):
        out, grads = results[name][:2]
        assert torch.equal(out, shared_out), name
        for got, expected in zip(grads[:4], shared_grads[:4]):
            assert torch.equal(got, expected), name
        assert_close(grads[4].sum(1), shared_grads[4].double(), 1e-6, f"{name} dp_k summed")
        assert torch.equal(grads[4][0, :, 5], torch.zeros_like(grads[4][0, :, 5]))   # p_j = 0


def test_dropout_is_the_reference_with_the_kernels_mask(triton_module) -> None:
    inputs = make(torch.float64)
    keep = triton_module.dropout_keep(7, (2, 4, 19, 23), 0.3).double()
    assert 0.6 < float((keep > 0).double().mean()) < 0.8
    assert set(keep.unique().tolist()) == {0.0, float(torch.tensor(1 / 0.7, dtype=torch.float32))}

    def dropped_reference(q, k, v, p_q, p_k):
        kk, vv = k.repeat_interleave(2, 1), v.repeat_interleave(2, 1)
        pk = p_k[:, None, None, :]
        weights = o_weights(q @ kk.transpose(-1, -2) * 8 ** -0.5, pk, pk != 0, 1e-6)
        return p_q[:, None, :, None] * ((weights * keep) @ vv)

    out, grads, want, want_grads = run_both(triton_module, inputs, dropout_p=0.3, seed=7,
                                            reference=dropped_reference)
    assert_close(out, want, 1e-6, "out")
    for got, expected in zip(grads, want_grads):
        assert_close(got, expected, 1e-6, "grad")


def test_dropout_draws_its_seed_from_torchs_generator(triton_module) -> None:
    q, k, v, p_q, p_k = make(torch.float32, nq=5, nk=6)
    draws = []
    for _ in range(2):
        torch.manual_seed(3)
        draws.append(o_attention(q, k, v, p_q, p_k, dropout_p=0.5)[0])
    assert torch.equal(draws[0], draws[1])
    assert not torch.equal(draws[0], o_attention(q, k, v, p_q, p_k, dropout_p=0.5)[0])


def test_half_precision_takes_the_triton_route_unless_fp32_is_asked(triton_module) -> None:
    q, k, v, p_q, p_k = make(torch.bfloat16, nq=5, nk=6)
    out, _ = o_attention(q, k, v, p_q, p_k)
    direct = triton_module.o_attention_triton(q, k, v, p_q, p_k, None, None, 1e-6, 8 ** -0.5)
    assert out.dtype == torch.bfloat16 and torch.equal(out, direct)
    fp32, _ = o_attention(q, k, v, p_q, p_k, precision="fp32")
    assert torch.equal(fp32, o_attention_fused(q, k, v, p_q, p_k))
    assert route.route_for(q, k, v).name == "triton"


def test_fp32_without_softcap_or_dropout_keeps_the_fp32_kernel(triton_module) -> None:
    q, k, v, p_q, p_k = make(torch.float32, nq=5, nk=6)
    assert torch.equal(o_attention(q, k, v, p_q, p_k)[0], o_attention_fused(q, k, v, p_q, p_k))


def test_a_triton_kernel_that_fails_its_check_is_not_used(triton_module, monkeypatch) -> None:
    monkeypatch.setattr(route, "check_route", lambda run, device, dtype, head_dim: "forward differs")
    monkeypatch.setattr(route, "_CHECKED", {})
    q, k, v, p_q, p_k = make(torch.bfloat16, nq=5, nk=6)
    with pytest.warns(RuntimeWarning, match="triton OAttention route fails its check"):
        out, _ = o_attention(q, k, v, p_q, p_k)
    assert torch.equal(out, o_attention_fused(q, k, v, p_q, p_k))


def test_the_cpu_takes_the_triton_route_only_where_enabled(monkeypatch) -> None:
    monkeypatch.setattr(route, "_CHECKED", {})
    assert all(r.devices == ("cuda",) for r in route.ROUTES if r.in_q_dtype)
    q, k, v, p_q, p_k = make(torch.bfloat16, nq=5, nk=6)
    assert route.route_for(q, k, v).name == "cpu-flash"                   # computed in fp32
    assert torch.equal(o_attention(q, k, v, p_q, p_k)[0], o_attention_fused(q, k, v, p_q, p_k))


def test_an_unknown_precision_is_refused_with_the_choices() -> None:
    q, k, v, p_q, p_k = make(torch.float32, nq=5, nk=6)
    with pytest.raises(ValueError, match=r"precision must be one of \('auto', 'fp32'\)"):
        o_attention(q, k, v, p_q, p_k, precision="bf16")
    assert PRECISIONS == ("auto", "fp32")


def test_the_route_check_passes_in_each_dtype(triton_module) -> None:
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        assert route.check_route(route._run_triton, torch.device("cpu"), dtype) == ""


def test_the_route_check_catches_a_wrong_kernel(triton_module, monkeypatch) -> None:
    real = triton_module.o_attention_triton
    monkeypatch.setattr(triton_module, "o_attention_triton",
                        lambda q, k, v, p_q, p_k, *rest: real(q, k, v, p_q * 0.5, p_k, *rest))
    assert route.check_route(route._run_triton, torch.device("cpu"),
                             torch.float32).startswith("out differs")


def _compile_error(name: str) -> Exception:
    """One of Triton's errors for a kernel that does not compile or fit the device."""
    from triton.compiler.errors import CompilationError
    from triton.runtime.errors import OutOfResources, PTXASError
    return {"OutOfResources": OutOfResources(361_000, 232_448, "shared memory"),
            "CompilationError": CompilationError("kernel.py", None, "unsupported layout"),
            "PTXASError": PTXASError("ptxas error: too many resources requested")}[name]


@pytest.mark.parametrize("error", ["OutOfResources", "CompilationError", "PTXASError"])
def test_a_kernel_that_does_not_compile_falls_back_with_one_warning(triton_module, monkeypatch,
                                                                    error) -> None:
    def fail(*args, **kwargs):
        raise _compile_error(error)

    monkeypatch.setattr(triton_module._Launch, "launch", fail)
    q, k, v, p_q, p_k = make(torch.bfloat16, nq=5, nk=6)
    with pytest.warns(RuntimeWarning, match=f"triton OAttention route fails its check .*head "
                                            f"dim 16: {error}") as caught:
        out, _ = o_attention(q, k, v, p_q, p_k)
        again, _ = o_attention(q, k, v, p_q, p_k)
    assert len([w for w in caught if "OAttention route" in str(w.message)]) == 1
    assert torch.equal(out, o_attention_fused(q, k, v, p_q, p_k)) and torch.equal(out, again)


def test_the_route_is_checked_at_the_calls_head_dim_bucket(triton_module, monkeypatch) -> None:
    def fail_at_256(self, *args, **kwargs):
        if self.d > 128:
            raise _compile_error("OutOfResources")
        return real(self, *args, **kwargs)

    real = triton_module._Launch.launch
    monkeypatch.setattr(triton_module._Launch, "launch", fail_at_256)
    def chosen(head_size: int) -> str:
        q = torch.zeros(1, 1, 1, head_size, dtype=torch.bfloat16)
        return route.route_for(q, q, q).name

    with pytest.warns(RuntimeWarning, match="head dim 256: OutOfResources"):
        assert chosen(200) == "cpu-flash"                                 # computed in fp32
    assert chosen(100) == "triton"
    assert {key[3] for key in route._CHECKED if key[0] == "triton"} == {128, 256}
    assert chosen(512) == "cpu-flash"                                     # past max_head_size


def test_head_dim_256_matches_the_reference(triton_module) -> None:
    inputs = make(torch.float32, h=2, hkv=1, nq=9, nk=11, d=256)
    out, grads, want, want_grads = run_both(triton_module, inputs)
    assert_close(out, want, REL_TOL[torch.float32], "out")
    for name, got, expected in zip(("dq", "dk", "dv", "dp_q", "dp_k"), grads, want_grads):
        assert_close(got, expected, REL_TOL[torch.float32], name)


def test_grid_and_int32_limits_are_refused_by_name(triton_module) -> None:
    def call(q_shape, k_shape):
        q = torch.empty(q_shape, device="meta", dtype=torch.bfloat16)
        k = torch.empty(k_shape, device="meta", dtype=torch.bfloat16)
        p_q = torch.empty(q_shape[0], q_shape[2], device="meta")
        p_k = torch.empty(k_shape[0], k_shape[2], device="meta")
        triton_module.o_attention_triton(q, k, k, p_q, p_k, None, None, 0.0, 0.125)

    with pytest.raises(ValueError, match="batch × heads up to 65,535 .*not 65,536"):
        call((4096, 16, 1, 64), (4096, 16, 1, 64))
    with pytest.raises(ValueError, match="int32 offsets; k's spans 2,147,483,648 elements"):
        call((1, 1, 1, 64), (1, 1, 2**25, 64))


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_error_is_within_twice_sdpas(triton_module, dtype) -> None:
    """P and dS are rounded to q's dtype before their products, as on the GPU: the kernel's
    error vs fp64 (output and dq, dk, dv) stays within 2× that of SDPA in the same dtype."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(1, 2, 48, 32, generator=g).to(dtype) for _ in range(3))
    ones = torch.ones(1, 48)
    d_out = torch.randn(1, 2, 48, 32, generator=g).to(dtype)

    def errors(run) -> list[float]:
        ours = [t.detach().clone().requires_grad_() for t in (q, k, v)]
        exact = [t.detach().double().requires_grad_() for t in (q, k, v)]
        got, want = run(*ours), torch.softmax(
            exact[0] @ exact[1].transpose(-1, -2) / 32 ** 0.5, -1) @ exact[2]
        got.backward(d_out)
        want.backward(d_out.double())
        pairs = [(got, want)] + [(a.grad, b.grad) for a, b in zip(ours, exact)]
        return [float((a.detach().double() - b.detach()).abs().max() / b.detach().abs().max())
                for a, b in pairs]

    # ε = 0 and presences 1: OAttention is plain attention.
    kernel = errors(lambda q, k, v: triton_module.o_attention_triton(
        q, k, v, ones, ones, None, None, 0.0, 32 ** -0.5))
    sdpa = errors(torch.nn.functional.scaled_dot_product_attention)
    for name, ours, theirs in zip(("out", "dq", "dk", "dv"), kernel, sdpa):
        assert ours <= 2 * theirs, f"{name}: {ours:.3g} > 2 × SDPA's {theirs:.3g}"


@pytest.mark.parametrize("n_q,n_k", [(19, 23), (23, 23), (1, 23), (23, 19), (40, 33)],
                         ids=["cache", "square", "decode", "more-queries", "ragged"])
@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_causal_is_the_dense_causal_mask(triton_module, dtype, n_q, n_k) -> None:
    """Bottom-right aligned (key j visible to query i iff j ≤ i + Nk − Nq), under GQA; with
    Nq > Nk the first queries see no key and are exact zero rows."""
    inputs = make(dtype, nq=n_q, nk=n_k)
    out, grads, want, want_grads = run_both(triton_module, inputs, causal=True)
    assert_close(out, want, REL_TOL[dtype], "out")
    for name, got, expected in zip(("dq", "dk", "dv", "dp_q", "dp_k"), grads, want_grads):
        assert_close(got, expected, REL_TOL[dtype], name)
    blind = max(n_q - n_k, 0)
    assert torch.equal(out[:, :, :blind], torch.zeros_like(out[:, :, :blind]))


def test_causal_combines_with_a_bias_a_mask_and_softcap(triton_module) -> None:
    inputs = make(torch.float64, nq=21, nk=37, per_head=True)
    mask = torch.randn(1, 1, 21, 37, dtype=torch.float64)
    mask[..., 30:33] = float("-inf")
    mask[0, 0, 6] = float("-inf")                                      # a fully masked row
    out, grads, want, want_grads = run_both(triton_module, inputs, mask=mask, softcap=2.0,
                                            causal=True)
    assert_close(out, want, 1e-6, "out")
    for got, expected in zip(grads, want_grads):
        assert_close(got, expected, 1e-6, "grad")
    assert torch.equal(out[:, :, 6], torch.zeros_like(out[:, :, 6]))


def test_causal_skips_the_tiles_no_query_sees(triton_module) -> None:
    """A NaN in a tile poisons every row whose program reads that tile (0 · NaN in the
    products), masked or not; under the interpreter's 16 × 16 tiles, with Nq = Nk = 48:
    a NaN key/value at 40 (key tile 2) leaves query tiles 0 and 1, and their dq, exact, and a
    NaN query/dO row at 5 (query tile 0) leaves the dk, dv of key tiles 1 and 2 exact."""
    assert triton_module.configs_for(8).forward.bm == 16
    clean = make(torch.float64, nq=48, nk=48)
    dense_out, dense_grads, want, want_grads = run_both(triton_module, clean, causal=True)

    poisoned_keys = [t.clone() for t in clean]
    poisoned_keys[1][:, :, 40] = poisoned_keys[2][:, :, 40] = float("nan")
    out, grads, _, _ = run_both(triton_module, poisoned_keys, causal=True)
    assert torch.equal(out[:, :, :32], dense_out[:, :, :32])
    assert torch.equal(grads[0][:, :, :32], dense_grads[0][:, :, :32])
    visible, _ = _split_mask(with_causal(None, 48, 48), torch.float64)
    masked = triton_module.o_attention_triton(*poisoned_keys, visible, None, 1e-6, 8 ** -0.5)
    assert masked[:, :, :32].isnan().all()                           # the dense mask reads it

    poisoned_queries = [t.clone() for t in clean]
    poisoned_queries[0][:, :, 5] = float("nan")
    _, grads, _, _ = run_both(triton_module, poisoned_queries, causal=True)
    for got, expected in zip(grads[1:3], dense_grads[1:3]):
        assert torch.equal(got[:, :, 16:], expected[:, :, 16:])
        assert got[:, :, :16].isnan().any()
