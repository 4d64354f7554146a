"""Serialising retrofitted models: pickle / ``torch.save`` / ``joblib.dump`` / ``copy.deepcopy``,
and checking a saved patch spec against the model it is applied to.

A patched module pickles as itself: its O-class is importable by name
(:mod:`oretrofit._patching`) and its per-site settings are plain data. The :class:`Retrofit`
handle stored on the model pickles as its *spec* only (``Retrofit.__reduce__``); the unpickled
handle re-applies that spec on first use (``oretrofit._registry._rebind``): it takes the class
swaps off the loaded model (:func:`strip`), applies the spec afresh and checks the result
against the spec (:func:`check_spec`), so its ``revert()`` and ``report()`` act on the loaded
(or copied) model and never on the original. This module imports no registry code.

Only retrofits that consist of O-class swaps serialise this way; one that also added hooks or
attributes (the transformers hosts) is refused with a :class:`RetrofitError` saying what to do.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Mapping

import torch
from torch import nn

from ._atomic import atomic_file
from ._host import RetrofitError
from ._presence import check_positive
from ._provenance import weights_digest

__all__ = ["footprint", "attach", "strip", "unstrip", "check_spec", "check_spec_entries",
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
    """Refuse a spec whose host, host versions or site list differ from ``made``, the spec that
    applying it to this model gave (a cut or edited spec, another host, other versions)."""
    for key, what in (("host", "host"), ("host_versions", "host package versions"),
                      ("sites", "site list")):
        if key in spec and spec[key] != made[key]:
            mine, theirs = made[key], spec[key]
            if key == "sites":
                mine, theirs = _site_difference(made[key], spec[key])
            raise RetrofitError(
                f"the patch spec does not fit this model: its {what} is {theirs!r}, applying "
                f"it here gives {mine!r}. Re-create the spec from this model and these "
                "versions (Retrofit.spec(), or `oretrofit patch --out`)")


def check_spec_entries(spec: Mapping[str, Any]) -> None:
    """Refuse a spec whose entries have the wrong type or value: ``arm`` a string, ``tau`` and
    ``eps`` positive finite numbers, ``site_tau`` an object of pattern -> positive τ,
    ``targets`` / ``exclude`` / ``sites`` lists of strings (or null), ``calibration`` and its
    ``data`` objects. (A string where a list belongs would be read letter by letter.)"""
    fix = "re-create the spec (`oretrofit calibrate --out`, Retrofit.save_spec)"

    def refuse(what: str) -> RetrofitError:
        return RetrofitError(f"the patch spec's {what}; {fix}")

    if not isinstance(spec["arm"], str):
        raise refuse(f"arm must be a string (oa, full-o, base), got {spec['arm']!r}")
    site_tau = spec.get("site_tau") or {}
    if not isinstance(site_tau, Mapping):
        raise refuse(f"site_tau must be an object of pattern -> τ, got {site_tau!r}")
    try:
        for name, value in (("tau", spec["tau"]), ("eps", spec["eps"]),
                            *((f"site_tau[{k!r}]", v) for k, v in site_tau.items())):
            check_positive(name, value)
    except ValueError as exc:
        raise refuse(str(exc)) from None
    for key in ("targets", "exclude", "sites"):
        value = spec.get(key)
        if value is not None and not (isinstance(value, list)
                                      and all(isinstance(v, str) for v in value)):
            raise refuse(f"{key} must be a list of site names or patterns, got {value!r}")
    calibration = spec.get("calibration")
    if calibration is not None and not (isinstance(calibration, Mapping) and isinstance(
            calibration.get("data") or {}, Mapping)):
        raise refuse("calibration record must be an object (with a data object), got "
                     f"{calibration!r:.80}")


def calibrated_weights_digest(model: nn.Module) -> str:
    """The SHA-256 of ``model``'s weights a calibrated spec records (``weights_sha256``): its
    state_dict with floating tensors in float32, so the same weights in float64 (or moved to
    another device) keep the digest."""
    return weights_digest({name: value.float() if value.is_floating_point() else value
                           for name, value in model.state_dict().items()})


def check_calibrated_weights(spec: Mapping[str, Any], model: nn.Module) -> None:
    """Refuse a calibrated ``spec`` for ``model`` when the spec's τ were read from other weights
    (its ``calibration.weights_sha256`` differs from :func:`calibrated_weights_digest`); a spec
    without the record passes."""
    calibration = spec.get("calibration")
    recorded = calibration.get("weights_sha256") if isinstance(calibration, Mapping) else None
    if recorded is not None and recorded != calibrated_weights_digest(model):
        raise RetrofitError(f"the spec was calibrated on other weights (SHA-256 "
                            f"{str(recorded)[:12]}…) than this model's; calibrate this model "
                            "(`oretrofit calibrate --model`), or pass the model it was "
                            "calibrated on")


def _site_difference(made: list[str], wanted: list[str]) -> tuple[str, str]:
    extra, missing = sorted(set(made) - set(wanted)), sorted(set(wanted) - set(made))
    return (f"{len(made)} sites, {len(extra)} more: {', '.join(extra[:6])}",
            f"{len(wanted)} sites" + (f", {len(missing)} unknown: {', '.join(missing[:6])}"
                                      if missing else ""))


def save(obj: Any, path: str | os.PathLike[str]) -> Path:
    """``torch.save(obj, path)`` through a temporary file in the same folder and a rename
    (:mod:`oretrofit._atomic`), so a failure while pickling leaves an existing file at ``path``
    untouched. Load it with ``torch.load(path, weights_only=False)``, for files you trust only:
    unpickling runs code."""
    with atomic_file(path, "wb") as fh:
        torch.save(obj, fh)
    return Path(path)
