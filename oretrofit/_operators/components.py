"""Token-local O-components and presence-weighted standardisation (paper eqs. 15–21).

Every component reads p = ρτ(h) from the state entering it and is exactly zero-absorbing:
a zero carrier emits zero even when the wrapped module has biases or an affine transform.
τ defaults to ``TAU_MODULES`` = 1e-6, the paper's training setting; ``retrofit`` defaults to
``TAU_RETROFIT`` = 1e-8 because a pretrained host never saw the gate (see :mod:`.presence`).
"""

from __future__ import annotations

import torch
from torch import Tensor, nn

from .._kernels.dtypes import as_dtype, compute_dtype
from .presence import TAU_MODULES, check_positive, presence

__all__ = ["OFFN", "ONorm", "OInject", "OStandardize", "o_gate", "o_residual", "o_moments",
           "o_standardize"]


def o_gate(p: Tensor, y: Tensor) -> Tensor:
    """Gated branch G_O[F] = p_i · y_i (eq. 11): p ``(...)`` times y ``(..., d)``, in y's dtype."""
    return o_gate_column(p.unsqueeze(-1), y)


def o_gate_column(column: Tensor, y: Tensor) -> Tensor:
    """:func:`o_gate` with the presences given as the column ``(..., 1)`` it multiplies y
    ``(..., d)`` by (a hook that has it from the presence memo spares the view op)."""
    return as_dtype(column, y.dtype) * y


def o_residual(h: Tensor, p: Tensor, y: Tensor) -> Tensor:
    """Residual with a gated branch, ``h_i + p_i · y_i``, in one pass (``addcmul``: the gated
    branch is never stored). ``y`` broadcastable to ``h`` ``(..., d)``; p ``(...)``; the result in
    the promoted dtype of ``h`` and ``y``, as ``h + o_gate(p, y)``."""
    return torch.addcmul(h, p.to(torch.promote_types(h.dtype, y.dtype)).unsqueeze(-1),
                         y.expand_as(h))


class OFFN(nn.Module):
    """Residual lift of a feed-forward branch, eq. 15: ``h + ρτ(h) · FFN(h)``.

    ``ffn`` may contain biases and its own pre-norm: the branch still emits 0 at a null token.
    """

    def __init__(self, ffn: nn.Module, tau: float = TAU_MODULES) -> None:
        super().__init__()
        self.ffn, self.tau = ffn, check_positive("tau", tau)

    def forward(self, h: Tensor) -> Tensor:
        return o_residual(h, presence(h, self.tau), self.ffn(h))


class ONorm(nn.Module):
    """Gated token-local normalisation, eq. 16: ``ρτ(h) · Norm(h)`` (LayerNorm, RMSNorm, …)."""

    def __init__(self, norm: nn.Module, tau: float = TAU_MODULES) -> None:
        super().__init__()
        self.norm, self.tau = norm, check_positive("tau", tau)

    def forward(self, h: Tensor) -> Tensor:
        return o_gate(presence(h, self.tau), self.norm(h))


class OInject(nn.Module):
    """Gated additive metadata, eq. 17: ``h + ρτ(h) · e`` (position, schema or label encodings).

    Only the injected branch is gated; the carrier is kept.
    """

    def __init__(self, tau: float = TAU_MODULES) -> None:
        super().__init__()
        self.tau = check_positive("tau", tau)

    def forward(self, h: Tensor, e: Tensor) -> Tensor:
        return o_residual(h, presence(h, self.tau), e)


def o_moments(h: Tensor, p: Tensor, dim: int = 1) -> tuple[Tensor, Tensor, Tensor]:
    """Presence-weighted support S = Σ_i p_i, mean μ_O (eq. 18) and variance v_O (eq. 19).

        μ_O = Σ_i (p_i/S) h_i,    v_O = Σ_i (p_i/S) (h_i − μ_O)²

    The weights p_i/S are formed first, so a single active token has weight exactly 1 and is
    centred to an exact zero.

    Args:
        h: states ``(..., N, ..., d)`` with the token axis ``dim``; p: presences shaped like
           ``h`` without its last axis.
    Returns:
        ``(S, μ_O, v_O)`` reduced over ``dim`` (kept as size 1), in fp32/fp64. S = 0 gives μ = v = 0
        (a safe positive divisor followed by explicit zero selection, eq. 21).
    """
    ct = compute_dtype(h.dtype)
    hc, w = h.to(ct), p.to(ct).unsqueeze(-1)
    support = w.sum(dim=dim, keepdim=True)                                 # S, (…, 1, …, 1)
    active = support > 0
    w = w / torch.where(active, support, torch.ones_like(support))         # p_i / S, 0 when S = 0
    mean = (w * hc).sum(dim=dim, keepdim=True)
    var = (w * (hc - mean).square()).sum(dim=dim, keepdim=True)
    zero = torch.zeros((), dtype=ct, device=h.device)
    return support, torch.where(active, mean, zero), torch.where(active, var, zero)


def o_standardize(h: Tensor, tau: float, eps_var: float = 1e-6, dim: int = 1,
                  weight: Tensor | None = None, bias: Tensor | None = None) -> Tensor:
    """OStandardize, eq. 20: ``z_i = p_i [γ ⊙ (h_i − μ_O)/sqrt(v_O + ε_var) + β]``.

    Moments are presence-weighted across the token axis ``dim`` (per feature), so an inserted
    zero token changes neither S, μ_O nor v_O and receives 0; all-null or empty support gives 0.
    """
    check_positive("eps_var", eps_var)
    if h.dim() < 2:
        raise ValueError(f"h must have a token axis and a feature axis, got shape {tuple(h.shape)}")
    dim = dim % h.dim()
    if dim == h.dim() - 1:
        raise ValueError("dim is the token axis and must not be the last (feature) axis")
    p = presence(h, tau)
    _, mean, var = o_moments(h, p, dim)
    z = (h.to(mean.dtype) - mean) * torch.rsqrt(var + eps_var)
    if weight is not None:
        z = z * weight.to(z.dtype)
    if bias is not None:
        z = z + bias.to(z.dtype)
    return o_gate(p, z).to(h.dtype)


class OStandardize(nn.Module):
    """Module form of :func:`o_standardize` with an optional per-feature affine (γ, β)."""

    def __init__(self, num_features: int, tau: float = TAU_MODULES, eps_var: float = 1e-6, dim: int = 1,
                 affine: bool = True) -> None:
        super().__init__()
        self.tau, self.eps_var = check_positive("tau", tau), check_positive("eps_var", eps_var)
        self.dim = dim
        self.weight = nn.Parameter(torch.ones(num_features)) if affine else None
        self.bias = nn.Parameter(torch.zeros(num_features)) if affine else None

    def forward(self, h: Tensor) -> Tensor:
        return o_standardize(h, self.tau, self.eps_var, self.dim, self.weight, self.bias)
