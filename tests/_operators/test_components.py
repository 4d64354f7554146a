"""OFFN / ONorm / OInject (eqs. 15–17) and OStandardize (eqs. 18–21, paper B.5)."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from oretrofit import OFFN, OInject, ONorm, OStandardize, o_gate, o_moments, o_standardize, presence
from oretrofit._operators.components import o_residual
from oretrofit.sweep.measure import insert_zero_rows

TAU, EPS_VAR = 1e-6, 1e-6
B5_CASES = [((2, 5, 4), torch.float32), ((1, 7, 8), torch.float32), ((3, 4, 16), torch.float32),
            ((2, 5, 4), torch.bfloat16), ((2, 5, 4), torch.float16)]
TOL = {torch.float32: 1e-5, torch.bfloat16: 5e-2, torch.float16: 5e-3, torch.float64: 1e-12}


def with_null_rows(h: torch.Tensor, rows: list[int]) -> torch.Tensor:
    h = h.clone()
    h[:, rows] = 0.0
    return h


def biased_ffn(d: int) -> nn.Module:
    ffn = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))
    nn.init.normal_(ffn[2].bias)
    return ffn


def affine_layernorm(d: int) -> nn.LayerNorm:
    norm = nn.LayerNorm(d)
    nn.init.normal_(norm.weight)
    nn.init.normal_(norm.bias)
    return norm


# ---- token-local components -------------------------------------------------------------

@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16], ids=str)
def test_local_components_are_exactly_zero_at_a_null_token(dtype: torch.dtype) -> None:
    d = 6
    h = with_null_rows(torch.randn(2, 5, d), [0, 3]).to(dtype)
    e = torch.randn(2, 5, d).to(dtype)                                   # arbitrary metadata
    components = {
        "OFFN": lambda x: OFFN(biased_ffn(d), TAU).to(dtype)(x),
        "ONorm(LayerNorm)": lambda x: ONorm(affine_layernorm(d), TAU).to(dtype)(x),
        "ONorm(RMSNorm)": lambda x: ONorm(nn.RMSNorm(d), TAU).to(dtype)(x),
        "OInject": lambda x: OInject(TAU)(x, e),
    }
    for name, component in components.items():
        y = component(h)
        assert y.dtype == dtype and torch.isfinite(y).all(), name
        assert torch.equal(y[:, [0, 3]], torch.zeros_like(y[:, [0, 3]])), name
        assert (y[:, 1].abs() > 0).any(), name


def test_local_components_follow_their_equations() -> None:
    d = 6
    h = torch.randn(3, 4, d, dtype=torch.float64)
    p = presence(h, 0.3)[..., None]
    ffn, norm, e = biased_ffn(d).double(), affine_layernorm(d).double(), torch.randn(3, 4, d,
                                                                                   dtype=torch.float64)
    assert torch.allclose(OFFN(ffn, 0.3)(h), h + p * ffn(h), rtol=1e-14, atol=1e-14)    # eq. 15
    assert torch.allclose(ONorm(norm, 0.3)(h), p * norm(h), rtol=1e-14, atol=1e-14)      # eq. 16
    assert torch.allclose(OInject(0.3)(h, e), h + p * e, rtol=1e-14, atol=1e-14)         # eq. 17
    assert torch.allclose(OInject(0.3)(h, e[:1, :1]), h + p * e[:1, :1], atol=1e-14)    # broadcast
    assert torch.equal(o_gate(p[..., 0], e), p * e)


def test_small_tau_recovers_the_wrapped_module() -> None:
    d = 8
    h = torch.randn(2, 5, d)
    ffn, norm = biased_ffn(d), affine_layernorm(d)
    assert torch.allclose(OFFN(ffn, 1e-12)(h), h + ffn(h), atol=1e-6)
    assert torch.allclose(ONorm(norm, 1e-12)(h), norm(h), atol=1e-6)


def test_local_components_have_finite_gradients_at_null_tokens() -> None:
    d = 4
    h = with_null_rows(torch.randn(2, 3, d, dtype=torch.float64), [1]).requires_grad_()
    offn = OFFN(biased_ffn(d).double(), 0.5)
    onorm = ONorm(affine_layernorm(d).double(), 0.5)
    assert torch.autograd.gradcheck(lambda x: onorm(offn(x)), (h,))


@pytest.mark.parametrize("make", [lambda: OFFN(nn.Identity(), 0.0), lambda: ONorm(nn.Identity(), -1),
                                  lambda: OInject(float("nan")),
                                  lambda: OStandardize(4, tau=0.0)])
def test_bad_tau_raises(make) -> None:
    with pytest.raises(ValueError, match="tau"):
        make()


# ---- OStandardize: the B.5 protocol ----------------------------------------------------------

@pytest.mark.parametrize("shape, dtype", B5_CASES, ids=lambda c: str(c))
def test_zero_insertion_keeps_moments_and_outputs(shape: tuple[int, ...], dtype: torch.dtype) -> None:
    h = torch.randn(shape).to(dtype)
    n = shape[1]
    std = OStandardize(shape[-1], TAU, EPS_VAR)
    nn.init.normal_(std.weight)
    nn.init.normal_(std.bias)
    moments = o_moments(h, presence(h, TAU))
    out = std(h)
    for pos in (0, n // 2, n):                                # boundaries and interior
        h2 = insert_zero_rows(h, [pos])
        for old, new in zip(moments, o_moments(h2, presence(h2, TAU))):
            assert (new - old).abs().max() <= TOL[torch.float32] * (1 + old.abs().max())
        out2 = std(h2)
        assert out2.dtype == dtype and torch.isfinite(out2).all()
        assert torch.equal(out2[:, pos], torch.zeros_like(out2[:, pos]))
        kept = [i for i in range(n + 1) if i != pos]
        assert (out2[:, kept].float() - out.float()).abs().max() <= TOL[dtype] * 4


@pytest.mark.parametrize("shape, dtype", B5_CASES, ids=lambda c: str(c))
def test_permutation_equivariance_and_finite_gradients(shape: tuple[int, ...],
                                                       dtype: torch.dtype) -> None:
    h = with_null_rows(torch.randn(shape), [0]).to(dtype).requires_grad_()
    perm = torch.randperm(shape[1])
    out = o_standardize(h, TAU, EPS_VAR)
    assert (o_standardize(h[:, perm], TAU, EPS_VAR).float() - out[:, perm].float()).abs().max() \
        <= TOL[dtype] * 4
    out.float().square().sum().backward()
    assert torch.isfinite(h.grad).all()


def test_follows_equations_18_to_20_in_fp64() -> None:
    h = with_null_rows(torch.randn(2, 6, 3, dtype=torch.float64), [2])
    gamma, beta = torch.randn(3, dtype=torch.float64), torch.randn(3, dtype=torch.float64)
    p = presence(h, 0.1)[..., None]                                         # (2, 6, 1)
    s = p.sum(1, keepdim=True)
    mu = (p * h).sum(1, keepdim=True) / s
    var = (p * (h - mu) ** 2).sum(1, keepdim=True) / s
    want = p * (gamma * (h - mu) / torch.sqrt(var + 1e-3) + beta)
    got = o_standardize(h, 0.1, 1e-3, weight=gamma, bias=beta)
    assert torch.allclose(got, want, rtol=1e-12, atol=1e-12)


def test_token_axis_other_than_one() -> None:
    h = torch.randn(4, 3, 5, dtype=torch.float64)
    assert torch.allclose(o_standardize(h, TAU, dim=0),
                          o_standardize(h.transpose(0, 1), TAU, dim=1).transpose(0, 1))


def test_singleton_support_centres_to_exact_zero_then_biased_offn_emits_zero() -> None:
    h = torch.zeros(2, 5, 4)
    h[:, 3] = torch.randn(2, 4) * 3                               # one active token per batch
    z = o_standardize(h, TAU, EPS_VAR)
    assert torch.equal(z, torch.zeros_like(z))                    # centring gives an exact zero
    assert torch.equal(OFFN(biased_ffn(4), TAU)(z), torch.zeros_like(z))   # next boundary: p = 0


def test_constant_support_gives_zero_variance_and_finite_output() -> None:
    h = torch.ones(1, 4, 3) * 2.5
    support, mean, var = o_moments(h, presence(h, TAU))
    assert torch.equal(var, torch.zeros_like(var)) and torch.allclose(mean, h[:, :1])
    assert torch.equal(o_standardize(h, TAU), torch.zeros_like(h))


@pytest.mark.parametrize("shape", [(2, 5, 4), (2, 0, 4)], ids=["all-null", "zero-length"])
def test_all_null_and_zero_length_give_finite_zeros(shape: tuple[int, ...]) -> None:
    h = torch.zeros(shape, requires_grad=True)
    support, mean, var = o_moments(h, presence(h, TAU))
    assert torch.equal(support, torch.zeros_like(support))
    assert torch.equal(mean, torch.zeros_like(mean)) and torch.equal(var, torch.zeros_like(var))
    std = OStandardize(4, TAU)
    nn.init.normal_(std.bias)
    out = std(h)
    assert out.shape == shape and torch.equal(out, torch.zeros_like(out))
    out.sum().backward()
    assert torch.isfinite(h.grad).all()


@pytest.mark.parametrize("kwargs, message", [
    (dict(h=torch.randn(4), tau=TAU), "token axis"),
    (dict(h=torch.randn(2, 3, 4), tau=TAU, dim=-1), "must not be the last"),
    (dict(h=torch.randn(2, 3, 4), tau=TAU, eps_var=0.0), "eps_var"),
    (dict(h=torch.randn(2, 3, 4), tau=-1.0), "tau"),
])
def test_o_standardize_bad_input(kwargs: dict, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        o_standardize(**kwargs)


@pytest.mark.parametrize(("h_dtype", "y_dtype"), [(torch.float32, torch.float32),
                                                  (torch.bfloat16, torch.bfloat16),
                                                  (torch.bfloat16, torch.float32)])
def test_o_residual_is_the_gated_residual_in_one_op(h_dtype, y_dtype) -> None:
    h, y, p = torch.randn(2, 3, 8).to(h_dtype), torch.randn(2, 3, 8).to(y_dtype), torch.rand(2, 3)
    p[0, 1] = 0
    got = o_residual(h, p, y)
    assert got.dtype == (h + o_gate(p, y)).dtype
    exact = h.double() + p.to(got.dtype).double()[..., None] * y.double()  # one rounding off
    ulp = 2.0 ** -8 if got.dtype == torch.bfloat16 else 2.0 ** -23
    assert ((got.double() - exact).abs() <= ulp * exact.abs()).all()
    assert torch.equal(got[0, 1], h[0, 1].to(got.dtype))                # a null token keeps h


def test_offn_compiles_without_graph_breaks() -> None:
    import torch._dynamo
    explained = torch._dynamo.explain(OFFN(nn.Linear(8, 8)))(torch.randn(2, 4, 8))
    assert explained.graph_break_count == 0 and explained.graph_count == 1
