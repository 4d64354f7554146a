"""The ``__getattr__`` and ``__dir__`` of a facade whose public names are imported on first use
(PEP 562), so that importing the facade imports neither torch nor a vendor package: the package
root, ``oretrofit.transformers`` and ``oretrofit.mitra`` share it. Imports the standard library
only."""

from __future__ import annotations

import importlib
from typing import Any, Callable

__all__ = ["lazy_attributes"]


def lazy_attributes(namespace: dict[str, Any], homes: dict[str, tuple[str, str]],
                    submodules: tuple[str, ...] = ()
                    ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The ``__getattr__`` and ``__dir__`` of the module whose globals are ``namespace``.

    ``homes`` maps a public name to (its home module, relative to that module, and its name
    there); a name is imported the first time it is asked for, then kept in ``namespace``.
    ``submodules``: the module's subpackages imported the first time they are asked for (so
    ``import oretrofit; oretrofit.transformers.check`` needs no second import).
    """
    module = namespace["__name__"]

    def __getattr__(name: str) -> Any:
        if name in submodules:
            return importlib.import_module(f"{module}.{name}")
        if name not in homes:
            raise AttributeError(f"module {module!r} has no attribute {name!r}")
        home, attribute = homes[name]
        value = getattr(importlib.import_module(home, module), attribute)
        namespace[name] = value
        return value

    def __dir__() -> list[str]:
        return sorted({*namespace, *homes, *submodules})

    return __getattr__, __dir__
