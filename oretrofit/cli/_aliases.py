"""Wrappers that register one verb's callback under another name or with an argument fixed."""

from __future__ import annotations

import functools
import inspect
import sys
from typing import Any, Callable


def renamed(callback: Callable[..., Any], old: str, now: str) -> Callable[..., Any]:
    """``callback`` for a hidden alias: says on stderr that ``old`` is now ``now``, then runs it."""

    @functools.wraps(callback)
    def alias(**kwargs: Any) -> Any:
        print(f"note: `oretrofit {old}` is now `{now}`; the old name goes in the next release",
              file=sys.stderr)
        return callback(**kwargs)

    return alias


def fixed(callback: Callable[..., Any], **values: Any) -> Callable[..., Any]:
    """``callback`` with the parameters in ``values`` set and left out of its command line."""
    signature = inspect.signature(callback)

    @functools.wraps(callback)
    def run(**kwargs: Any) -> Any:
        return callback(**kwargs, **values)

    run.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[p for name, p in signature.parameters.items() if name not in values])
    return run
