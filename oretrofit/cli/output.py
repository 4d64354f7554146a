"""The one place the verbs print JSON (``--json``): strict JSON, one object per line; and where
the ``oretrofit`` logger's progress and notices go (stderr, plain lines).

A non-finite float is written as the string ``"NaN"``, ``"Infinity"`` or ``"-Infinity"`` (one
encoding for printed and written JSON: :mod:`oretrofit._files.json_numbers`), and ``allow_nan=False``
makes any that slipped past that an error rather than invalid output. A value JSON cannot hold
otherwise (a path, a dtype) is written as its ``str``.
"""

from __future__ import annotations

import json
import logging
import sys
from typing import Any

from .._files.json_numbers import encode_non_finite

__all__ = ["json_text", "print_json", "show_progress"]


def json_text(value: Any) -> str:
    """``value`` as one line of strict JSON (see the module docstring)."""
    return json.dumps(encode_non_finite(value), default=str, allow_nan=False)


def print_json(value: Any) -> None:
    """Print ``value`` as one line of strict JSON on stdout."""
    print(json_text(value))


def show_progress() -> None:
    """Print the ``oretrofit`` logger's progress and notices (INFO and up) on stderr as plain
    lines: results go to stdout, everything else here. (A library user's program chooses its
    own: by default Python shows the warnings only.)"""
    logger = logging.getLogger("oretrofit")
    if not logger.handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(message)s"))
        logger.addHandler(handler)
        logger.setLevel(logging.INFO)
