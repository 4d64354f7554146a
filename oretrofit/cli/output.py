"""The one place the verbs print JSON (``--json``): strict JSON, one object per line.

JSON has no NaN or infinity, and a bare ``NaN`` (what :func:`json.dumps` writes by default) breaks
strict parsers (``jq``, JavaScript, most other languages). A non-finite float is written as the
string ``"NaN"``, ``"Infinity"`` or ``"-Infinity"`` (the tokens Python would have written,
quoted), and ``allow_nan=False`` makes any that slipped past that an error rather than invalid
output. A value JSON cannot hold otherwise (a path, a dtype) is written as its ``str``.
"""

from __future__ import annotations

import json
import math
from typing import Any

__all__ = ["json_text", "print_json"]

_NON_FINITE = {math.inf: "Infinity", -math.inf: "-Infinity"}


def _strict(value: Any) -> Any:
    """``value`` with every non-finite float replaced by its name (a string)."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else _NON_FINITE[value]
    if isinstance(value, dict):
        return {key: _strict(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_strict(item) for item in value]
    return value


def json_text(value: Any) -> str:
    """``value`` as one line of strict JSON (see the module docstring)."""
    return json.dumps(_strict(value), default=str, allow_nan=False)


def print_json(value: Any) -> None:
    """Print ``value`` as one line of strict JSON on stdout."""
    print(json_text(value))
