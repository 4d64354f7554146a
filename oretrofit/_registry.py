"""The patch registry: hosts describe their sites, :func:`retrofit` plans, validates and applies.

A *site* is one named place in a host (``icl.7.attn``, ``fde.0.induce``, ``te.icl``) of one
kind (attention / norm / ffn / inject). An *arm* selects kinds:

    base   -> nothing           oa -> attention           full-o -> every kind

Every site is planned and validated before the first is applied; if applying any site fails,
those already applied are undone (never a half-patched model).
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Protocol, Sequence

from torch import nn

from ._patching import SiteConfig, Undo
from ._presence import check_positive

__all__ = ["ARMS", "KINDS", "Site", "Host", "PatchPlan", "Retrofit", "RetrofitError",
           "register_host", "registered_hosts", "plan_retrofit", "retrofit", "retrofitted",
           "apply_spec", "SPEC_VERSION"]

KINDS = ("attention", "norm", "ffn", "inject")
ARMS: dict[str, frozenset[str]] = {
    "base": frozenset(),
    "oa": frozenset({"attention"}),
    "full-o": frozenset(KINDS),
}
SPEC_VERSION = 1
_ACTIVE = "_oretrofit_retrofit"          # attribute on a retrofitted model (not in state_dict)


class RetrofitError(ValueError):
    """A retrofit request that cannot be carried out; the message says how to fix it."""


@dataclass
class Site:
    """One patchable place in a host.

    ``apply(config)`` patches it and returns the undo. ``receivers(tau)`` optionally reports
    the presence of learned receivers (inducing vectors, CLS tokens) at that τ.
    """

    name: str
    kind: str
    carrier: str
    apply: Callable[[SiteConfig], Undo]
    receivers: Callable[[float], dict[str, float]] | None = None


class Host(Protocol):
    """A host patch set: knows one family of models and lists their sites."""

    name: str

    def matches(self, model: nn.Module) -> bool: ...

    def check(self, model: nn.Module) -> None:
        """Raise :class:`RetrofitError` when this model/version cannot be patched."""

    def sites(self, model: nn.Module) -> list[Site]: ...

    def version(self) -> dict[str, str]:
        """Package versions that define the host (recorded in patch specs)."""

    # Optional: ``supports`` (str) names what the host covers in the "no host matches" error, and
    # ``uncovered(model) -> list[str]`` names the parts of a matched model it cannot patch; a
    # non-empty list is refused unless the caller passes ``allow_partial=True``.


_HOSTS: list[Host] = []


def register_host(host: Host, *, first: bool = False) -> Host:
    """Add a host patch set; ``first=True`` lets it win over hosts registered earlier."""
    if any(h.name == host.name for h in _HOSTS):
        raise RetrofitError(f"a host named {host.name!r} is already registered")
    _HOSTS.insert(0, host) if first else _HOSTS.append(host)
    return host


def registered_hosts() -> list[Host]:
    """The registered hosts, in matching order (importing ``oretrofit.patches`` adds built-ins)."""
    from . import patches  # noqa: F401  (registers the built-in hosts once)
    return list(_HOSTS)


def _find_host(model: nn.Module) -> Host:
    hosts = registered_hosts()
    for host in hosts:
        if host.matches(model):
            return host
    names = "; ".join(f"{h.name} ({h.supports})" if getattr(h, "supports", None) else h.name
                      for h in hosts) or "none"
    raise RetrofitError(
        f"no registered host matches {type(model).__name__}. Supported hosts: {names}. "
        "Register a site for your own module type with "
        "oretrofit.patches.torch_nn.register_module_site(...), or a whole host with "
        "oretrofit.register_host(...) (see README).")


def _matches(pattern: str, name: str) -> bool:
    if pattern.startswith("re:"):
        try:
            return re.fullmatch(pattern[3:], name) is not None
        except re.error as exc:
            raise RetrofitError(f"site pattern {pattern!r} is not a valid regular expression "
                                f"({exc}); fix it, or drop 're:' for a glob like 'icl.*'") from None
    return fnmatch.fnmatchcase(name, pattern)


@dataclass
class PatchPlan:
    """Every site that will be patched, with its τ, decided before anything is touched."""

    host: str
    arm: str
    tau: float
    eps: float
    entries: list[tuple[Site, SiteConfig]] = field(default_factory=list)
    site_tau: dict[str, float] = field(default_factory=dict)
    targets: list[str] | None = None
    exclude: list[str] | None = None
    uncovered: list[str] = field(default_factory=list)


def plan_retrofit(model: nn.Module, arm: str = "full-o", tau: float = 1e-8, eps: float = 1e-6,
                  site_tau: Mapping[str, float] | None = None, targets: Sequence[str] | None = None,
                  exclude: Sequence[str] | None = None, allow_partial: bool = False) -> PatchPlan:
    """Resolve the sites of ``arm`` on ``model`` without changing it (see :func:`retrofit`)."""
    if not isinstance(model, nn.Module):
        raise RetrofitError(f"retrofit needs a torch nn.Module (a host model), got "
                            f"{type(model).__name__}; build the model first, then retrofit it")
    if arm not in ARMS:
        raise RetrofitError(f"unknown arm {arm!r}; choose one of {', '.join(ARMS)}")
    tau, eps = check_positive("tau", tau), check_positive("eps", eps)
    site_tau = {str(k): check_positive(f"site_tau[{k!r}]", v) for k, v in (site_tau or {}).items()}
    for pattern in (*site_tau, *(targets or ()), *(exclude or ())):
        _matches(pattern, "")                   # a bad regular expression fails here, by name
    if arm == "base" and (site_tau or targets or exclude):
        raise RetrofitError("arm 'base' patches no site, so site_tau / targets / exclude "
                            "(--site-tau / --target / --exclude) have nothing to apply to; drop "
                            "them or choose arm 'oa' or 'full-o'")
    if model.__dict__.get(_ACTIVE) is not None:
        raise RetrofitError("this model is already retrofitted; call .revert() on the first "
                            "Retrofit (or use a fresh copy) before patching again")
    host = _find_host(model)
    host.check(model)
    uncovered = list(host.uncovered(model)) if hasattr(host, "uncovered") else []
    if uncovered and not allow_partial:
        raise RetrofitError(
            f"host {host.name!r} matches only part of this model; it has no site for: "
            f"{', '.join(uncovered[:8])}{' …' if len(uncovered) > 8 else ''}. Register a site for "
            "these module types (oretrofit.patches.torch_nn.register_module_site), or pass "
            "allow_partial=True to patch the rest and record them as uncovered")
    plan = PatchPlan(host.name, arm, tau, eps, site_tau=site_tau,
                     targets=list(targets) if targets else None,
                     exclude=list(exclude) if exclude else None, uncovered=uncovered)
    if arm == "base":
        return plan
    kinds = ARMS[arm]
    candidates = [s for s in host.sites(model) if s.kind in kinds]
    chosen = [s for s in candidates
              if (not targets or any(_matches(t, s.name) for t in targets))
              and not (exclude and any(_matches(x, s.name) for x in exclude))]
    if not chosen:
        raise RetrofitError(
            f"no site matched for arm {arm!r} on host {host.name!r} (targets={targets}, "
            f"exclude={exclude}); available sites: "
            f"{', '.join(s.name for s in candidates[:12])}{' …' if len(candidates) > 12 else ''}")
    for pattern in site_tau:
        if not any(_matches(pattern, s.name) for s in chosen):
            raise RetrofitError(f"site_tau pattern {pattern!r} matches no planned site; "
                                "use 're:' for a regular expression or a glob like 'icl.*'")
    for s in chosen:
        s_tau = next((v for p, v in site_tau.items() if _matches(p, s.name)), tau)
        plan.entries.append((s, SiteConfig(tau=s_tau, eps=eps)))
    return plan


class Retrofit:
    """An applied plan: ``report()`` lists the sites, ``revert()`` restores the exact original.

    Pickling or deep-copying the model (or this handle) stores the spec; the copy's handle
    re-applies it to the copy on first use (:mod:`oretrofit._serialize`), so it reverts and
    reports the copy only. ``Retrofit.of(model)`` returns the handle of a patched model.
    """

    def __init__(self, model: nn.Module, plan: PatchPlan, host: Host) -> None:
        self.model, self.plan, self._host = model, plan, host
        self._undos: list[Undo] = []
        self.reverted = False
        self._swaps_only = True

    @staticmethod
    def of(model: nn.Module) -> "Retrofit | None":
        """The active retrofit of ``model`` (e.g. one loaded by pickle), or None."""
        return model.__dict__.get(_ACTIVE)

    def _apply(self) -> None:
        from ._serialize import attach, footprint
        before = footprint(self.model)
        try:
            for site, config in self.plan.entries:
                self._undos.append(site.apply(config))
        except BaseException:
            self._undo_all()
            raise
        self._swaps_only = footprint(self.model) == before
        attach(self.model, _ACTIVE, self)

    def _bound(self) -> "Retrofit":
        if "_pending" in self.__dict__:
            from ._serialize import rebind
            rebind(self)
        return self

    def __getattr__(self, name: str) -> Any:
        # ``plan`` and ``_host`` of a handle loaded by pickle exist once its spec is re-applied
        if name in ("plan", "_host") and "_pending" in self.__dict__:
            return getattr(self._bound(), name)
        raise AttributeError(name)

    def __reduce__(self) -> tuple[Any, ...]:
        from ._serialize import restore_retrofit
        if not self.__dict__.get("_swaps_only", True):
            raise RetrofitError(
                f"a model retrofitted by host {self.plan.host!r} cannot be pickled or copied: "
                "its sites add hooks or attributes besides O-class swaps. Save the unpatched "
                "model (or its state_dict) with Retrofit.spec(), and apply_spec(model, spec) "
                "after loading (or retrofit a fresh copy)")
        spec = self.__dict__.get("_pending") or self.spec()
        return restore_retrofit, (spec,), {"model": self.model, "reverted": self.reverted}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if self.reverted:
            self.__dict__.pop("_pending", None)

    def _undo_all(self) -> None:
        while self._undos:
            self._undos.pop()()

    def revert(self) -> nn.Module:
        """Undo every site (outputs become bit-identical to the unpatched model)."""
        if self.reverted:
            raise RetrofitError("this retrofit was already reverted")
        self._bound()._undo_all()
        self.model.__dict__.pop(_ACTIVE, None)
        self.reverted = True
        return self.model

    def report(self) -> list[dict[str, Any]]:
        """One row per patched site: name, kind, carrier, τ and learned-receiver presences."""
        return [{"site": s.name, "kind": s.kind, "carrier": s.carrier, "tau": c.tau,
                 "receivers": s.receivers(c.tau) if s.receivers else {}}
                for s, c in self._bound().plan.entries]

    def spec(self) -> dict[str, Any]:
        """Versioned JSON-able patch spec; :func:`apply_spec` re-applies it to a loaded host."""
        from . import __version__
        plan = self._bound().plan
        return {"schema_version": SPEC_VERSION, "oretrofit": __version__, "host": plan.host,
                "host_versions": self._host.version(), "arm": plan.arm,
                "tau": plan.tau, "eps": plan.eps, "site_tau": plan.site_tau,
                "targets": plan.targets, "exclude": plan.exclude,
                "sites": [s.name for s, _ in plan.entries],
                "uncovered": plan.uncovered}

    def save_spec(self, path: str | Path) -> Path:
        """Write :meth:`spec` as JSON (through a temporary file: never a torn file)."""
        from ._provenance import write_json_atomic
        return write_json_atomic(path, self.spec())

    def __repr__(self) -> str:
        if "_pending" in self.__dict__:
            return f"Retrofit(host={self._pending.get('host')!r}, loaded, not yet re-applied)"
        state = "reverted" if self.reverted else "active"
        return (f"Retrofit(host={self.plan.host!r}, arm={self.plan.arm!r}, tau={self.plan.tau:g}, "
                f"sites={len(self.plan.entries)}, {state})")


def retrofit(model: nn.Module, arm: str = "full-o", tau: float = 1e-8, eps: float = 1e-6,
             site_tau: Mapping[str, float] | None = None, targets: Sequence[str] | None = None,
             exclude: Sequence[str] | None = None, allow_partial: bool = False) -> Retrofit:
    """Patch ``model`` in place with the O-components of ``arm`` at presence scale ``tau``.

    Args:
        arm: ``base`` (nothing), ``oa`` (attention sites) or ``full-o`` (every site).
        tau: default τ; ``site_tau`` maps site patterns (glob, or ``re:`` regex) to their own τ
            (first matching pattern wins).
        eps: ε of every OAttention denominator.
        targets / exclude: site-name patterns to keep / drop.
        allow_partial: patch a model the host covers only in part (``plan.uncovered`` and the
            spec list what stays unpatched); without it that is a :class:`RetrofitError`.
    Parameters, buffers and state_dict keys are untouched; the original checkpoint loads into
    the patched model with ``strict=True``.
    """
    plan = plan_retrofit(model, arm, tau, eps, site_tau, targets, exclude, allow_partial)
    host = next(h for h in registered_hosts() if h.name == plan.host)
    result = Retrofit(model, plan, host)
    result._apply()
    return result


@contextlib.contextmanager
def retrofitted(model: nn.Module, arm: str = "full-o", tau: float = 1e-8, **kwargs: Any
                ) -> Iterator[Retrofit]:
    """``with retrofitted(model, ...) as r:`` patches on entry and reverts on exit."""
    r = retrofit(model, arm, tau, **kwargs)
    try:
        yield r
    finally:
        r.revert()


def apply_spec(model: nn.Module, spec: Mapping[str, Any] | str | Path) -> Retrofit:
    """Re-apply a patch spec (a dict, or a path to its JSON) saved by :meth:`Retrofit.spec`.

    The result is checked against the spec (host, host package versions, site list); a spec
    that does not fit this model is refused and the model is left unpatched.
    """
    if not isinstance(spec, Mapping):
        try:
            spec = json.loads(Path(spec).read_text())
        except (OSError, ValueError) as exc:
            raise RetrofitError(f"cannot read the patch spec {spec}: {exc}; pass a spec saved "
                                "by Retrofit.save_spec") from exc
        if not isinstance(spec, Mapping):
            raise RetrofitError("a patch spec is a JSON object saved by Retrofit.save_spec")
    if spec.get("schema_version") != SPEC_VERSION:
        raise RetrofitError(f"patch spec schema_version {spec.get('schema_version')!r} is not "
                            f"supported (this oretrofit reads {SPEC_VERSION}); re-create the spec")
    missing = [k for k in ("arm", "tau", "eps") if k not in spec]
    if missing:
        raise RetrofitError(f"the patch spec lacks {', '.join(missing)}; re-create it with "
                            "Retrofit.spec() (or `oretrofit patch --out`)")
    result = retrofit(model, spec["arm"], spec["tau"], spec["eps"], site_tau=spec.get("site_tau"),
                      targets=spec.get("targets"), exclude=spec.get("exclude"),
                      allow_partial=bool(spec.get("uncovered")))
    from ._serialize import check_spec
    try:
        check_spec(result, spec)
    except RetrofitError:
        result.revert()
        raise
    return result
