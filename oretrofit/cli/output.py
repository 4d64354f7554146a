"""The one place the verbs print JSON (``--json``): strict JSON, one object per line.

A non-finite float is written as the string ``"NaN"``, ``"Infinity"`` or ``"-Infinity"`` (one
encoding for printed and written JSON: :mod:`oretrofit._files.json_numbers`), and ``allow_nan=False``
makes any that slipped past that an error rather than invalid output. A value JSON cannot hold
otherwise (a path, a dtype) is written as its ``str``.
"""

from __future__ import annotations

import json
from typing import Any

from .._files.json_numbers import encode_non_finite

__all__ = ["json_text", "print_json"]


def json_text(value: Any) -> str:
    """``value`` as one line of strict JSON (see the module docstring)."""
    return json.dumps(encode_non_finite(value), default=str, allow_nan=False)


def print_json(value: Any) -> None:
    """Print ``value`` as one line of strict JSON on stdout."""
    print(json_text(value))
