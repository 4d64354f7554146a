"""Token presence ρτ(h) = ‖h‖² / (τ + ‖h‖²)  (paper eq. 3, eq. 9).

One presence per token carrier: it gates what the token emits and weights the mass the
token contributes to anything shared between tokens.
"""

from __future__ import annotations

import contextlib
import math
from contextlib import contextmanager
from contextvars import ContextVar
from typing import Any, Callable, Iterator

import torch
from torch import Tensor

from .._kernels.dtypes import compute_dtype, number_like

__all__ = ["presence", "observe_presence", "observe_carrier_norms", "observe_carrier_norms_by_tau",
           "check_positive", "check_eps",
           "TAU_MODULES", "TAU_RETROFIT", "EPS_MODULES", "EPS_RETROFIT"]

# The two default presence scales. Two values on purpose, one per use, each the paper's:
# TAU_MODULES (1e-6) is the default of the O-modules a model is built and trained with
# (OFFN, ONorm, OInject, OStandardize, the OAttention modules, OTransformerBlock; the paper's
# learned-model studies, B.2-B.6). Training learns the carriers' scale with the gate in place,
# so τ only has to sit well below an active token's ‖h‖².
TAU_MODULES = 1e-6
# TAU_RETROFIT (1e-8) is the default of `retrofit` / `plan_retrofit` / `retrofitted` (and of
# `oretrofit patch` and `regress`): a pretrained host never saw the gate, so τ → 0 keeps every
# active carrier's ρτ(h) = ‖h‖²/(τ+‖h‖²) at 1 up to round-off and the O arms equal the host
# (the paper's Table 2 is at τ = 1e-8; Table 7 shows what τ = 1 does).
TAU_RETROFIT = 1e-8
# The two default OAttention ε_den (eq. 7), one per use like τ. EPS_MODULES (1e-6) is the paper's,
# for the O-modules trained with the gate. EPS_RETROFIT (0) is the limit ε_den → 0⁺ of eq. 8, for a
# pretrained host: an absolute ε competes with Σ_j p_j e^{s_ij}, and a pretrained softmax never cared
# about its logits' level (SmolLM2 has heads whose row maximum sits near −20, where ε = 1e-6 outweighs
# the whole row and silences the head). In the limit an active row is the host's softmax exactly and
# an empty one is totalised to exact zeros (docs/operators.md, "The ε sink of a retrofit").
EPS_MODULES = 1e-6
EPS_RETROFIT = 0.0

Observer = Callable[[Tensor], None]
TauObserver = Callable[[Tensor, float], None]
# Observers called with every presence ρ (see observe_presence) and every carrier's squared norm
# ‖h‖² with the τ its presence is computed at (see observe_carrier_norms_by_tau) while they are
# active.
_OBSERVERS: ContextVar[tuple[Observer, ...]] = ContextVar("presence_observers", default=())
_NORM_OBSERVERS: ContextVar[tuple[TauObserver, ...]] = ContextVar("carrier_norm_observers",
                                                                  default=())
# How many observers are active in any thread: a plain int that torch.compile reads as a guarded
# constant, so presence() only looks the (thread-local) observers up while some exist (a ContextVar
# lookup is a graph break).
_ACTIVE_OBSERVERS = 0


@contextmanager
def _observing(observers: ContextVar[tuple[Any, ...]], observer: Any) -> Iterator[None]:
    global _ACTIVE_OBSERVERS
    token = observers.set(observers.get() + (observer,))
    _ACTIVE_OBSERVERS += 1
    try:
        yield
    finally:
        _ACTIVE_OBSERVERS -= 1
        observers.reset(token)


def _notify_observers(sq: Tensor, p: Tensor, tau: float) -> None:
    """Hand ``‖h‖²`` (with ``τ``) and ``ρ`` (detached) to this context's observers."""
    for observer in _NORM_OBSERVERS.get():
        observer(sq.detach(), tau)
    for observer in _OBSERVERS.get():
        observer(p.detach())


def observe_presence(observer: Observer) -> contextlib.AbstractContextManager[None]:
    """Call ``observer(p)`` with every presence tensor (detached) computed inside the block.

    This is how a run measures how strongly τ gates a host's tokens (e.g. a
    :class:`~oretrofit.PresenceProfile`); observers nest and are local to the thread/context.
    """
    return _observing(_OBSERVERS, observer)


def observe_carrier_norms(observer: Observer) -> contextlib.AbstractContextManager[None]:
    """Call ``observer(sq)`` with the squared norms ‖h‖² ``(...)`` (detached) of every carrier
    whose presence is computed inside the block."""
    return _observing(_NORM_OBSERVERS, lambda sq, tau: observer(sq))


def observe_carrier_norms_by_tau(observer: TauObserver) -> contextlib.AbstractContextManager[None]:
    """Call ``observer(sq, tau)`` with the squared norms ‖h‖² (detached) of every carrier whose
    presence is computed inside the block and the τ it is computed at: :func:`oretrofit.calibrate`
    gives each site its own probe τ and so tells, in one forward, whose carriers these are."""
    return _observing(_NORM_OBSERVERS, observer)


def _finite_number(name: str, value: float, what: str, allowed: Callable[[float], bool],
                   example: str) -> float:
    """``value`` as float if it is a finite number that ``allowed`` accepts, else a ValueError
    saying it must be ``what`` (``True``/``False`` are refused: a flag is not a number)."""
    if isinstance(value, bool):
        raise ValueError(f"{name} must be {what}, got {value!r} (a bool)")
    try:
        value = float(value)
    except (TypeError, ValueError):
        raise ValueError(f"{name} must be {what}, got {value!r}") from None
    if not (math.isfinite(value) and allowed(value)):
        raise ValueError(f"{name} must be {what} ({example}), got {value!r}")
    return value


def check_positive(name: str, value: float) -> float:
    """Return ``value`` as float if it is a finite number > 0, else raise a ValueError naming it."""
    return _finite_number(name, value, "a positive finite number", lambda v: v > 0.0,
                          f"e.g. {name}=1e-6")


def check_eps(value: float, name: str = "eps") -> float:
    """Return OAttention's ``ε`` as float if it is a finite number ≥ 0, else raise a ValueError
    naming it; ``0`` is the limit ε → 0⁺ (:data:`EPS_RETROFIT`)."""
    return _finite_number(name, value, "a finite number ≥ 0", lambda v: v >= 0.0,
                          "0, the default of a retrofit, is the limit ε → 0⁺; the paper's "
                          "modules use 1e-6")


def presence(h: Tensor, tau: float, keepdim: bool = False) -> Tensor:
    """ρτ(h) = ‖h‖² / (τ + ‖h‖²) over the last axis.

    Args:
        h: carriers ``(..., d)``.
        tau: scale τ > 0; τ → 0 sends every non-zero carrier to presence 1.
        keepdim: keep the feature axis, as size 1: ``(..., 1)``, the column a gate multiplies
            ``(..., d)`` by (the same numbers).

    Returns:
        ``(...)`` presences in [0, 1), computed in fp32 (fp64 when ``h`` is fp64).
        Exactly 0 only where ``h`` is exactly 0; the gradient at a zero carrier is finite (0).
        fp32/fp64 carriers: the sum of squares directly. Half-precision carriers: the norm
        accumulated in fp32 by one reduction (``vector_norm(h, dtype=float32)``), squared; no
        fp32 copy of ``h``.
        A NaN or inf in a carrier gives a NaN presence for that token: non-finite carriers are
        not silently treated as null.
    """
    tau = check_positive("tau", tau)
    if not torch.is_tensor(h) or h.dim() < 1:
        raise ValueError("h must be a tensor of carriers with the feature axis last, shape (..., d)")
    ct = compute_dtype(h.dtype)
    if h.dtype == ct:
        sq = (h * h).sum(dim=-1, keepdim=keepdim)
    else:
        sq = torch.linalg.vector_norm(h, dim=-1, keepdim=keepdim, dtype=ct).square()
    p = sq / (sq + number_like(tau, sq))
    if _ACTIVE_OBSERVERS:                             # observers see (...) either way
        _notify_observers(*((sq[..., 0], p[..., 0]) if keepdim else (sq, p)), tau)
    return p
