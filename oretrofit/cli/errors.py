"""Plain-text error output for every verb: ``error: <message>`` on stderr, exit status 2.

Messages are printed verbatim (no rich markup), so ``[...]`` in a path or value shows as
typed. An exception a verb does not handle itself reaches :func:`run` (the entry point's
wrapper) and is printed the same way, without a traceback; ``ORETROFIT_TRACEBACK=1`` re-raises
it for debugging.
"""

from __future__ import annotations

import os
import sys
from typing import Callable, NoReturn

import typer

__all__ = ["EXIT_ERROR", "fail", "message", "run", "warn"]

EXIT_ERROR = 2


def message(exc: BaseException) -> str:
    """The one-line text of an error: its message, prefixed by the type when that is unclear."""
    text = str(exc).strip()
    if isinstance(exc, (ValueError, OSError, RuntimeError)) and text:
        if isinstance(exc, OSError) and exc.filename is not None and str(exc.filename) not in text:
            text = f"{exc.filename}: {text}"
        return text
    if isinstance(exc, KeyError):
        return f"missing entry {text}"
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _print(text: str) -> None:
    sys.stderr.write(text + "\n")
    sys.stderr.flush()


def warn(text: str) -> None:
    """A plain ``note:`` line on stderr."""
    _print(f"note: {text}")


def fail(exc: BaseException | str) -> typer.Exit:
    """Print ``error: <message>`` (plain text) and return the Exit to raise."""
    _print(f"error: {exc if isinstance(exc, str) else message(exc)}")
    return typer.Exit(EXIT_ERROR)


def run(app: Callable[[], object]) -> NoReturn:
    """Call the typer app; an escaping exception becomes one plain ``error:`` line, exit 2."""
    try:
        app()
    except KeyboardInterrupt:
        _print("error: interrupted")
        sys.exit(130)
    except Exception as exc:  # noqa: BLE001  (every verb's unhandled error, printed plainly)
        if os.environ.get("ORETROFIT_TRACEBACK"):
            raise
        fail(exc)
        sys.exit(EXIT_ERROR)
    sys.exit(0)
