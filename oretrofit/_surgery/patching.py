"""Reversible in-place surgery on module instances, invisible to ``state_dict``.

A patched module keeps its parameters, buffers and submodules; only its class is swapped for
an O-subclass of the original class, and per-site settings live in a plain instance attribute
(``module._oretrofit``), which ``state_dict`` never sees. Several sites may patch one module
(e.g. the attention, norm and FFN sites of a block): the class is swapped by the first and
restored by the last undo.

The O-subclasses are importable by name, so a patched module pickles (``torch.save``, ``pickle``,
``joblib.dump``, ``copy.deepcopy``): each is published here as ``O<Original>_<hex>``, the hex
naming ``module:qualname`` of the original class and the mixin, and this module's
``__getattr__`` rebuilds the class from that name in a fresh process (a module path that
moved since is found through :mod:`.moved`).

Undos are objects, not closures (:class:`SiteUndo`, :class:`UndoAll`, :class:`PopAttribute`,
:func:`noop`, a hook's ``RemovableHandle.remove``), so the undos of a retrofit that also adds
hooks and attributes pickle with the model (:func:`portable`), and a loaded copy can take its
retrofit off exactly as it was put on.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from torch import nn
from torch.utils.hooks import RemovableHandle

from .._operators.presence import EPS_RETROFIT

__all__ = ["SiteConfig", "Undo", "o_subclass", "set_site", "site_config", "SiteUndo", "UndoAll",
           "PopAttribute", "noop", "portable"]

Undo = Callable[[], None]
_SUBCLASSES: dict[tuple[type, type], type] = {}


@dataclass(frozen=True)
class SiteConfig:
    """What one patched site computes with: presence scale τ and attention stabiliser ε."""

    tau: float
    eps: float = EPS_RETROFIT


def _path(cls: type) -> str:
    return f"{cls.__module__}:{cls.__qualname__}"


def _import(path: str) -> type:
    module, _, qualname = path.partition(":")
    found: Any = importlib.import_module(module)
    for part in qualname.split("."):
        found = getattr(found, part)
    return found


def o_subclass(original: type, mixin: type) -> type:
    """``class O<Original>(mixin, original)``, created once and cached, so ``isinstance`` holds.

    Its ``__qualname__`` encodes both bases (see module docstring), so pickle finds it by name.
    """
    key = (original, mixin)
    if key not in _SUBCLASSES:
        name = f"O{original.__name__}"
        encoded = f"{name}_{f'{_path(original)}|{_path(mixin)}'.encode().hex()}"
        _SUBCLASSES[key] = type(name, (mixin, original),
                                {"__module__": __name__, "__qualname__": encoded})
    return _SUBCLASSES[key]


def __getattr__(name: str) -> type:
    """Rebuild a pickled O-subclass from its encoded name (module docstring)."""
    head, sep, code = name.rpartition("_")
    try:
        original, mixin = bytes.fromhex(code).decode().split("|")
        if not (sep and head.startswith("O")):
            raise ValueError(name)
        return o_subclass(_import(original), _import(mixin))
    except (ValueError, ImportError, AttributeError):
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}") from None


def set_site(module: nn.Module, mixin: type, key: str, config: Any) -> Undo:
    """Enable site ``key`` on ``module`` (swapping its class to ``o_subclass(cls, mixin)``).

    Returns the undo, which removes the key and restores the original class with the last key.
    """
    state = module.__dict__.get("_oretrofit")
    if state is None:
        original = type(module)
        state = {"original_class": original, "sites": {}}
        module.__class__ = o_subclass(original, mixin)
        module.__dict__["_oretrofit"] = state
    elif not issubclass(type(module), mixin):
        raise RuntimeError(f"{type(module).__name__} is already patched by another mixin")
    if key in state["sites"]:
        raise RuntimeError(f"site {key!r} is already patched on this module")
    state["sites"][key] = config
    return SiteUndo(module, key)


class SiteUndo:
    """The undo of :func:`set_site`: removes the key, and with the last key restores the class
    (unless the user has set another class since: that one stays)."""

    def __init__(self, module: nn.Module, key: str) -> None:
        self.module, self.key = module, key

    def __call__(self) -> None:
        state = self.module.__dict__["_oretrofit"]
        del state["sites"][self.key]
        if not state["sites"]:
            if _is_o_subclass(type(self.module), state["original_class"]):
                self.module.__class__ = state["original_class"]
            del self.module.__dict__["_oretrofit"]


def _is_o_subclass(cls: type, original: type) -> bool:
    """``cls`` is an O-subclass of ``original`` (:func:`o_subclass`)."""
    return cls.__module__ == __name__ and cls.__bases__[-1:] == (original,)


class UndoAll:
    """Several undos as one, run in reverse order."""

    def __init__(self, undos: Sequence[Undo]) -> None:
        self.undos = list(undos)

    def __call__(self) -> None:
        for undo in reversed(self.undos):
            undo()


class PopAttribute:
    """Undo of an attribute a site set on a module: removes ``key`` from its ``__dict__``."""

    def __init__(self, module: nn.Module, key: str) -> None:
        self.module, self.key = module, key

    def __call__(self) -> None:
        self.module.__dict__.pop(self.key, None)


def noop() -> None:
    """The undo of a site that changed nothing."""


def portable(undo: Undo) -> bool:
    """True when ``undo`` pickles with its model: one of this module's undos (an
    :class:`UndoAll` of portable undos), a hook handle's ``remove``, or a method of an object
    whose class says so (``portable_undo = True``)."""
    if isinstance(undo, UndoAll):
        return all(map(portable, undo.undos))
    if isinstance(undo, (SiteUndo, PopAttribute)) or undo is noop:
        return True
    owner = getattr(undo, "__self__", None)
    return isinstance(owner, RemovableHandle) or getattr(owner, "portable_undo", False)


def site_config(module: nn.Module, key: str) -> Any:
    """The config a site stored on ``module``, or None when that site is not patched."""
    state = module.__dict__.get("_oretrofit")
    return None if state is None else state["sites"].get(key)
