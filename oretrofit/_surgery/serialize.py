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
from typing import Any, Mapping

import torch
from torch import nn

from .._files.atomic import atomic_file
from .._files.reading import FileRefused, parse_json
from .host import RetrofitError
from .._operators.presence import check_eps, check_positive
from .._files.provenance import weights_digest

__all__ = ["footprint", "attach", "strip", "unstrip", "check_spec", "check_spec_entries",
           "parse_spec_json",
           "calibrated_weights_digest", "check_calibrated_weights", "save"]

_STATE = "_oretrofit"                     # the per-module patch state set_site keeps
_HOOKS = ("_forward_hooks", "_forward_pre_hooks", "_backward_hooks", "_backward_pre_hooks",
          "_state_dict_hooks", "_load_state_dict_pre_hooks")


def footprint(model: nn.Module) -> list[tuple[int, tuple[str, ...], int]]:
    """What a retrofit may change on ``model`` besides O-class swaps: per module its attribute
    names (without the patch state) and its number of hooks. Equal before and after applying
    means the retrofit is class swaps only, and so serialisable."""
    return [(id(m), tuple(sorted(k for k in m.__dict__ if k != _STATE)),
             sum(len(getattr(m, h, ()) or ()) for h in _HOOKS)) for m in model.modules()]


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
    """Refuse a spec whose host, host versions, site list or uncovered modules differ from
    ``made``, the spec that applying it to this model gave (a cut or edited spec, another host,
    other versions)."""
    for key, what in (("host", "host"), ("host_versions", "host package versions"),
                      ("sites", "site list"), ("uncovered", "list of uncovered modules")):
        if spec[key] != made[key]:
            mine, theirs = made[key], spec[key]
            if key == "sites":
                mine, theirs = _site_difference(made[key], spec[key])
            raise RetrofitError(
                f"the patch spec does not fit this model: its {what} is {theirs!r}, applying "
                f"it here gives {mine!r}. Re-create the spec from this model and these "
                "versions (Retrofit.spec(), or `oretrofit patch --out`)")


# Every entry of a spec (Retrofit.spec()); each is checked on read or on apply, so none may be
# absent: a deleted entry would skip its check. ``calibration`` is null for an uncalibrated spec.
SPEC_KEYS = ("schema_version", "oretrofit", "host", "hosts", "host_versions", "arm", "tau", "eps",
             "site_tau", "targets", "exclude", "sites", "uncovered", "calibration")
# What a calibrated spec's record holds (oretrofit._surgery.calibrate.calibrate). It must also name the
# weights its τ were read from: ``weights_sha256`` (checked against the model on every apply) or,
# for a spec calibrated on a TabPFN checkpoint before that digest was recorded,
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
    """Refuse a spec that lacks an entry of :data:`SPEC_KEYS` or whose entries have the wrong
    type or value: ``arm`` a string, ``tau`` a positive finite number, ``eps`` one ≥ 0, ``site_tau`` an
    object of pattern -> positive τ, ``targets`` / ``exclude`` lists of strings (or null),
    ``sites`` / ``uncovered`` lists of strings, ``calibration`` null or an object holding
    :data:`CALIBRATION_KEYS` (its ``data`` an object); an arm ``base`` spec names no site, no
    site τ and no calibration. An entry outside :data:`SPEC_KEYS` and :data:`ARTIFACT_KEYS` (or
    a calibration entry outside its keys) and ``targets: []`` (which retrofit reads as no
    filter) are refused too. (A string where a list belongs would be read letter by letter.)"""
    def refuse(what: str) -> RetrofitError:
        return RetrofitError(f"the patch spec's {what}; {_SPEC_FIX}")

    missing = [key for key in SPEC_KEYS if key not in spec]
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
    if spec["arm"] == "base" and (spec["sites"] or site_tau or calibration is not None):
        raise refuse(f"arm is 'base', which patches nothing, but it names "
                     f"{len(spec['sites'])} site(s){', site τ' if site_tau else ''}"
                     f"{', a calibration' if calibration is not None else ''} (an edited arm?)")


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
