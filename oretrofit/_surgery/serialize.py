"""Serialising retrofitted models: pickle / ``torch.save`` / ``joblib.dump`` / ``copy.deepcopy``,
and checking a saved patch spec against the model it is applied to.

A patched module pickles as itself: its O-class is importable by name
(:mod:`oretrofit._surgery.patching`) and its per-site settings are plain data. The :class:`Retrofit`
handle stored on the model pickles as its *spec* only (``Retrofit.__reduce__``); the unpickled
handle re-applies that spec on first use (``oretrofit._surgery.registry._rebind``): it takes the class
swaps off the loaded model (:func:`strip`), applies the spec afresh and checks the result
against the spec (:func:`check_spec`), so its ``revert()`` and ``report()`` act on the loaded
(or copied) model and never on the original. This module imports no registry code.

A retrofit that also adds hooks and attributes (the transformers host) pickles them with the
model, and with them its undos (:func:`oretrofit._surgery.patching.portable`): the loaded model runs
retrofitted as it is, and its handle takes the loaded retrofit off with those undos before
re-applying the spec. One whose undos are closures (a user's site) is refused with a
:class:`RetrofitError` saying what to do.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Callable, Mapping, Sequence

import torch
from torch import nn

from .._files.atomic import atomic_file
from .._files.reading import FileRefused, parse_json
from .host import RetrofitError, Site, join_path
from .._operators.presence import check_eps, check_positive
from .._files.provenance import weights_digest

__all__ = ["attach", "strip", "unstrip", "check_spec", "site_records",
           "check_spec_entries", "parse_spec_json",
           "calibrated_weights_digest", "check_calibrated_weights", "save"]

_STATE = "_oretrofit"                     # the per-module patch state set_site keeps


def attach(model: nn.Module, key: str, handle: object) -> None:
    """Store ``handle`` as the first entry of ``model.__dict__``: pickle and deepcopy walk that
    dict in order, so the handle's ``__reduce__`` (and its refusal, for a retrofit that is not
    serialisable) comes before any hook or submodule."""
    rest = [(k, v) for k, v in model.__dict__.items() if k != key]
    model.__dict__.clear()
    model.__dict__[key] = handle
    model.__dict__.update(rest)


def strip(model: nn.Module) -> list[tuple[nn.Module, type, dict[str, Any]]]:
    """Take every O-class swap off ``model``; returns what :func:`unstrip` puts back."""
    taken = []
    for module in model.modules():
        state = module.__dict__.pop(_STATE, None)
        if state is not None:
            taken.append((module, type(module), state))
            module.__class__ = state["original_class"]
    return taken


def unstrip(taken: list[tuple[nn.Module, type, dict[str, Any]]]) -> None:
    for module, cls, state in taken:
        module.__class__ = cls
        module.__dict__[_STATE] = state


def check_spec(made: Mapping[str, Any], spec: Mapping[str, Any]) -> None:
    """Refuse a spec whose host, site list, sites or uncovered modules differ from ``made``, the
    spec that applying it to this model gave (a cut or edited spec, another host, another model).
    Sites are compared by their records (:func:`site_records`: kind, the classes and weight
    shapes of the modules they patch) where the spec has them (schema 2 on). Package versions
    (``host_versions``, ``oretrofit``) are provenance, not a lock: a spec made under another
    release applies wherever its sites match, and the host itself refuses a release it does not
    admit."""
    for key, what in (("host", "host"), ("sites", "site list"),
                      ("uncovered", "list of uncovered modules")):
        if spec[key] != made[key]:
            mine, theirs = made[key], spec[key]
            if key == "sites":
                mine, theirs = _site_difference(made[key], spec[key])
            raise _does_not_fit(f"its {what} is {theirs!r}, applying it here gives {mine!r}")
    recorded, records = spec.get("site_modules"), made["site_modules"]
    for name in () if recorded is None else (*records, *(n for n in recorded if n not in records)):
        difference = _record_difference(recorded.get(name), records.get(name))
        if difference:
            raise _does_not_fit(f"its site {name!r} {difference}")


def _does_not_fit(what: str) -> RetrofitError:
    return RetrofitError(f"the patch spec does not fit this model: {what}. Re-create the spec "
                         "from this model (Retrofit.spec(), or `oretrofit patch --out`)")


def site_records(model: nn.Module, sites: Sequence[Site]) -> dict[str, dict[str, Any]]:
    """What a spec records of each site (its ``site_modules``): the site's kind and, for each
    module it patches (:attr:`Site.modules`, else the modules at its ``scope``), the module's
    class name and the shape of each of its weights, both by path in ``model``. These, not
    package versions, say whether a spec fits a model: equal records mean the same sites, under
    whichever release built the model."""
    paths = {id(module): path for path, module in model.named_modules()}
    records = {}
    for site in sites:
        modules = site.modules or tuple(model.get_submodule(p) for p in site.scope or ())
        records[site.name] = {
            "kind": site.kind,
            "classes": {paths[id(m)] or "root": _site_class(m).__name__ for m in modules},
            "shapes": {join_path(paths[id(m)], name): "x".join(map(str, weight.shape)) or "scalar"
                       for m in modules for name, weight in m.named_parameters()}}
    return records


def _site_class(module: nn.Module) -> type:
    """The class a site record names for ``module``: its class before any O-class swap, or the
    class that one specialises in the same source file. transformers 4.x builds BERT's attention
    as ``BertSdpaSelfAttention(BertSelfAttention)`` under SDPA and as ``BertSelfAttention`` under
    eager (and 5.x always as the latter), so a choice of attention implementation is not a
    change of class; a user's subclass, defined elsewhere, is."""
    cls = module.__dict__.get(_STATE, {}).get("original_class", type(module))
    while len(cls.__bases__) == 1 and cls.__bases__[0].__module__ == cls.__module__:
        cls = cls.__bases__[0]
    return cls


def _record_difference(spec: Mapping[str, Any] | None, made: Mapping[str, Any] | None
                       ) -> str | None:
    """How one site's record in the spec differs from the record of the site here (None when
    it does not): either lacks it, or its kind, a module's path or class, a weight's path or
    shape differ."""
    if spec is None or made is None:
        return ("has no record in the spec's site_modules" if spec is None else
                "is recorded in the spec's site_modules, but is no site here")
    if spec["kind"] != made["kind"]:
        return f"is of kind {spec['kind']!r} in the spec, {made['kind']!r} here"
    for what, entry in (("module", "classes"), ("weight", "shapes")):
        theirs, mine = spec[entry], made[entry]
        for path in (*theirs, *(p for p in mine if p not in theirs)):
            if path not in mine:
                return f"has the {what} {path} ({theirs[path]}) in the spec, absent here"
            if path not in theirs:
                return f"has the {what} {path} ({mine[path]}) here, absent from the spec"
            if theirs[path] != mine[path]:
                noun = "class" if entry == "classes" else "shape"
                return (f"has the {what} {path} of {noun} {theirs[path]} in the spec, of {noun} "
                        f"{mine[path]} here")
    return None


# Every entry of a spec (Retrofit.spec()); each is checked on read or on apply, so none may be
# absent: a deleted entry would skip its check. ``calibration`` is null for an uncalibrated spec.
# ``oretrofit`` and ``host_versions`` are provenance (what made the spec), checked for type only.
SPEC_KEYS = ("schema_version", "oretrofit", "host", "hosts", "host_versions", "arm", "tau", "eps",
             "site_tau", "targets", "exclude", "sites", "site_modules", "uncovered", "calibration")
# Entries later schema versions added, with the version that added each: a spec of an earlier
# version lacks them (a schema 1 spec is checked by its site names only).
ADDED_IN = {"site_modules": 2}
# What a calibrated spec's record holds (oretrofit._surgery.calibrate.calibrate). It must also
# name the weights its τ were read from: ``weights_sha256`` (checked against the model on every
# apply) or, for a spec calibrated on a TabPFN checkpoint before that digest was recorded,
# ``data.checkpoint_sha256`` (checked against the checkpoint wherever one is loaded:
# make_regressor, ``oretrofit patch``, ``regress``, ``check``).
CALIBRATION_KEYS = ("delta", "quantile", "probe_tau", "data", "sites", "rule")
# Entries a spec may hold besides SPEC_KEYS: those a patched artifact's spec adds
# (``oretrofit patch --out``); and a calibration record's besides CALIBRATION_KEYS. Any other
# entry is refused: an entry no check reads (a misspelt ``site_tua``) would be silently ignored.
ARTIFACT_KEYS = ("source_checkpoint_sha256", "weights")
CALIBRATION_OPTIONAL_KEYS = ("weights_sha256",)
_SPEC_FIX = "re-create the spec (`oretrofit calibrate --out`, Retrofit.save_spec)"


def parse_spec_json(text: str) -> Any:
    """The JSON value of a patch spec file's ``text``, parsed strictly
    (:func:`oretrofit._files.reading.parse_json`: a key given twice, nesting too deep and text that is
    not JSON refused by key or path), each refusal a :class:`RetrofitError` saying to re-create
    the spec."""
    try:
        return parse_json(text, "the patch spec", _SPEC_FIX)
    except FileRefused as exc:
        raise RetrofitError(str(exc)) from None


def check_spec_entries(spec: Mapping[str, Any]) -> None:
    """Refuse a spec that lacks an entry of :data:`SPEC_KEYS` (those its schema version has:
    :data:`ADDED_IN`) or whose entries have the wrong type or value: ``arm`` a string, ``tau`` a
    positive finite number, ``eps`` one ≥ 0, ``site_tau`` an object of pattern -> positive τ,
    ``targets`` / ``exclude`` lists of strings (or null), ``sites`` / ``uncovered`` lists of
    strings, ``site_modules`` one record per site, ``host_versions`` an object of package ->
    release, ``calibration`` null or an object holding
    :data:`CALIBRATION_KEYS` (its ``data`` an object); an arm ``base`` spec names no site, no
    site τ and no calibration. An entry outside :data:`SPEC_KEYS` and :data:`ARTIFACT_KEYS` (or
    a calibration entry outside its keys) and ``targets: []`` (which retrofit reads as no
    filter) are refused too. (A string where a list belongs would be read letter by letter.)"""
    def refuse(what: str) -> RetrofitError:
        return RetrofitError(f"the patch spec's {what}; {_SPEC_FIX}")

    missing = [key for key in SPEC_KEYS
               if key not in spec and ADDED_IN.get(key, 1) <= spec["schema_version"]]
    if missing:
        raise RetrofitError(f"the patch spec lacks {', '.join(missing)} (every entry is checked "
                            f"when the spec is applied, so none may be left out); {_SPEC_FIX}")
    _refuse_unknown(spec, (*SPEC_KEYS, *ARTIFACT_KEYS), "")
    if not isinstance(spec["arm"], str):
        raise refuse(f"arm must be a string (oa, full-o, base), got {spec['arm']!r}")
    site_tau = spec.get("site_tau") or {}
    if not isinstance(site_tau, Mapping):
        raise refuse(f"site_tau must be an object of pattern -> τ, got {site_tau!r}")
    try:
        check_eps(spec["eps"])
        for name, value in (("tau", spec["tau"]),
                            *((f"site_tau[{k!r}]", v) for k, v in site_tau.items())):
            check_positive(name, value)
    except ValueError as exc:
        raise refuse(str(exc)) from None
    for key in ("targets", "exclude", "sites", "uncovered"):
        value = spec[key]
        if (value is not None or key in ("sites", "uncovered")) and not (
                isinstance(value, list) and all(isinstance(v, str) for v in value)):
            raise refuse(f"{key} must be a list of site names or patterns, got {value!r}")
    if not (isinstance(spec["host_versions"], Mapping)
            and all(isinstance(v, str) for v in spec["host_versions"].values())):
        raise refuse(f"host_versions must be an object of package -> release, got "
                     f"{spec['host_versions']!r:.80}")
    if "site_modules" in spec:
        _check_site_modules(spec["site_modules"], refuse)
    if spec["targets"] == []:
        raise refuse("targets is an empty list, which would keep no site, yet retrofit reads it "
                     "as no filter and patches every site: write null to patch every site, or "
                     "list the site patterns to keep")
    calibration = spec["calibration"]
    if calibration is not None:
        if not (isinstance(calibration, Mapping) and isinstance(calibration.get("data"), Mapping)):
            raise refuse("calibration record must be an object (with a data object) or null, "
                         f"got {calibration!r:.80}")
        absent = [key for key in CALIBRATION_KEYS if key not in calibration]
        if absent:
            raise refuse(f"calibration record lacks {', '.join(absent)}")
        _refuse_unknown(calibration, (*CALIBRATION_KEYS, *CALIBRATION_OPTIONAL_KEYS),
                        "calibration.")
        if "weights_sha256" not in calibration and "checkpoint_sha256" not in calibration["data"]:
            raise refuse("calibration record names no weights its τ were read from "
                         "(weights_sha256, or data.checkpoint_sha256)")
    if spec["arm"] == "base" and (spec["sites"] or spec.get("site_modules") or site_tau
                                  or calibration is not None):
        raise refuse(f"arm is 'base', which patches nothing, but it names "
                     f"{len(spec['sites'])} site(s)"
                     f"{', site records' if spec.get('site_modules') else ''}"
                     f"{', site τ' if site_tau else ''}"
                     f"{', a calibration' if calibration is not None else ''} (an edited arm?)")


def _check_site_modules(records: Any, refuse: Callable[[str], RetrofitError]) -> None:
    """Refuse ``site_modules`` unless it is an object of site -> record (:func:`site_records`:
    a kind, and objects of module path -> class and weight path -> shape); which sites it
    records is checked against the model (:func:`check_spec`)."""
    if not isinstance(records, Mapping):
        raise refuse(f"site_modules must be an object of site -> record, got {records!r:.80}")
    for name, record in records.items():
        if not (isinstance(record, Mapping) and set(record) == {"kind", "classes", "shapes"}
                and isinstance(record["kind"], str)
                and all(isinstance(entry, Mapping) and all(
                    isinstance(k, str) and isinstance(v, str) for k, v in entry.items())
                        for entry in (record["classes"], record["shapes"]))):
            raise refuse(f"site_modules[{name!r}] must be an object of kind (text), classes "
                         f"and shapes (objects of path -> text), got {str(record):.80}")


def _refuse_unknown(record: Mapping[str, Any], known: tuple[str, ...], path: str) -> None:
    """Refuse an entry of ``record`` (at ``path`` in the spec) that no check reads."""
    unknown = [key for key in record if key not in known]
    if unknown:
        raise RetrofitError(
            f"the patch spec has the unknown entr{'y' if len(unknown) == 1 else 'ies'} "
            f"{', '.join(repr(path + str(k)) for k in unknown)} (it knows "
            f"{', '.join(path + k for k in known)}); a misspelt entry would be ignored, so it "
            f"is refused: correct or remove it, or {_SPEC_FIX}")


def calibrated_weights_digest(model: nn.Module) -> str:
    """The SHA-256 of ``model``'s weights a calibrated spec records (``weights_sha256``): its
    state_dict with floating tensors in float32, so the same weights in float64 (or moved to
    another device) keep the digest."""
    return weights_digest({name: value.float() if value.is_floating_point() else value
                           for name, value in model.state_dict().items()})


def check_calibrated_weights(spec: Mapping[str, Any], model: nn.Module) -> None:
    """Refuse a calibrated ``spec`` for ``model`` when the spec's τ were read from other weights
    (its ``calibration.weights_sha256`` differs from :func:`calibrated_weights_digest`); an
    uncalibrated spec passes, and so does one whose record names its checkpoint instead
    (:data:`CALIBRATION_KEYS`: checked where the checkpoint is loaded)."""
    calibration = spec.get("calibration")
    recorded = calibration.get("weights_sha256") if isinstance(calibration, Mapping) else None
    if recorded is not None and recorded != calibrated_weights_digest(model):
        raise RetrofitError(f"the spec was calibrated on other weights (SHA-256 "
                            f"{str(recorded)[:12]}…) than this model's; calibrate this model "
                            "(`oretrofit calibrate --model`), or pass the model it was "
                            "calibrated on")


def _site_difference(made: list[str], wanted: list[str]) -> tuple[str, str]:
    if sorted(made) == sorted(wanted):
        first = next(i for i, (a, b) in enumerate(zip(made, wanted)) if a != b)
        return (f"{len(made)} sites, {made[first]!r} at position {first}",
                f"the same sites in another order ({wanted[first]!r} at position {first}; "
                "the order of sites is the order they are applied in)")
    extra, missing = sorted(set(made) - set(wanted)), sorted(set(wanted) - set(made))
    return (f"{len(made)} sites, {len(extra)} more: {', '.join(extra[:6])}",
            f"{len(wanted)} sites" + (f", {len(missing)} unknown: {', '.join(missing[:6])}"
                                      if missing else ""))


def save(obj: Any, path: str | os.PathLike[str]) -> Path:
    """``torch.save(obj, path)`` through a temporary file in the same folder and a rename
    (:mod:`oretrofit._files.atomic`), so a failure while pickling leaves an existing file at ``path``
    untouched. Load it with ``torch.load(path, weights_only=False)``, for files you trust only:
    unpickling runs code."""
    with atomic_file(path, "wb") as fh:
        torch.save(obj, fh)
    return Path(path)
