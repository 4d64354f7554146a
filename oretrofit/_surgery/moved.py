"""Where moved names live now, so a pickle written before a move still loads.

A pickle names every class by its module path (an O-class names its bases inside its own name:
:mod:`.patching`). :data:`MOVED` maps each old module path, or an old ``module:name``, to the
module that holds it now. :func:`install` puts a finder first on ``sys.meta_path`` that answers
an import of an old module path with an alias module reading its attributes from the new one
(and an old package with an empty one); a module that still exists but lost a name reads it
back through :func:`moved_attribute` in its ``__getattr__``.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
from types import ModuleType
from typing import Any

__all__ = ["MOVED", "install", "moved_attribute"]

_HOSTS = "oretrofit.hosts"
_TRANSFORMERS = "oretrofit.hosts.transformers"
MOVED: dict[str, str] = {
    # the hosts, before each had a folder under oretrofit/hosts/
    "oretrofit.patches.torch_nn": f"{_HOSTS}.torch_nn",
    "oretrofit.patches.tabpfn_v3": f"{_HOSTS}.tabpfn.v3",
    "oretrofit.patches.tabpfn_v3_blocks": f"{_HOSTS}.tabpfn.v3_blocks",
    "oretrofit.patches.transformers_common": f"{_TRANSFORMERS}.releases",
    "oretrofit.patches.transformers_host": f"{_TRANSFORMERS}.host",
    # the transformers host's presence capture and gates, once in its releases module
    f"{_TRANSFORMERS}.releases:CarrierPresence": f"{_TRANSFORMERS}.capture",
    f"{_TRANSFORMERS}.releases:OGatedBias": f"{_TRANSFORMERS}.gates",
    f"{_TRANSFORMERS}.releases:_BranchGate": f"{_TRANSFORMERS}.gates",
    f"{_TRANSFORMERS}.releases:_TableGate": f"{_TRANSFORMERS}.gates",
    # the transformers host's attention-interface route, named as its other routes are
    f"{_TRANSFORMERS}.attention": f"{_TRANSFORMERS}.interface_route",
    # the core, before its four packages (oretrofit._files, the reader, is now the package of
    # that name and its reader oretrofit._files.reading: no stored pickle names its one class,
    # the FileRefused error)
    "oretrofit._presence": "oretrofit._operators.presence",
    "oretrofit._presence_memo": "oretrofit._operators.presence_memo",
    "oretrofit._presence_profile": "oretrofit._operators.presence_profile",
    "oretrofit._attention": "oretrofit._operators.attention",
    "oretrofit._attention_modules": "oretrofit._operators.attention_modules",
    "oretrofit._components": "oretrofit._operators.components",
    "oretrofit._transformer": "oretrofit._operators.transformer",
    "oretrofit._attention_kernels": "oretrofit._kernels.lse",
    "oretrofit._attention_route": "oretrofit._kernels.routes",
    "oretrofit._attention_cudnn": "oretrofit._kernels.cudnn",
    "oretrofit._attention_flex": "oretrofit._kernels.flex",
    "oretrofit._attention_triton": "oretrofit._kernels.triton",
    "oretrofit._registry": "oretrofit._surgery.registry",
    "oretrofit._host": "oretrofit._surgery.host",
    "oretrofit._compose": "oretrofit._surgery.compose",
    "oretrofit._patching": "oretrofit._surgery.patching",
    "oretrofit._serialize": "oretrofit._surgery.serialize",
    "oretrofit._calibrate": "oretrofit._surgery.calibrate",
    "oretrofit._atomic": "oretrofit._files.atomic",
    "oretrofit._provenance": "oretrofit._files.provenance",
    "oretrofit._json_numbers": "oretrofit._files.json_numbers",
    "oretrofit._markdown": "oretrofit._files.markdown",
}


def _ancestors(module: str) -> set[str]:
    parts = module.split(".")
    return {".".join(parts[:n]) for n in range(1, len(parts))}


def moved_attribute(module: str, name: str) -> Any:
    """``name`` of ``module`` read from where :data:`MOVED` says it lives now; AttributeError
    (as a module's ``__getattr__`` raises it) where it did not move."""
    home = MOVED.get(f"{module}:{name}")
    if home is None:
        raise AttributeError(f"module {module!r} has no attribute {name!r}")
    return getattr(importlib.import_module(home), name)


class _AliasFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports an old module path of :data:`MOVED` as an alias of its new module, and an old
    package that no longer exists (``oretrofit.patches``) as an empty one."""

    def __init__(self) -> None:
        self.aliases = {old: new for old, new in MOVED.items() if ":" not in old}
        self.packages = (set().union(*map(_ancestors, self.aliases))
                         - set().union(*map(_ancestors, self.aliases.values())))

    def find_spec(self, fullname: str, path: Any = None, target: Any = None
                  ) -> importlib.machinery.ModuleSpec | None:
        if fullname in self.aliases or fullname in self.packages:
            return importlib.machinery.ModuleSpec(fullname, self,
                                                  is_package=fullname in self.packages)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        if module.__name__ in self.aliases:
            home = self.aliases[module.__name__]
            module.__getattr__ = lambda name: getattr(importlib.import_module(home), name)


def install() -> None:
    """Put the alias finder first on ``sys.meta_path`` (once)."""
    if not any(isinstance(finder, _AliasFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, _AliasFinder())
