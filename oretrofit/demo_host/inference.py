"""Named inference configurations for the demo host: how tabpfn preprocesses a table before the model.

A v3 checkpoint carries its own ``inference_config`` (tabpfn's ``InferenceConfig`` as a dict):
the ensemble members' feature transforms, whether a hash "fingerprint" column is added, the
target transforms. tabpfn's defaults were made for Prior Labs' prior. The demo host's prior
(:mod:`oretrofit.demo_host.prior`) shows it standardised columns only: at most 14 of them, no
fingerprint column, no transformed copies appended beside the originals. The presets below
range from tabpfn's defaults to configurations that show the host only what its prior
showed it, so the choice between them can be measured (on the validation datasets, never on
the evaluation datasets the issue's targets are judged on).

Every preset but ``v2`` (tabpfn's v2 default, whole) keeps tabpfn's v2.5 regression default for
all fields it does not name. Any preset name may end in ``-xN`` to fix the ensemble size at N
members (``N_ESTIMATORS``; without it tabpfn's "auto", 8 for these tables): ``v2-no-ypower-x16``.
"""

from __future__ import annotations

import dataclasses
import functools
import re
from typing import Any, Callable

__all__ = ["DEFAULT_PRESET", "PRESETS", "check_preset", "describe", "inference_config", "inference_overrides",
           "preset_of", "recorded_preset"]

DEFAULT_PRESET = "v2.5"


def _tabpfn_default(version: str) -> Callable[[], Any]:
    """A builder of tabpfn's regression default InferenceConfig for model version ``version`` (V2, V2_5)."""
    def build() -> Any:
        from tabpfn.constants import ModelVersion
        from tabpfn.inference_config import InferenceConfig

        return InferenceConfig.get_default("regression", getattr(ModelVersion, version))
    return build


_v2_5 = _tabpfn_default("V2_5")


def _members(*names: str) -> list[Any]:
    """Ensemble members that transform each column in place (no originals appended, categories as numbers)."""
    from tabpfn.preprocessing.configs import PreprocessorConfig

    return [PreprocessorConfig(name, categorical_name="numeric", append_original=False) for name in names]


def _without_fingerprint(**changes: Callable[[], Any]) -> Callable[[], Any]:
    return lambda: dataclasses.replace(_v2_5(), FINGERPRINT_FEATURE=False,
                                       **{k: v() for k, v in changes.items()})


def _without_target_power(build: Callable[[], Any]) -> Callable[[], Any]:
    return lambda: dataclasses.replace(build(), REGRESSION_Y_PREPROCESS_TRANSFORMS=(None,))


# name -> (what it is, a builder of the full InferenceConfig), for the feature side ...
_FEATURE_PRESETS: dict[str, tuple[str, Callable[[], Any]]] = {
    "v2.5": ("tabpfn's v2.5 regression default: a coarse-quantile member with the originals appended and "
             "a squashing-scaler member; fingerprint column", _v2_5),
    "v2.5-no-fingerprint": ("the v2.5 default without the fingerprint column", _without_fingerprint()),
    "v2": ("tabpfn's v2 regression default: a quantile member with the originals and SVD features "
           "appended and a safe-power member with one-hot categories; fingerprint column", _tabpfn_default("V2")),
    "plain-quantile": ("standardised columns and a coarse-quantile member, each column in place; "
                       "no fingerprint", _without_fingerprint(
                           PREPROCESS_TRANSFORMS=lambda: _members("none", "quantile_uni_coarse"))),
    "plain": ("standardised columns only, as the prior shows them; no fingerprint",
              _without_fingerprint(PREPROCESS_TRANSFORMS=lambda: _members("none"))),
}
# ... each with tabpfn's target members (the raw target, and a Yeo-Johnson "safepower" transform of it
# for half the ensemble), and with the raw target only: the prior shows the host standardised targets,
# and inverting the power transform can throw a prediction far outside the train range.
PRESETS: dict[str, tuple[str, Callable[[], Any]]] = {
    **{name: (f"{what}; target members: raw and safe-power", build)
       for name, (what, build) in _FEATURE_PRESETS.items()},
    **{f"{name}-no-ypower": (f"{what}; target members: raw only", _without_target_power(build))
       for name, (what, build) in _FEATURE_PRESETS.items()},
}


_MEMBERS = re.compile(r"(?P<base>.+)-x(?P<members>[1-9][0-9]*)")


def _parse(name: str) -> tuple[str, int | None]:
    """(preset, ensemble members or None) of a name; refuse a name that is neither, listing the presets."""
    match = _MEMBERS.fullmatch(name)
    base, members = (match["base"], int(match["members"])) if match else (name, None)
    if base not in PRESETS:
        raise ValueError(f"unknown inference preset {name!r}; choose from {', '.join(PRESETS)} "
                         f"(each optionally with -xN for N ensemble members)")
    return base, members


def _build(name: str) -> Any:
    base, members = _parse(name)
    config = PRESETS[base][1]()
    return config if members is None else dataclasses.replace(config, N_ESTIMATORS=members)


def check_preset(name: str) -> None:
    """Refuse a name that is not a preset (optionally with ``-xN``), listing the presets."""
    _parse(name)


def describe(name: str) -> tuple[str, int]:
    """(what the preset does, in words; its ensemble members: N of ``-xN``, else tabpfn's default count)."""
    from tabpfn.preprocessing.ensemble import DEFAULT_N_ESTIMATORS

    base, members = _parse(name)
    return PRESETS[base][0], members or DEFAULT_N_ESTIMATORS


@functools.lru_cache(maxsize=None)
def _stored(name: str) -> dict[str, Any]:
    """The preset's stored config, built once (preset_of compares every preset); never mutated."""
    return dataclasses.asdict(_build(name))


def inference_config(name: str = DEFAULT_PRESET) -> dict[str, Any]:
    """The preset's full InferenceConfig as the dict a tabpfn checkpoint stores."""
    return dataclasses.asdict(_build(name))


def inference_overrides(name: str) -> dict[str, Any]:
    """The preset as ``TabPFNRegressor(inference_config=...)`` overrides: every field, so nothing
    of the checkpoint's own config survives."""
    config = _build(name)
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}


def recorded_preset(host: dict[str, Any]) -> str:
    """The preset an evaluation receipt's host entry ran with; receipts written before presets
    existed record none, and their hosts ran the checkpoints' v2.5 default."""
    return host.get("inference", DEFAULT_PRESET)


def preset_of(stored: dict[str, Any]) -> str | None:
    """The preset name (with ``-xN`` when it fixes the ensemble size) whose config equals a
    checkpoint's stored ``inference_config``, else None."""
    members = stored.get("N_ESTIMATORS", "auto")
    if not (members == "auto" or (isinstance(members, int) and members > 0)):
        return None
    # match the ensemble size apart: the presets themselves all leave it at "auto"
    unsized = {**stored, "N_ESTIMATORS": "auto"}
    base = next((name for name in PRESETS if _stored(name) == unsized), None)
    return base if base is None or members == "auto" else f"{base}-x{members}"
