"""ρτ of a carrier computed once when several hooks of a forward gate by the same tensor.

In a pre-norm layer under ``full-o`` the norm in front of the attention and the attention's
capture read the same carrier (the layer input), and the norm in front of the MLP and the FFN
gate read the same stream: :func:`carrier_presence` returns the presence the first of them
computed instead of computing it again. It keeps both forms the hooks ask for, the ``(...)``
presences (the attention's capture) and the ``(..., 1)`` column a gate multiplies the features by
(norms and FFN gates), each made once per carrier (the second as a view of the first).

A memo entry is used only for the very tensor it was computed from, unchanged: it holds a weak
reference to the carrier (a freed tensor whose ``id`` is reused misses) and the carrier's version
counter (an in-place change, ``h.add_(…)`` or ``h[0] = 0``, misses). It is not used where that
cannot be told or where sharing would change what a caller sees, and :func:`presence` runs as
before:

* inference tensors keep no version counter, and neither does what ``torch.inference_mode``
  computes;
* under autograd (a carrier that requires grad) a kept presence would keep the graph alive;
* presence and norm observers (:func:`oretrofit.observe_presence`, :func:`oretrofit.calibrate`)
  count every computation;
* while ``torch.compile`` traces, the compiler shares equal subexpressions itself.
"""

from __future__ import annotations

import threading
import weakref

import torch
from torch import Tensor

from . import presence as _presence
from .presence import _NORM_OBSERVERS, _OBSERVERS, presence

__all__ = ["carrier_presence"]

# A handful of carriers are live at once in a forward (the layer input, the stream before the
# MLP): the memo keeps the most recent few, per thread, by the carrier's id and τ.
_SIZE = 4


class _Entry:
    """ρτ ``p`` of ``carrier`` at ``tau`` as computed, with both tensors' versions then, and its
    forms asked for so far (``forms[False]`` ``(...)``, ``forms[True]`` the column ``(..., 1)``;
    the other form is a view of ``p``, so it shares its version counter)."""

    __slots__ = ("carrier", "version", "tau", "p", "p_version", "forms")

    def __init__(self, carrier: Tensor, tau: float, p: Tensor, column: bool) -> None:
        self.carrier = weakref.ref(carrier)
        self.version, self.tau, self.p, self.p_version = carrier._version, tau, p, p._version
        self.forms = {column: p}

    def holds(self, carrier: Tensor, tau: float) -> bool:
        """Whether this entry is ρτ of ``carrier`` as it is now (and its presences as computed)."""
        return (self.carrier() is carrier and self.version == carrier._version
                and self.tau == tau and self.p_version == self.p._version)

    def form(self, column: bool) -> Tensor:
        """The presences as ``(...)`` or as the column ``(..., 1)``."""
        p = self.forms.get(column)
        if p is None:
            p = self.forms[column] = self.p.unsqueeze(-1) if column else self.p.squeeze(-1)
        return p


_LOCAL = threading.local()


def _entries() -> dict[tuple[int, float], _Entry]:
    """This thread's entries by ``(id(carrier), tau)``, oldest first."""
    entries = getattr(_LOCAL, "entries", None)
    if entries is None:
        entries = _LOCAL.entries = {}
    return entries


def _memoizable(h: Tensor) -> bool:
    return (not torch.compiler.is_compiling()          # first: what follows breaks a graph
            and torch.is_tensor(h) and not h.is_inference()
            and not torch.is_inference_mode_enabled()   # its results keep no version either
            and not (h.requires_grad and torch.is_grad_enabled())
            and not (_presence._ACTIVE_OBSERVERS
                     and (_OBSERVERS.get() or _NORM_OBSERVERS.get())))


def carrier_presence(h: Tensor, tau: float, column: bool = False) -> Tensor:
    """ρτ(h) as :func:`oretrofit._operators.presence.presence` computes it (``(...)``, or with ``column``
    the column ``(..., 1)``), shared with the hooks that read the same unchanged carrier ``h`` at
    the same ``tau`` (module docstring)."""
    if not _memoizable(h):
        return presence(h, tau, keepdim=column)
    entries, key = _entries(), (id(h), tau)
    entry = entries.get(key)
    if entry is not None and entry.holds(h, tau):
        return entry.form(column)
    p = presence(h, tau, keepdim=column)
    entries.pop(key, None)              # a stale entry (a freed tensor's id, or h changed since)
    entries[key] = _Entry(h, tau, p, column)
    if len(entries) > _SIZE:
        del entries[next(iter(entries))]
    return p
