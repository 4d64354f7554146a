"""What each field of a stored cell (``RUN/cells/*.json``) must hold, checked when a run folder is
read (:meth:`oretrofit.regress.store.RunFolder.cells`): a cell edited by hand or written by
something else is named with its field before a table averages a string or an infinity.

Required fields are those every cell has had since the first run folders; the others are
checked when present (cells from before presence profiles have none). R² may be NaN: a constant
test target has no R² (:func:`oretrofit.regress.protocol.rmse_r2`), written as ``"NaN"``
(:mod:`oretrofit._files.json_numbers`) and read back as NaN by :func:`read_cell`; every other number is
finite.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping

from .._files.json_numbers import decode_number

__all__ = ["REQUIRED", "OPTIONAL", "read_cell", "cell_problem"]

Check = tuple[Callable[[Any], bool], str]


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _finite_at_least_0(value: Any) -> bool:
    return _number(value) and math.isfinite(value) and value >= 0


def _count(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _profile(value: Any) -> bool:
    """A presence profile (``PresenceProfile.summary()``): a count, and for a profile that saw
    presences its fraction below ½ and median within [0, 1]."""
    if not (isinstance(value, Mapping) and _count(value.get("count"))):
        return False
    if value["count"] == 0:
        return True
    quantiles = value.get("quantiles")
    return isinstance(quantiles, Mapping) and all(
        _number(v) and 0 <= v <= 1 for v in (value.get("below_half"), quantiles.get("0.5")))


_ARMS = ("base", "oa", "full-o")
_TEXT: Check = (lambda v: isinstance(v, str) and v != "", "a non-empty string")
_COUNT: Check = (_count, "an integer ≥ 0")
_SECONDS: Check = (_finite_at_least_0, "a finite number of seconds ≥ 0")

REQUIRED: dict[str, Check] = {
    "dataset": _TEXT,
    "seed": _COUNT,
    "arm": (lambda v: v in _ARMS, f"one of {', '.join(_ARMS)}"),
    "tau": (lambda v: v is None or (_number(v) and math.isfinite(v) and v > 0),
            "null (base) or a finite number > 0"),
    "rmse": (_finite_at_least_0, "a finite number ≥ 0"),
    "r2": (lambda v: _number(v) and not math.isinf(v), "a finite number (NaN for a constant "
                                                        "target)"),
}
OPTIONAL: dict[str, Check] = {
    "variant": _TEXT, "n_train": _COUNT, "n_test": _COUNT, "n_features": _COUNT,
    "fit_s": _SECONDS, "predict_s": _SECONDS, "wall_s": _SECONDS, "cpu_s": _SECONDS,
    "presence": (_profile, "a presence profile (count, below_half, quantiles)"),
    "presence_by_module": (lambda v: isinstance(v, Mapping) and all(map(_profile, v.values())),
                           "an object of module -> presence profile"),
}

# The fields that hold a number (a non-finite one is written by name, e.g. "NaN").
_NUMBERS = ("tau", "rmse", "r2", "fit_s", "predict_s", "wall_s", "cpu_s")


def read_cell(cell: Any) -> Any:
    """A stored ``cell`` as written: its number fields' non-finite names (``"NaN"``) read back
    as floats; anything but an object as it is (for :func:`cell_problem` to name)."""
    if not isinstance(cell, Mapping):
        return cell
    return {key: decode_number(value) if key in _NUMBERS else value
            for key, value in cell.items()}


def cell_problem(cell: Any) -> str | None:
    """What is wrong with a stored ``cell`` (the first field that is missing or holds the wrong
    type or value, named with its value), or None for a sound cell."""
    if not isinstance(cell, Mapping):
        return f"is not a cell record (a JSON object), but {type(cell).__name__}"
    missing = [key for key in REQUIRED if key not in cell]
    if missing:
        return f"is not a complete cell record: it lacks {', '.join(missing)}"
    for key, (valid, what) in (*REQUIRED.items(), *OPTIONAL.items()):
        if key in cell and not valid(cell[key]):
            return f"field {key!r} is {cell[key]!r:.60}, but must be {what}"
    return None
