"""Per-call attributes: what one forward of a shared model holds between its hooks.

A retrofitted model's hooks hand each other per-call values (a carrier's presences captured by a
pre-hook and read by the attention, a branch's gate column). Kept as plain attributes of objects
shared by the model, two threads calling one model overwrite each other's values. A
:class:`PerCall` attribute keeps its value per thread (a ``threading.local``, so a thread's calls
never see another's), while ``torch.compile`` traces on the object itself, as Dynamo handles
plain attributes without a graph break; a compiled model shared by threads is as safe as
the compiled host function is.
"""

from __future__ import annotations

import threading
from typing import Any

import torch

__all__ = ["PerCall", "settings"]

_SLOT = "_per_call_values"


class _Values(threading.local):
    """One object's per-call values, one set per thread; a copy or a pickle starts empty
    (the values belong to calls, not to the model)."""

    def __reduce__(self) -> tuple:
        return (_Values, ())


class PerCall:
    """Data descriptor of an attribute whose value belongs to the current call (module
    docstring); ``default`` is its value before a call sets it."""

    def __init__(self, default: Any = None) -> None:
        self.default = default

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self
        if torch.compiler.is_compiling():
            return obj.__dict__.get(self.name, self.default)
        return getattr(_values(obj), self.name, self.default)

    def __set__(self, obj: Any, value: Any) -> None:
        if torch.compiler.is_compiling():
            obj.__dict__[self.name] = value
        else:
            setattr(_values(obj), self.name, value)


def _values(obj: Any) -> _Values:
    """``obj``'s per-thread values, made at first use (``setdefault`` is atomic: two threads
    racing to make them keep one)."""
    values = obj.__dict__.get(_SLOT)
    return values if values is not None else obj.__dict__.setdefault(_SLOT, _Values())


def settings(obj: Any) -> dict[str, Any]:
    """``obj``'s state without its per-call values (what its ``__getstate__`` pickles)."""
    per_call = {name for klass in type(obj).__mro__ for name, value in vars(klass).items()
                if isinstance(value, PerCall)}
    return {k: v for k, v in obj.__dict__.items() if k != _SLOT and k not in per_call}
