"""Plain-text error output for every verb: ``error: <message>`` on stderr, exit status 2.

Messages are printed verbatim (no rich markup), so ``[...]`` in a path or value shows as
typed. An exception a verb does not handle itself reaches :func:`run` (the entry point's
wrapper) and is printed the same way, without a traceback; ``ORETROFIT_TRACEBACK=1`` re-raises
it for debugging. Ctrl-C prints one ``interrupted:`` line and exits 130 (:func:`interrupted`),
wherever it lands while the verb runs (typer's own handling, outside the verb, exits 130
silently: :func:`run` says it then); once the verb is over, a Ctrl-C is ignored, so the exit
that follows (closing the context, ``atexit`` handlers, the interpreter's teardown) is the
verb's own, never a traceback or a kill.
"""

from __future__ import annotations

import os
import signal
import sys
from typing import Callable, NoReturn

import typer

__all__ = ["EXIT_ERROR", "EXIT_INTERRUPTED", "fail", "interrupted", "message", "run", "warn"]

EXIT_ERROR = 2
EXIT_INTERRUPTED = 130                    # 128 + SIGINT, as shells report a Ctrl-C
_SAID: list[None] = []                    # one entry per interrupted line printed


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


def interrupted() -> typer.Exit:
    """Print what a Ctrl-C left behind and return the Exit (status 130) to raise."""
    _SAID.append(None)
    _print("interrupted: stopped by Ctrl-C; nothing is half-written (oretrofit writes each file "
           "whole or not at all). Rerun the same command to finish: regress, reproduce and "
           "experiment skip what is already done, demo-host train continues with --resume")
    return typer.Exit(EXIT_INTERRUPTED)


def run(app: Callable[[], object]) -> NoReturn:
    """Call the typer app; an escaping exception becomes one plain ``error:`` line, exit 2. (A
    Ctrl-C while a verb runs is handled in the app, where typer would swallow it: app.py.) Once
    the app is over, Ctrl-C is ignored and the exit is the app's; an exit 130 that printed no
    ``interrupted:`` line (typer's, for a Ctrl-C outside the verb) prints it here."""
    said = len(_SAID)
    try:
        try:
            app()
            code: int | str | None = 0
        finally:
            _ignore_ctrl_c()
    except SystemExit as exc:                 # typer's exit with the verb's status
        code = exc.code
    except KeyboardInterrupt:
        _ignore_ctrl_c()
        code = EXIT_INTERRUPTED
    except Exception as exc:  # noqa: BLE001  (every verb's unhandled error, printed plainly)
        if os.environ.get("ORETROFIT_TRACEBACK"):
            raise
        code = fail(exc).exit_code
    if code == EXIT_INTERRUPTED and len(_SAID) == said:
        interrupted()
    sys.exit(code)


def _ignore_ctrl_c() -> None:
    """From here on a Ctrl-C changes nothing: the work is over, only the exit is left."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
