"""Which modules of a transformers model run code of their own in place of a class the host
knows: a class defined outside transformers (the user's, or a model's remote code) that
subclasses a transformers class and redefines one of its methods.

The release gate vouches for transformers' own modeling code as its tested releases ship it, not
for a subclass's: a ``LlamaModel`` subclass whose ``forward`` adds a learned bias to every token
makes zero tokens non-zero carriers, which no site can see. Such a model goes through the
self-check (:mod:`.selfcheck`) on every release. Every method of a transformers class counts,
except those no forward call runs (:data:`NOT_RUN_BY_FORWARD`: construction, weight
initialisation, saving and loading), so a subclass that only adds a helper method, or
overrides ``__init__`` to build its modules, is trusted as its base class is.
"""

from __future__ import annotations

import hashlib
import marshal
from dataclasses import dataclass
from types import FunctionType
from typing import Any

from torch import nn

from .backbones import pretrained_models
from .boundary import join

__all__ = ["Override", "NOT_RUN_BY_FORWARD", "overrides", "within", "code_digest"]

NOT_RUN_BY_FORWARD = frozenset({
    "__init__", "__init_subclass__", "__repr__", "extra_repr", "_init_weights", "init_weights",
    "post_init", "_from_config", "from_pretrained", "save_pretrained", "push_to_hub"})
# libraries whose classes are not the user's code: transformers is the code the gate vouches for,
# torch's classes are what it builds on, oretrofit's own are its patches
_LIBRARIES = ("transformers", "torch", "builtins", "oretrofit")


@dataclass(frozen=True)
class Override:
    """``cls`` (first found at module ``path``) subclasses transformers' ``known`` and redefines
    ``methods`` of it."""

    path: str
    cls: type
    known: type
    methods: tuple[str, ...]

    def describe(self) -> str:
        """E.g. ``BiasedLlama (at the model's root, a subclass of transformers' LlamaModel)
        overrides forward``."""
        where = f"at {self.path}" if self.path else "the model itself"
        return (f"{self.cls.__name__} ({where}, a subclass of transformers' "
                f"{self.known.__name__}) overrides {', '.join(self.methods)}")


def _library(cls: type) -> bool:
    return cls.__module__.split(".")[0] in _LIBRARIES


def _own_classes(cls: type) -> list[type]:
    """The classes of ``cls``'s MRO that are no library's (:data:`_LIBRARIES`)."""
    return [c for c in cls.__mro__ if not _library(c)]


def _behaviour(value: Any) -> bool:
    """A method, of any kind (a class attribute holding a class, e.g. ``config_class``, is not)."""
    return isinstance(value, (FunctionType, classmethod, staticmethod, property))


def _overridden(cls: type) -> tuple[type, tuple[str, ...]] | None:
    """The first transformers class in ``cls``'s MRO and the methods of the transformers classes
    there that ``cls``'s own classes redefine (None: ``cls`` is no subclass of a transformers
    class, or redefines none of those methods)."""
    known = [c for c in cls.__mro__ if c.__module__.split(".")[0] == "transformers"]
    own = _own_classes(cls)
    if not known or not own:
        return None
    library = {n for c in known for n, v in vars(c).items() if _behaviour(v)}
    methods = sorted({n for c in own for n, v in vars(c).items()
                      if _behaviour(v) and n in library and n not in NOT_RUN_BY_FORWARD})
    return (known[0], tuple(methods)) if methods else None


def overrides(model: nn.Module) -> list[Override]:
    """Every class in ``model``'s transformers models that overrides a method of the
    transformers class it subclasses, once per class, at the first path it is found."""
    found: dict[type, Override | None] = {}
    for prefix, pretrained in pretrained_models(model):
        for name, module in pretrained.named_modules():
            cls = type(module)
            if cls not in found:
                overridden = _overridden(cls)
                found[cls] = (None if overridden is None
                              else Override(join(prefix, name), cls, *overridden))
    return [o for o in found.values() if o is not None]


def within(path: str, prefix: str) -> bool:
    """Whether module ``path`` lies in the subtree at ``prefix`` ('' being the root)."""
    return not prefix or path == prefix or path.startswith(prefix + ".")


def _code(value: Any) -> list[Any]:
    function = value.fget if isinstance(value, property) else getattr(value, "__func__", value)
    code = getattr(function, "__code__", None)
    return [] if code is None else [code]


def code_digest(found: list[Override]) -> str:
    """A digest of the code of every own class of ``found`` (all their methods, overriding or
    not): a self-check record of a subclass holds for that code only."""
    classes = {c: None for o in found for c in _own_classes(o.cls)}
    digest = hashlib.sha256()
    for cls in classes:
        digest.update(f"{cls.__module__}.{cls.__qualname__}".encode())
        for name, value in sorted(vars(cls).items()):
            for code in _code(value):
                digest.update(name.encode() + marshal.dumps(code))
    return digest.hexdigest()[:16]
