"""The patch registry: hosts describe their sites, :func:`retrofit` plans, validates and applies.

A *site* is one named place in a host (``icl.7.attn``, ``fde.0.induce``, ``te.icl``) of one
kind (attention / norm / ffn / inject). An *arm* selects kinds:

    base   -> nothing           oa -> attention           full-o -> every kind

Every site is planned and validated before the first is applied; if applying any site fails,
those already applied are undone (never a half-patched model). The host types live in
:mod:`oretrofit._surgery.host`; which hosts take which part of a model, in :mod:`oretrofit._surgery.compose`.
"""

from __future__ import annotations

import contextlib
import fnmatch
import inspect
import os
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator, Mapping, Sequence

from torch import nn

from .compose import compose, uncovered_error
from .._files.provenance import oretrofit_version
from .._files.reading import FileRefused, read_text
from .guard import Watch, guard, site_states, unguard
from .host import KINDS, Host, RetrofitError, Site, register_host, registered_hosts
from .patching import SiteConfig, Undo, portable
from .._operators.presence import EPS_RETROFIT, TAU_RETROFIT, check_eps, check_positive
from .serialize import (attach, check_calibrated_weights, check_spec, check_spec_entries,
                        parse_spec_json, site_records, strip, unstrip)

__all__ = ["ARMS", "KINDS", "Site", "Host", "PatchPlan", "Retrofit", "RetrofitError",
           "register_host", "registered_hosts", "check_arm", "plan_retrofit", "retrofit",
           "retrofitted", "apply_spec", "read_spec", "check_schema_version", "site_row",
           "SPEC_VERSION", "SPEC_VERSIONS_READ"]

ARMS: dict[str, frozenset[str]] = {
    "base": frozenset(),
    "oa": frozenset({"attention"}),
    "full-o": frozenset(KINDS),
}
SPEC_VERSION = 2             # 2 added site_modules (oretrofit._surgery.serialize.ADDED_IN)
SPEC_VERSIONS_READ = (1, 2)
_ACTIVE = "_oretrofit_retrofit"          # attribute on a retrofitted model (not in state_dict)


def check_arm(arm: str, **settings: Any) -> None:
    """Refuse an unknown arm, and settings (``tau=``, ``eps=``, …) given to arm ``base``, which
    patches no site and would ignore them; a setting of None is not given."""
    if arm not in ARMS:
        raise RetrofitError(f"unknown arm {arm!r}; choose one of {', '.join(ARMS)}")
    given = [name for name, value in settings.items() if value is not None]
    if arm == "base" and given:
        raise RetrofitError(f"arm 'base' patches no site, so {', '.join(given)} would be "
                            "ignored; drop them, or choose arm 'oa' or 'full-o'")


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
    hosts: list[str] = field(default_factory=list)    # every host taking part, ``host`` first
    calibration: Mapping[str, Any] | None = None       # the record of an applied calibrated spec


def plan_retrofit(model: nn.Module, arm: str = "full-o", tau: float = TAU_RETROFIT,
                  eps: float = EPS_RETROFIT, site_tau: Mapping[str, float] | None = None, targets: Sequence[str] | None = None,
                  exclude: Sequence[str] | None = None, allow_partial: bool = False) -> PatchPlan:
    """Resolve the sites of ``arm`` on ``model`` without changing it (see :func:`retrofit`)."""
    if not isinstance(model, nn.Module):
        raise RetrofitError(f"retrofit needs a torch nn.Module (a host model), got "
                            f"{type(model).__name__}; build the model first, then retrofit it")
    if arm not in ARMS:
        raise RetrofitError(f"unknown arm {arm!r}; choose one of {', '.join(ARMS)}")
    tau, eps = check_positive("tau", tau), check_eps(eps)
    site_tau = {str(k): check_positive(f"site_tau[{k!r}]", v) for k, v in (site_tau or {}).items()}
    for option, patterns in (("targets", targets), ("exclude", exclude)):
        if isinstance(patterns, str):
            raise RetrofitError(f"{option} is a list of site patterns, got the string "
                                f"{patterns!r} (read letter by letter); write "
                                f"{option}=[{patterns!r}]")
    if targets is not None and len(targets) == 0:
        raise RetrofitError("targets=[] keeps no site, yet would be read as no filter and patch "
                            "every site: pass targets=None to patch every site, or list the site "
                            "patterns to keep")
    for pattern in (*site_tau, *(targets or ()), *(exclude or ())):
        _matches(pattern, "")                   # a bad regular expression fails here, by name
    if arm == "base" and (site_tau or targets or exclude):
        raise RetrofitError("arm 'base' patches no site, so site_tau / targets / exclude "
                            "(--site-tau / --target / --exclude) have nothing to apply to; drop "
                            "them or choose arm 'oa' or 'full-o'")
    if model.__dict__.get(_ACTIVE) is not None:
        raise RetrofitError("this model is already retrofitted; call .revert() on the first "
                            "Retrofit (or use a fresh copy) before patching again")
    parts = compose(model)
    uncovered = [entry for part in parts for entry in part.uncovered]
    if uncovered and not allow_partial:
        raise uncovered_error(model, parts)
    plan = PatchPlan(parts[0].host.name, arm, tau, eps, site_tau=site_tau,
                     targets=list(targets) if targets else None,
                     exclude=list(exclude) if exclude else None, uncovered=uncovered,
                     hosts=[part.host.name for part in parts])
    if arm == "base":
        return plan
    kinds = ARMS[arm]
    every = [s for part in parts for s in part.sites]
    for option, patterns in (("targets", targets), ("exclude", exclude)):
        for pattern in patterns or ():
            if not any(_matches(pattern, s.name) for s in every):
                raise RetrofitError(
                    f"{option} pattern {pattern!r} matches no site of host {plan.host!r} (a "
                    "typo would otherwise pass silently); sites: "
                    f"{', '.join(s.name for s in every[:12])}{' …' if len(every) > 12 else ''}; "
                    "use a glob like 'icl.*' or 're:' for a regular expression")
    candidates = [s for s in every if s.kind in kinds]
    chosen = [s for s in candidates
              if (not targets or any(_matches(t, s.name) for t in targets))
              and not (exclude and any(_matches(x, s.name) for x in exclude))]
    if not chosen:
        raise RetrofitError(
            f"no site matched for arm {arm!r} on host {plan.host!r} (targets={targets}, "
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


def site_row(site: Site, config: SiteConfig, state: str) -> dict[str, Any]:
    """One row of :meth:`Retrofit.report` (``oretrofit patch`` prints them): name, kind, carrier,
    τ, learned-receiver presences and ``state``."""
    return {"site": site.name, "kind": site.kind, "carrier": site.carrier, "tau": config.tau,
            "receivers": site.receivers(config.tau) if site.receivers else {}, "state": state}


class Retrofit:
    """An applied plan: ``report()`` lists the sites, ``revert()`` restores the exact original.

    Pickling or deep-copying the model (or this handle) stores the spec; the copy's handle
    re-applies it to the copy on first use (:mod:`oretrofit._surgery.serialize`), so it reverts and
    reports the copy only. ``Retrofit.of(model)`` returns the handle of a patched model.

    A patched module the user replaces afterwards, or whose class the user sets, is noticed
    (:mod:`oretrofit._surgery.guard`): the model's next forward is refused naming it, the sites
    it held and the fix, and ``report()`` gives those sites as ``changed``.
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
        watch = Watch(self.model)
        try:
            for site, config in self.plan.entries:
                self._undos.append(site.apply(config))
                watch.applied(site.name)
            whole_model = getattr(self._host, "attach_to_model", None)
            if whole_model is not None:
                self._undos.append(whole_model(self.model))
                watch.applied("")
        except BaseException:
            self._undo_all()
            raise
        self._swaps_only, self._watch = watch.close(), watch
        attach(self.model, _ACTIVE, self)
        guard(self.model, watch)

    def _bound(self) -> "Retrofit":
        if "_pending" in self.__dict__:
            _rebind(self)
        return self

    def __getattr__(self, name: str) -> Any:
        # ``plan`` and ``_host`` of a handle loaded by pickle exist once its spec is re-applied
        if name in ("plan", "_host") and "_pending" in self.__dict__:
            return getattr(self._bound(), name)
        raise AttributeError(name)

    def __reduce__(self) -> tuple[Any, ...]:
        state = {"model": self.model, "reverted": self.reverted,
                 "_watch": self.__dict__.get("_watch")}
        if not self.__dict__.get("_swaps_only", True) and not self.reverted:
            # hooks and attributes pickle with the model; so do the undos that take them off
            undos = self.__dict__.get("_loaded_undos", self._undos)
            if not all(map(portable, undos)):
                raise RetrofitError(
                    f"a model retrofitted by host {self.plan.host!r} cannot be pickled or copied: "
                    "a site's undo is a closure (a site registered with a plain function?). "
                    "Save the unpatched model (or its state_dict) with Retrofit.spec(), and "
                    "apply_spec(model, spec) after loading; or make the site's undos objects "
                    "(oretrofit._surgery.patching.portable)")
            state["_loaded_undos"] = undos
        spec = self.__dict__.get("_pending") or self.spec()
        return _restore_retrofit, (spec,), state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        if self.reverted:
            self.__dict__.pop("_pending", None)

    def _undo_all(self) -> None:
        while self._undos:
            self._undos.pop()()

    def revert(self) -> nn.Module:
        """Undo every site (outputs become bit-identical to the unpatched model).

        On a model changed since (a patched module replaced, or its class set): what the user
        put in place stays as they set it (no replaced module or class is put back), the
        retrofit comes off every module it patched (in the model or not), and a warning names
        what changed."""
        if self.reverted:
            raise RetrofitError("this retrofit was already reverted")
        watch = self._bound().__dict__.pop("_watch", None)
        changes = {} if watch is None or watch.intact() else watch.changes()
        self._undo_all()
        unguard(self.model, watch)
        self.model.__dict__.pop(_ACTIVE, None)
        self.reverted = True
        if changes:
            warnings.warn("oretrofit: the model changed after it was retrofitted ("
                          + "; ".join(f"{p or 'the model'}: {w}" for p, w in changes.items())
                          + "); revert left those as you set them and took the retrofit off "
                          "every module it had patched", UserWarning, stacklevel=2)
        return self.model

    def report(self) -> list[dict[str, Any]]:
        """One row per patched site (:func:`site_row`); ``state`` is ``patched``, or
        ``changed: <path> (<what>)`` for a site whose module the user replaced or reclassed
        since (the model refuses to run until it is retrofitted again)."""
        entries = self._bound().plan.entries
        states = site_states(self.__dict__.get("_watch"), [s.name for s, _ in entries])
        return [site_row(s, c, state) for (s, c), state in zip(entries, states)]

    def spec(self) -> dict[str, Any]:
        """Versioned JSON-able patch spec; :func:`apply_spec` re-applies it to a loaded host."""
        plan = self._bound().plan
        return {"schema_version": SPEC_VERSION, "oretrofit": oretrofit_version(), "host": plan.host,
                "hosts": plan.hosts, "host_versions": _host_versions(plan.hosts, self.model),
                "arm": plan.arm,
                "tau": plan.tau, "eps": plan.eps, "site_tau": plan.site_tau,
                "targets": plan.targets, "exclude": plan.exclude,
                "sites": [s.name for s, _ in plan.entries],
                "site_modules": site_records(self.model, [s for s, _ in plan.entries]),
                "uncovered": plan.uncovered, "calibration": plan.calibration}

    def save_spec(self, path: str | Path) -> Path:
        """Write :meth:`spec` as JSON (through a temporary file: never a torn file)."""
        from .._files.provenance import write_json_atomic
        return write_json_atomic(path, self.spec())

    def __repr__(self) -> str:
        if "_pending" in self.__dict__:
            return f"Retrofit(host={self._pending.get('host')!r}, loaded, not yet re-applied)"
        state = "reverted" if self.reverted else "active"
        return (f"Retrofit(host={self.plan.host!r}, arm={self.plan.arm!r}, tau={self.plan.tau:g}, "
                f"sites={len(self.plan.entries)}, {state})")


def _restore_retrofit(spec: Mapping[str, Any]) -> Retrofit:
    """An unbound handle for ``spec`` (pickle's constructor; state arrives by ``__setstate__``)."""
    handle = Retrofit.__new__(Retrofit)
    handle.__dict__.update(_pending=dict(spec), _undos=[], reverted=False)
    return handle


def _rebind(handle: Retrofit) -> None:
    """Re-apply a loaded handle's spec to its model: take the loaded retrofit off, apply the
    spec afresh and check it (:mod:`oretrofit._surgery.serialize`). A retrofit of O-class swaps only is
    taken off by :func:`strip`, and on failure the model is left exactly as it was loaded; one
    that also added hooks and attributes is taken off by its own loaded undos, and on failure
    the model is left unpatched (the error says so)."""
    model, spec = handle.model, handle.__dict__.pop("_pending")
    active = model.__dict__.pop(_ACTIVE, None)
    loaded_undos = handle.__dict__.pop("_loaded_undos", None)
    if loaded_undos is not None:
        for undo in reversed(loaded_undos):
            undo()
        try:
            fresh = apply_spec(model, spec)
        except RetrofitError as exc:
            handle.__dict__.update(reverted=True, _watch=None)
            unguard(model)
            raise RetrofitError(f"{exc} (the loaded model's retrofit was taken off to re-apply "
                                "its spec: the model is now unpatched)") from None
        handle.__dict__.update(plan=fresh.plan, _host=fresh._host, _undos=fresh._undos,
                               _swaps_only=fresh._swaps_only, _watch=fresh._watch)
        attach(model, _ACTIVE, handle)
        return
    taken = strip(model)
    try:
        fresh = apply_spec(model, spec)
    except BaseException:
        unstrip(taken)
        if active is not None:
            model.__dict__[_ACTIVE] = active
        guard(model, handle.__dict__.get("_watch"))
        handle.__dict__["_pending"] = spec
        raise
    handle.__dict__.update(plan=fresh.plan, _host=fresh._host, _undos=fresh._undos,
                           _swaps_only=True, _watch=fresh._watch)
    attach(model, _ACTIVE, handle)


def _host_versions(names: Sequence[str], model: nn.Module) -> dict[str, str]:
    """Package versions of every host taking part (merged; the first host's win on a clash);
    a host whose ``version`` takes the model may name what it depends on in the model (the
    TabPFN host: the model version's architecture)."""
    versions: dict[str, str] = {}
    for host in reversed([h for h in registered_hosts() if h.name in names]):
        takes_model = "model" in inspect.signature(host.version).parameters
        versions.update(host.version(model) if takes_model else host.version())
    return versions


def retrofit(model: nn.Module, arm: str = "full-o", tau: float = TAU_RETROFIT, eps: float = EPS_RETROFIT,
             site_tau: Mapping[str, float] | None = None, targets: Sequence[str] | None = None,
             exclude: Sequence[str] | None = None, allow_partial: bool = False) -> Retrofit:
    """Patch ``model`` in place with the O-components of ``arm`` at presence scale ``tau``.

    Args:
        arm: ``base`` (nothing), ``oa`` (attention sites) or ``full-o`` (every site).
        tau: default τ; ``site_tau`` maps site patterns (glob, or ``re:`` regex) to their own τ
            (first matching pattern wins). The default, ``TAU_RETROFIT`` = 1e-8, is smaller than
            the O-modules' ``TAU_MODULES`` = 1e-6: a pretrained host never saw the gate, so τ → 0
            keeps ρτ(h) = ‖h‖²/(τ+‖h‖²) at 1 on every active carrier (paper Table 2).
        eps: ε of every OAttention denominator; the default, ``EPS_RETROFIT`` = 0, is the limit
            ε → 0⁺ (paper eq. 8): a row with a live source is the host's softmax exactly, a row
            with none gives exact zeros. An ε > 0 fades rows whose mass Σ_j p_j e^{s_ij} is near
            ε, which on a pretrained host can silence heads whose logits sit low.
        targets / exclude: site-name patterns to keep / drop.
        allow_partial: patch a model its hosts cover only in part (``plan.uncovered`` and the
            spec list what no site reaches, e.g. a module whose weights lie outside every site's
            scope); without it that is a :class:`RetrofitError`.
    The most specific matching host patches the model, or the subtrees it owns; the torch.nn
    fallback patches the rest (``plan.hosts`` / ``spec()["hosts"]`` name every host involved).
    Parameters, buffers and state_dict keys are untouched; the original checkpoint loads into
    the patched model with ``strict=True``.
    """
    plan = plan_retrofit(model, arm, tau, eps, site_tau, targets, exclude, allow_partial)
    host = next(h for h in registered_hosts() if h.name == plan.host)
    result = Retrofit(model, plan, host)
    result._apply()
    return result


@contextlib.contextmanager
def retrofitted(model: nn.Module, arm: str = "full-o", tau: float = TAU_RETROFIT, **kwargs: Any
                ) -> Iterator[Retrofit]:
    """``with retrofitted(model, ...) as r:`` patches on entry and reverts on exit."""
    r = retrofit(model, arm, tau, **kwargs)
    try:
        yield r
    finally:
        r.revert()


def apply_spec(model: nn.Module, spec: Mapping[str, Any] | str | Path) -> Retrofit:
    """Re-apply a patch spec (a dict, or a path to its JSON) saved by :meth:`Retrofit.spec`.

    The result is checked against the spec (host, site list, each site's kind and the classes
    and weight shapes of its modules, and for a calibrated spec the weights its τ were read
    from); a spec that does not fit this model is refused naming the site that differs, and the
    model is left unpatched. The package versions a spec records are provenance: it applies
    under any release the host admits (a release it does not admit is refused by name).
    """
    spec = read_spec(spec)
    try:
        result = retrofit(model, spec["arm"], spec["tau"], spec["eps"],
                          site_tau=spec.get("site_tau"), targets=spec.get("targets"),
                          exclude=spec.get("exclude"), allow_partial=bool(spec.get("uncovered")))
    except RetrofitError as exc:
        raise _misfit(model, spec, exc) from None
    try:
        check_spec(result.spec(), spec)
        check_calibrated_weights(spec, model)
    except RetrofitError:
        result.revert()
        raise
    result.plan.calibration = spec["calibration"]
    return result


def check_schema_version(spec: Mapping[str, Any], what: str) -> None:
    """Refuse a spec of a schema version this oretrofit does not read (:data:`SPEC_VERSIONS_READ`:
    a spec saved by an earlier release keeps loading)."""
    version = spec.get("schema_version")
    if isinstance(version, bool) or version not in SPEC_VERSIONS_READ:
        raise RetrofitError(f"{what} has schema_version {version!r}, not one this oretrofit "
                            f"reads ({', '.join(map(str, SPEC_VERSIONS_READ))}); re-create the "
                            "spec")


def _misfit(model: nn.Module, spec: Mapping[str, Any], exc: RetrofitError) -> RetrofitError:
    """Why ``spec`` does not apply to ``model``: another host when the hosts differ, else the
    retrofit's own reason; either way, re-create the spec from this model."""
    fix = ("A spec fits the model it was made from: re-create it from this model (`oretrofit "
           "calibrate`, Retrofit.spec())")
    made_for = spec.get("host")
    model_class = ((spec.get("calibration") or {}).get("data") or {}).get("model_class")
    try:
        host = compose(model)[0].host.name
    except RetrofitError:
        host = None
    if made_for and host and made_for != host:
        return RetrofitError(f"the patch spec was made for host {made_for!r}, but this "
                             f"{type(model).__name__} is patched by host {host!r}. {fix}")
    about = f"host {made_for!r}" + (f", a {model_class}" if model_class else "")
    return RetrofitError(f"the patch spec (made for {about}) does not apply to this "
                         f"{type(model).__name__}: {exc}. {fix}")


def read_spec(spec: Mapping[str, Any] | str | Path) -> Mapping[str, Any]:
    """A patch spec (a dict, or a path to its JSON) checked for its schema version, the entries
    :func:`apply_spec` needs (arm, τ, ε) and their types; a clear :class:`RetrofitError`
    otherwise."""
    if not isinstance(spec, (Mapping, str, os.PathLike)):
        raise RetrofitError(f"a patch spec is a dict or the path of its JSON file, got "
                            f"{type(spec).__name__}; pass Retrofit.spec() or a saved spec's path")
    if not isinstance(spec, Mapping):
        try:
            text = read_text(spec, "the patch spec", "json", "pass a spec saved by "
                             "Retrofit.save_spec")
        except FileRefused as exc:
            raise RetrofitError(str(exc)) from None
        spec = parse_spec_json(text)
        if not isinstance(spec, Mapping):
            raise RetrofitError("a patch spec is a JSON object saved by Retrofit.save_spec")
    check_schema_version(spec, "the patch spec")
    check_spec_entries(spec)
    return spec
