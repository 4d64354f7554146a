"""Noticing a model changed under its retrofit.

A retrofit patches module *objects*: it swaps their class and adds attributes and hooks. A
module the user puts in their place afterwards (``layer.self_attn = fresh``, ``layer.mlp =
nn.Sequential(...)``, ``model.layers[3] = other_layer``), or a patched module whose class the
user sets (``module.__class__ = Other``), would run unpatched: its tokens ungated (a null token no
longer inert) while ``report()`` still listed its sites.

:class:`Watch` records, while the sites are applied, which modules each site touched (a module
whose class, number of attributes or hooks differ after its ``apply``, or that its ``apply``
added), every link on the path from the model to each of them, and each one's class after
patching. Its :meth:`Watch.check`, the model's first forward pre-hook (:func:`guard`), tests only
those links and classes (one ``is`` per link and per touched module, no walk of the model) and
refuses a changed model, naming what changed, the sites it held and the fix. Every module on
the path to a touched one gets a :class:`Beneath` pre-hook, the same test over the links and
classes under it, so a call into a submodule (``model.encoder(...)``, ``layers[0](...)``) is
refused as a call of the model is: a call of the model tests each link once per module above it
on its path (a few ``is`` per layer).

The forward refuses rather than re-checking: re-deriving the sites inside a call would patch the
model mid-forward (in a thread beside other calls, or while a compiler traces), and change the
sites the spec and report recorded without the user asking; the changed module may be one no
host can cover at all. Reverting and retrofitting again is one line, and the user's choice.
"""

from __future__ import annotations

import weakref
from typing import Any, Iterable, Sequence

from torch import nn

from .host import RetrofitError

__all__ = ["Watch", "Beneath", "guard", "unguard", "snapshot", "site_states", "FIX"]

_STATE = "_oretrofit"                     # the per-module patch state set_site keeps
Signature = tuple[type, int, int, int, int, int, int, int]
FIX = ("revert the retrofit (oretrofit.Retrofit.of(model).revert()) and retrofit the changed "
       "model again, or revert before changing a retrofitted model and retrofit after")


def snapshot(modules: Iterable[nn.Module]) -> list[Signature]:
    """Per module: its class, its number of attributes besides the patch state, and its number
    of hooks of each kind (what a retrofit may change on a module)."""
    return [(type(m), len(d) - (_STATE in d), len(d["_forward_hooks"]),
             len(d["_forward_pre_hooks"]), len(d["_backward_hooks"]),
             len(d["_backward_pre_hooks"]), len(d["_state_dict_hooks"]),
             len(d["_load_state_dict_pre_hooks"])) for m in modules for d in (m.__dict__,)]


Link = tuple[nn.Module, str, nn.Module, str]           # parent, name, child, the child's path
Class = tuple[nn.Module, type, str]                     # module, its class after patching, path


def _under(path: str, scope: str) -> bool:
    return scope == "" or path == scope or path.startswith(scope + ".")


def _outermost(paths: Iterable[str]) -> list[str]:
    kept: list[str] = []
    for path in sorted(paths, key=lambda p: (p.count("."), p)):
        if not any(_under(path, k) for k in kept):
            kept.append(path)
    return kept


def _changes(links: Iterable[Link], classes: Iterable[Class]) -> dict[str, str]:
    """The outermost changes among ``links`` and ``classes``, path -> what changed there."""
    found: dict[str, str] = {}
    for parent, name, child, path in links:
        now = parent._modules.get(name)
        if now is not child:
            found[path] = ("removed" if now is None else f"replaced by another "
                           f"{type(now).__name__}, which the retrofit never patched")
    for module, cls, path in classes:
        if type(module) is not cls:
            found.setdefault(path, f"its class was set to {type(module).__name__} after the "
                                   f"retrofit made it {cls.__name__}")
    return {path: found[path] for path in _outermost(found)}


def _intact(links: Iterable[Link], classes: Iterable[Class]) -> bool:
    for parent, name, child, _ in links:
        if parent._modules.get(name) is not child:
            return False
    for module, cls, _ in classes:
        if type(module) is not cls:
            return False
    return True


class Beneath:
    """The forward pre-hook of a module on the path to touched ones: refuses a call while a link
    or class under it changed (the watch's error names every change in the model).

    It holds its watch weakly: the watch holds the whole model, and a submodule kept elsewhere (a
    host's derivation cache holds backbones and layers) would otherwise keep the model alive
    through its hook. The model's own pre-hook keeps the watch alive; a pickle or copy holds it
    strongly and is weak again once loaded."""

    def __init__(self, watch: "Watch", links: tuple[Link, ...], classes: tuple[Class, ...]):
        self._watch = weakref.ref(watch)
        self.links, self.classes = links, classes

    def __call__(self, module: nn.Module, args: Any) -> None:
        if not _intact(self.links, self.classes):
            watch = self._watch()
            if watch is not None:
                raise watch.error()
            changed = [f"{path} ({what})" for path, what in _changes(self.links,
                                                                      self.classes).items()]
            raise RetrofitError(f"{'; '.join(changed[:6])}: changed after the model holding this "
                                f"{type(module).__name__} was retrofitted; {FIX}")

    def __getstate__(self) -> dict[str, Any]:
        return {"watch": self._watch(), "links": self.links, "classes": self.classes}

    def __setstate__(self, state: dict[str, Any]) -> None:
        watch = state.pop("watch")
        self._watch = (lambda: None) if watch is None else weakref.ref(watch)
        self.__dict__.update(state)


class Watch:
    """What a retrofit touched on its model, and the test that it is all still in place (module
    docstring): made with the model unpatched, told :meth:`applied` after each site's apply,
    then closed (:meth:`close`). It holds modules and paths, no ids, so it pickles and copies
    with its model. A site's apply is compared over the model's modules as they were (no walk
    of the model per site); a module the retrofit added counts as touched by it as a whole."""

    # each module on the paths and its check (:meth:`close`); none in a watch pickled before them
    beneath: tuple[tuple[nn.Module, Beneath], ...] = ()

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self._modules = list(model.modules())
        self._first = self._last = snapshot(self._modules)
        self._touched: dict[int, list[str]] = {}          # id(module) -> the sites that touched it
        self.sites_at: dict[str, list[str]] = {}          # path -> the sites that touched it
        self.links: tuple[Link, ...] = ()
        self.classes: tuple[Class, ...] = ()

    def applied(self, site: str) -> None:
        """Record the modules ``site``'s apply touched (the retrofit's whole-model step: ``""``)."""
        now = snapshot(self._modules)
        for module, before, after in zip(self._modules, self._last, now):
            if before != after:
                self._touched.setdefault(id(module), []).append(site)
        self._last = now

    def close(self) -> bool:
        """Fix the links and classes to test; returns whether the retrofit swapped classes only
        (no module added or removed, no attribute or hook: it pickles as its spec alone)."""
        known, now = {id(m) for m in self._modules}, {id(m) for m in self.model.modules()}
        for key in now - known:
            self._touched[key] = [""]
        only = now == known and all(a[1:] == b[1:] for a, b in zip(self._first, self._last))
        self._modules, self._first, self._last = [], [], []
        links: dict[tuple[int, str], Link] = {}
        classes = []
        inner: dict[int, tuple[nn.Module, str]] = {}     # modules on the paths, below the model
        for path, module in self.model.named_modules():
            if id(module) not in self._touched:
                continue
            self.sites_at[path] = self._touched[id(module)]
            parent, walked = self.model, ""
            for name in filter(None, path.split(".")):
                walked = f"{walked}.{name}" if walked else name
                child = parent._modules[name]
                links.setdefault((id(parent), name), (parent, name, child, walked))
                if child is not module:
                    inner.setdefault(id(child), (child, walked))
                parent = child
            classes.append((module, type(module), path))
        self._touched = {}
        self.links, self.classes = tuple(links.values()), tuple(classes)
        self.beneath = tuple(
            (node, Beneath(self, tuple(k for k in self.links if k[3].startswith(path + ".")),
                           tuple(c for c in self.classes if _under(c[2], path))))
            for node, path in inner.values())
        return only

    def intact(self) -> bool:
        """Every touched module is where the retrofit left it, with the class it left."""
        return _intact(self.links, self.classes)

    def changes(self) -> dict[str, str]:
        """The outermost changes, path -> what changed there; empty when intact."""
        return _changes(self.links, self.classes)

    def changed_sites(self) -> dict[str, str]:
        """Site -> ``"path (what changed)"`` for every site a change leaves unpatched."""
        sites: dict[str, str] = {}
        for changed, what in self.changes().items():
            for path, names in self.sites_at.items():
                if _under(path, changed):
                    for name in filter(None, names):
                        sites.setdefault(name, f"{changed or 'the model'} ({what})")
        return sites

    def check(self, module: nn.Module, args: Any) -> None:
        """The forward pre-hook: refuse a model changed under its retrofit (module docstring)."""
        if not self.intact():
            raise self.error()

    def error(self) -> RetrofitError:
        """The refusal: what changed, the sites it held, the fix."""
        changes = [f"{p or 'the model'} ({what})" for p, what in self.changes().items()]
        sites = sorted(self.changed_sites())
        more = f" … ({len(sites) - 8} more)" if len(sites) > 8 else ""
        held = (f"; it held the sites {', '.join(sites[:8])}{more}, which would run unpatched"
                if sites else "")
        return RetrofitError(f"the model changed after it was retrofitted: {'; '.join(changes)}"
                             f"{held}. To run it, {FIX}")


def guard(model: nn.Module, watch: Watch | None) -> None:
    """Make ``watch.check`` the model's first forward pre-hook and each of its :class:`Beneath`
    checks its module's (replacing an earlier watch's)."""
    unguard(model, watch)
    if watch is not None:
        model.register_forward_pre_hook(watch.check, prepend=True)
        for module, check in watch.beneath:
            module.register_forward_pre_hook(check, prepend=True)


def unguard(model: nn.Module, watch: Watch | None = None) -> None:
    """Remove every watch's pre-hooks from ``model``'s modules and from those ``watch`` checks
    (a module the user took out of the model keeps none)."""
    modules = {id(m): m for m in model.modules()}
    if watch is not None:
        modules.update((id(m), m) for m, _ in watch.beneath)
    for module in modules.values():
        hooks = module._forward_pre_hooks
        for key in [k for k, hook in hooks.items() if isinstance(hook, Beneath)
                    or isinstance(getattr(hook, "__self__", None), Watch)]:
            del hooks[key]


def site_states(watch: Watch | None, names: Sequence[str]) -> list[str]:
    """Each site's state for ``report()``: ``patched``, or ``changed: <path> (<what>)``."""
    changed = {} if watch is None or watch.intact() else watch.changed_sites()
    return [f"changed: {changed[n]}" if n in changed else "patched" for n in names]
