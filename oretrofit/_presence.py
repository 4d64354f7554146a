"""Token presence ρτ(h) = ‖h‖² / (τ + ‖h‖²)  (paper eq. 3, eq. 9).

One presence per token carrier: it gates what the token emits and weights the mass the
token contributes to anything shared between tokens.
"""

from __future__ import annotations

import math
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Callable, Iterator

import torch
from torch import Tensor

__all__ = ["presence", "observe_presence", "compute_dtype", "check_positive"]

# Observers called with every presence tensor computed while they are active (see observe_presence).
_OBSERVERS: ContextVar[tuple[Callable[[Tensor], None], ...]] = ContextVar("presence_observers",
                                                                          default=())


@contextmanager
def observe_presence(observer: Callable[[Tensor], None]) -> Iterator[None]:
    """Call ``observer(p)`` with every presence tensor (detached) computed inside the block.

    This is how a run measures how strongly τ gates a host's tokens (e.g. a
    :class:`~oretrofit.PresenceProfile`); observers nest and are local to the thread/context.
    """
    token = _OBSERVERS.set(_OBSERVERS.get() + (observer,))
    try:
        yield
    finally:
        _OBSERVERS.reset(token)


def check_positive(name: str, value: float) -> float:
    """Return ``value`` as float if it is a finite number > 0, else raise a ValueError naming it
    (``True``/``False`` are refused: a flag is not a number)."""
    if isinstance(value, bool):
        raise ValueError(f"{name} must be a positive finite number, got {value!r} (a bool)")
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be a positive finite number, got {value!r}") from None
    if not math.isfinite(value) or value <= 0.0:
        raise ValueError(f"{name} must be a positive finite number (e.g. {name}=1e-6), got {value!r}")
    return value


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """Precision the O-operators compute in: fp64 stays fp64, everything else is fp32."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def presence(h: Tensor, tau: float) -> Tensor:
    """ρτ(h) = ‖h‖² / (τ + ‖h‖²) over the last axis.

    Args:
        h: carriers ``(..., d)``.
        tau: scale τ > 0; τ → 0 sends every non-zero carrier to presence 1.

    Returns:
        ``(...)`` presences in [0, 1), computed in fp32 (fp64 when ``h`` is fp64).
        Exactly 0 only where ``h`` is exactly 0. The sum of squares is taken directly (not
        ``norm(h)**2``), so the gradient at a zero carrier is finite (it is 0).
        A NaN or inf in a carrier gives a NaN presence for that token: non-finite carriers are
        not silently treated as null.
    """
    tau = check_positive("tau", tau)
    if not torch.is_tensor(h) or h.dim() < 1:
        raise ValueError("h must be a tensor of carriers with the feature axis last, shape (..., d)")
    sq = h.to(compute_dtype(h.dtype)).square().sum(dim=-1)
    p = sq / (tau + sq)
    for observer in _OBSERVERS.get():
        observer(p.detach())
    return p
