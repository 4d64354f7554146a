"""presence(h, tau) = ‖h‖²/(τ+‖h‖²): exact zero only at zero, finite gradients, dtypes, errors."""

import pytest
import torch

from oretrofit import observe_carrier_norms, presence
from oretrofit._operators.presence import observe_carrier_norms_by_tau


def test_formula_over_last_axis() -> None:
    h = torch.randn(2, 3, 5, dtype=torch.float64)
    sq = (h * h).sum(-1)
    assert torch.allclose(presence(h, 0.5), sq / (0.5 + sq), rtol=1e-15, atol=0)


def test_exactly_zero_only_at_zero() -> None:
    h = torch.tensor([[0.0, 0.0], [1e-15, 0.0], [0.0, -3.0]])
    p = presence(h, 1e-6)
    assert p[0].item() == 0.0
    assert (p[1:] > 0).all()
    assert (p < 1).all()


def test_gradient_at_zero_is_finite_zero() -> None:
    h = torch.zeros(4, 3, dtype=torch.float64, requires_grad=True)
    presence(h, 1.0).sum().backward()
    assert torch.equal(h.grad, torch.zeros_like(h))
    x = torch.randn(3, 4, dtype=torch.float64)
    x[1] = 0.0
    assert torch.autograd.gradcheck(lambda t: presence(t, 0.7), (x.requires_grad_(),))


@pytest.mark.parametrize("dtype, expected", [(torch.float16, torch.float32),
                                             (torch.bfloat16, torch.float32),
                                             (torch.float32, torch.float32),
                                             (torch.float64, torch.float64)])
def test_computes_in_fp32_or_fp64(dtype: torch.dtype, expected: torch.dtype) -> None:
    h = torch.full((2, 8), 300.0, dtype=dtype)       # ‖h‖² = 720000 overflows fp16 if squared in fp16
    p = presence(h, 1e6)
    assert p.dtype == expected
    assert torch.allclose(p, torch.full((2,), 0.72 / 1.72, dtype=expected), rtol=1e-6)


def test_limits_in_tau() -> None:
    h = torch.randn(10, 4, dtype=torch.float64)
    assert torch.allclose(presence(h, 1e-12), torch.ones(10, dtype=torch.float64), atol=1e-10)
    small = 1e-4 * h
    sq = (small * small).sum(-1)
    assert torch.allclose(presence(small, 1.0), sq, rtol=1e-7)        # ρ ≈ ‖h‖²/τ near the origin


def test_non_finite_carriers_give_nan_presence() -> None:
    h = torch.tensor([[float("nan"), 1.0], [float("inf"), 0.0], [1.0, 1.0]])
    p = presence(h, 1e-6)
    assert torch.isnan(p[:2]).all()
    assert torch.isfinite(p[2])


@pytest.mark.parametrize("tau", [0.0, -1.0, float("nan"), float("inf"), "x"])
def test_bad_tau_names_the_argument(tau: object) -> None:
    with pytest.raises(ValueError, match="tau"):
        presence(torch.ones(2, 3), tau)


def test_scalar_carrier_is_rejected() -> None:
    with pytest.raises(ValueError, match="h must be"):
        presence(torch.tensor(1.0), 1.0)


def test_half_precision_norm_is_accumulated_in_fp32_without_an_fp32_copy(monkeypatch) -> None:
    h = torch.randn(3, 5, 64).to(torch.bfloat16)
    h[0, 1] = 0
    upcasts = []
    original = torch.Tensor.to
    monkeypatch.setattr(torch.Tensor, "to", lambda self, *a, **k: upcasts.append(a) or original(self, *a, **k))
    p = presence(h, 1e-3)
    monkeypatch.undo()
    sq = h.double().square().sum(-1)
    assert upcasts == [] and p.dtype == torch.float32 and p[0, 1] == 0
    assert torch.allclose(p.double(), sq / (1e-3 + sq), rtol=1e-6, atol=0)


def test_presence_compiles_without_graph_breaks() -> None:
    import torch._dynamo
    explained = torch._dynamo.explain(lambda h: presence(h, 1e-8))(torch.randn(2, 4, 8))
    assert explained.graph_break_count == 0 and explained.graph_count == 1


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_keepdim_gives_the_same_presences_as_a_column(dtype: torch.dtype) -> None:
    from oretrofit import observe_presence
    h = torch.randn(3, 4, 33).to(dtype)
    h[0, 1] = 0.0
    seen: list[torch.Tensor] = []
    with observe_presence(seen.append):
        column = presence(h, 1e-2, keepdim=True)
    assert column.shape == (3, 4, 1)
    assert torch.equal(column[..., 0], presence(h, 1e-2))
    assert seen[0].shape == (3, 4)                  # observers see (...) presences either way


def test_carrier_norm_observers_see_each_norm_with_its_tau() -> None:
    h = torch.tensor([[3.0, 4.0], [0.0, 0.0]])
    by_tau, plain = [], []
    with observe_carrier_norms_by_tau(lambda sq, tau: by_tau.append((sq.tolist(), tau))), \
            observe_carrier_norms(lambda sq: plain.append(sq.tolist())):
        presence(h, 2e-30)
        presence(h[:1], 0.5, keepdim=True)
    assert by_tau == [([25.0, 0.0], 2e-30), ([25.0], 0.5)]
    assert plain == [[25.0, 0.0], [25.0]]
