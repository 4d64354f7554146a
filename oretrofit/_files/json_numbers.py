"""Non-finite numbers in the JSON oretrofit writes: one encoding, for printed and written JSON.

JSON has no NaN or infinity, and a bare ``NaN`` (what :func:`json.dumps` writes by default) breaks
strict parsers (``jq``, JavaScript, most other languages). A non-finite float is written as the
string ``"NaN"``, ``"Infinity"`` or ``"-Infinity"`` (the tokens Python would have written,
quoted): :func:`encode_non_finite`, used by ``--json`` output (:mod:`oretrofit.cli.output`) and
every file :func:`oretrofit._files.provenance.write_json_atomic` writes. A reader turns such a string
back into its float where a number belongs (:func:`decode_number`; e.g. the R² of a constant
test target, which is NaN), so what is written reads back as it was.
"""

from __future__ import annotations

import json
import math
from typing import Any

__all__ = ["NON_FINITE", "encode_non_finite", "decode_number", "as_written"]

# The name each non-finite float is written as.
NON_FINITE = {"NaN": math.nan, "Infinity": math.inf, "-Infinity": -math.inf}


def encode_non_finite(value: Any, _open: frozenset[int] = frozenset()) -> Any:
    """``value`` with every non-finite float (in dicts, lists and tuples too) replaced by its
    name in :data:`NON_FINITE`; tuples become lists, as JSON writes them. A container that holds
    itself is a ValueError, as :func:`json.dumps` has it (``_open``: the containers entered)."""
    if isinstance(value, float) and not math.isfinite(value):
        return "NaN" if math.isnan(value) else "Infinity" if value > 0 else "-Infinity"
    if not isinstance(value, (dict, list, tuple)):
        return value
    if id(value) in _open:
        raise ValueError("Circular reference detected")
    inside = _open | {id(value)}
    if isinstance(value, dict):
        return {key: encode_non_finite(item, inside) for key, item in value.items()}
    return [encode_non_finite(item, inside) for item in value]


def decode_number(value: Any) -> Any:
    """The float a name of :data:`NON_FINITE` stands for (where a number belongs); any other
    value as it is."""
    return NON_FINITE.get(value, value) if isinstance(value, str) else value


def as_written(value: Any) -> Any:
    """``value`` as a JSON file oretrofit writes holds it, read back (tuples as lists, a path as
    its ``str``, a non-finite float by name): comparable with ``==`` to what is stored."""
    return json.loads(json.dumps(encode_non_finite(value), default=str))
