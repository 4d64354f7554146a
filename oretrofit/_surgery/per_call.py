"""Per-call attributes: what one forward of a shared model holds between its hooks.

A retrofitted model's hooks hand each other per-call values (a carrier's presences captured by a
pre-hook and read by the attention, a branch's gate column). Kept as plain attributes of objects
shared by the model, two threads calling one model overwrite each other's values. A
:class:`PerCall` attribute keeps its value per thread, in a ``threading.local`` each instance of
a :class:`PerCallState` gets when it is made, so a thread's calls never see another's.

Compiled calls use the same store: ``torch.compile`` traces reads and writes of the values (a
plain object the ``threading.local`` holds), replays the writes in the calling thread and guards
on what it read there, so a compiled model shared by threads keeps each call's values to its
thread, as the eager one does, and a call split across compiled and eager frames (a graph
break, a frame past the recompile limit) reads what its other frames wrote. The store is made with the instance, never
inside a traced call (one made there would not be the one later calls read).
"""

from __future__ import annotations

import threading
from typing import Any

__all__ = ["PerCall", "PerCallState", "settings"]

_SLOT = "_per_call_values"


class _Calls:
    """One thread's per-call values of one object, as its attributes."""


class _Values(threading.local):
    """One object's per-call values, one :class:`_Calls` per thread; a copy or a pickle starts
    empty (the values belong to calls, not to the model). The values are attributes of that
    plain object, not of the ``threading.local``: a compiled frame that ends at a graph break
    hands its writes to a plain object on to the frames after it, and drops those to a
    ``threading.local``'s own attributes."""

    def __init__(self) -> None:
        self.calls = _Calls()

    def __reduce__(self) -> tuple:
        return (_Values, ())


class PerCallState:
    """Base of a class with :class:`PerCall` attributes: each instance gets its per-thread store
    when made (module docstring); a copy or a pickle holds its settings, never a call's values."""

    def __new__(cls, *args: Any, **kwargs: Any) -> "PerCallState":
        made = super().__new__(cls)
        made.__dict__[_SLOT] = _Values()
        return made

    def __getstate__(self) -> dict[str, Any]:
        return settings(self)

    def __setstate__(self, state: dict[str, Any]) -> None:
        """Settings back; the store too where the loader skipped ``__new__`` (a pickle of
        protocol 0 or 1, or one written before the store came with the instance)."""
        self.__dict__.update(state)
        self.__dict__.setdefault(_SLOT, _Values())


class PerCall:
    """Data descriptor of an attribute whose value belongs to the current call (module
    docstring); ``default`` is its value before a call sets it."""

    def __init__(self, default: Any = None) -> None:
        self.default = default

    def __set_name__(self, owner: type, name: str) -> None:
        if not issubclass(owner, PerCallState):
            raise TypeError(f"{owner.__name__}.{name}: a PerCall attribute belongs to a "
                            "PerCallState subclass (its instances hold the per-thread store)")
        self.name = name

    def __get__(self, obj: Any, owner: type | None = None) -> Any:
        if obj is None:
            return self
        return getattr(obj.__dict__[_SLOT].calls, self.name, self.default)

    def __set__(self, obj: Any, value: Any) -> None:
        setattr(obj.__dict__[_SLOT].calls, self.name, value)


def settings(obj: Any) -> dict[str, Any]:
    """``obj``'s state without its per-call values (what :class:`PerCallState` pickles)."""
    per_call = {name for klass in type(obj).__mro__ for name, value in vars(klass).items()
                if isinstance(value, PerCall)}
    return {k: v for k, v in obj.__dict__.items() if k != _SLOT and k not in per_call}
