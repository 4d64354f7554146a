"""What a host needs to describe itself, and the table of hosts (a leaf: imports no host).

A *host* knows one family of models and lists their *sites* (named places of one kind:
attention / norm / ffn / inject). Host modules import only this module; the registry
(:mod:`oretrofit._surgery.registry`) plans and applies their sites. The built-in hosts are found
through :data:`BUILTIN_HOSTS`, module names imported on the first :func:`registered_hosts`
call (no import loop between the registry and the hosts).

Hosts are matched most specific first (:func:`specificity`, ties in registration order). The
documented order of the built-ins:

    tabpfn-v3            20   TabPFN models (v3, v3.5; oretrofit.hosts.tabpfn.versions)
    tabdpt               20   TabDPT models (tabdpt.model.TabDPTModel; oretrofit.hosts.tabdpt)
    tabicl               20   TabICL models (tabicl._model.tabicl.TabICL; oretrofit.hosts.tabicl)
    mitra                20   Mitra models (autogluon.tabular's Tab2D; oretrofit.hosts.mitra)
    transformers         10   transformers models routed through the attention interface
    torch.nn              0   the fallback: plain torch.nn modules, and whatever part of a model
                              the matched hosts do not own
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Callable, Collection, Mapping, Protocol, Sequence

from torch import nn

from .patching import SiteConfig, Undo

__all__ = ["KINDS", "BUILTIN_HOSTS", "DEFAULT_SPECIFICITY", "RetrofitError", "Site", "SiteConfig",
           "Host", "inside", "join_path", "register_host", "registered_hosts", "specificity",
           "check_tested_release", "vendor_class", "check_known_modules"]

KINDS = ("attention", "norm", "ffn", "inject")
DEFAULT_SPECIFICITY = 10
BUILTIN_HOSTS = ("oretrofit.hosts.tabpfn.host", "oretrofit.hosts.tabdpt.host",
                 "oretrofit.hosts.tabicl.host", "oretrofit.hosts.mitra.host",
                 "oretrofit.hosts.transformers.host",
                 "oretrofit.hosts.torch_nn")


class RetrofitError(ValueError):
    """A retrofit request that cannot be carried out; the message says how to fix it."""


def check_tested_release(host: str, package: str, version: str | None,
                         tested: Sequence[str], fix: str) -> None:
    """Refuse a release of ``package`` (``version``, None when not installed) outside the
    ``tested`` ones the ``host`` admits, naming the ``fix``: an untested release may have
    changed what the host's O-mixins replace, and would be patched silently wrong."""
    if version in tested:
        return
    listed = ", ".join(tested)
    if version is None:
        raise RetrofitError(f"the {host} host needs {package} {listed}, and {package} is not "
                            f"installed: {fix}")
    raise RetrofitError(f"{package} {version} is not supported by the {host} host: it is tested "
                        f"on {package} {listed} only: {fix}")


def vendor_class(module: nn.Module, vendor_modules: Collection[str]) -> type:
    """The first class in ``module``'s MRO defined in one of ``vendor_modules`` or in torch: the
    vendor's class also under an O-subclass, the class a host matches and names."""
    return next((c for c in type(module).__mro__
                 if c.__module__ in vendor_modules or c.__module__.startswith("torch.")),
                type(module))


def check_known_modules(model: nn.Module, host: str, known: Mapping[str, Collection[str]],
                        package: str, fix: str) -> None:
    """Refuse ``model`` when one of its modules is of a type ``host``'s sites do not account
    for, naming its path and class: each module's :func:`vendor_class` must be listed in
    ``known`` under its module (``"torch.nn"`` for torch's). Any other type (another release
    of ``package`` may add one) would be left ungated."""
    for path, module in model.named_modules():
        cls = vendor_class(module, known)
        family = "torch.nn" if cls.__module__.startswith("torch.") else cls.__module__
        if cls.__name__ not in known.get(family, ()):
            raise RetrofitError(
                f"{host}: module {path or '(model)'} of type {cls.__module__}.{cls.__name__} is "
                f"not one the host can gate (an addition of another {package} release?); it "
                f"would be left ungated, so the model is refused: {fix}")


@dataclass
class Site:
    """One patchable place in a host.

    ``apply(config)`` patches it and returns the undo. ``receivers(tau)`` optionally reports
    the presence of learned receivers (inducing vectors, CLS tokens) at that τ. ``scope``
    optionally names the module paths (in the model given to ``Host.sites``) whose parameters
    and buffers the site gates; when every site of a host states its scope, the registry lists
    any weight outside all scopes as uncovered (see :mod:`oretrofit._surgery.compose`).
    ``modules`` optionally names the modules the site patches (default: those at its ``scope``
    paths); a patch spec records their classes and weight shapes, so that a spec applied to
    another model or under another release is refused where a site differs
    (:mod:`oretrofit._surgery.serialize`).
    """

    name: str
    kind: str
    carrier: str
    apply: Callable[[SiteConfig], Undo]
    receivers: Callable[[float], dict[str, float]] | None = None
    scope: tuple[str, ...] | None = None
    modules: tuple[nn.Module, ...] = ()


class Host(Protocol):
    """A host patch set: knows one family of models and lists their sites.

    Optional members (read with ``getattr``):

    * ``specificity: int`` — matching order, highest first (default :data:`DEFAULT_SPECIFICITY`;
      TabPFN v3 20, transformers 10, the torch.nn fallback 0).
    * ``supports: str`` — what the host covers, quoted in the "no host matches" error.
    * ``owned(model) -> list[str]`` — module paths whose subtrees the host's sites cover
      (default ``[""]``, the whole model); the rest of the model goes to less specific hosts
      and finally to the fallback.
    * ``uncovered(model) -> list[str]`` — parts inside ``owned`` the host cannot gate, each
      ``"path (ClassName)"``; a non-empty list is refused unless ``allow_partial=True``.
    * ``attach_to_model(model) -> Undo`` — what the retrofit adds to the model as a whole after
      its sites (transformers: ``save_pretrained`` writes the patch spec); its undo runs first
      on ``revert``.
    """

    name: str

    def matches(self, model: nn.Module) -> bool: ...

    def check(self, model: nn.Module) -> None:
        """Raise :class:`RetrofitError` when this model/version cannot be patched."""

    def sites(self, model: nn.Module) -> list[Site]: ...

    def version(self) -> dict[str, str]:
        """Package versions that define the host (recorded in patch specs); a host may take
        the model as ``version(model)`` to add what of the model defines it."""


_HOSTS: list[Host] = []
_BUILTINS_LOADED: list[bool] = []


def join_path(*parts: str) -> str:
    """Dotted module path from parts, skipping empty ones (``""`` is the model itself)."""
    return ".".join(p for p in parts if p)


def inside(path: str, roots: Sequence[str]) -> bool:
    """``path`` (a module or weight path) is one of ``roots`` or lies below one ("" = all)."""
    return any(r == "" or path == r or path.startswith(r + ".") for r in roots)


def specificity(host: Host) -> int:
    """The host's matching rank (higher is tried first)."""
    return int(getattr(host, "specificity", DEFAULT_SPECIFICITY))


def register_host(host: Host, *, first: bool = False) -> Host:
    """Add a host patch set; ``first=True`` lets it win over earlier hosts of equal specificity."""
    if any(h.name == host.name for h in _HOSTS):
        raise RetrofitError(f"a host named {host.name!r} is already registered")
    _HOSTS.insert(0, host) if first else _HOSTS.append(host)
    return host


def registered_hosts() -> list[Host]:
    """The registered hosts in matching order: most specific first, ties in registration order.

    The first call imports the built-in host modules of :data:`BUILTIN_HOSTS`.
    """
    if not _BUILTINS_LOADED:
        for module in BUILTIN_HOSTS:
            importlib.import_module(module)
        _BUILTINS_LOADED.append(True)
    return sorted(_HOSTS, key=lambda h: -specificity(h))
