"""Ctrl-C through the real entry point (``oretrofit.cli.app:main``): one ``interrupted:`` line
that says nothing is half-written and what to rerun, exit status 130, wherever it lands while
the verb runs; once the verb is over, the exit is the verb's own (no traceback, no kill)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# A verb that announces itself and then waits (WAIT): in its body, in its context's close
# callback (after the verb returned, inside typer), or in an atexit handler (after the app is
# over, as the interpreter exits); registered on the real app before main() runs.
_SLEEPER = textwrap.dedent("""
    import atexit, sys, time
    import typer
    from oretrofit.cli.app import app, main

    def pause() -> None:
        print("running", flush=True)
        time.sleep({wait})

    @app.command("wait")
    def wait(ctx: typer.Context) -> None:
        print("working", flush=True)
        {where}

    sys.argv = ["oretrofit", "wait"]
    main()
""")
WHERE = {"verb": "pause()", "closing": "ctx.call_on_close(pause)", "exiting": "atexit.register(pause)"}


def _ctrl_c(where: str, wait: int) -> tuple[int, str, str]:
    """Run the waiting verb, send SIGINT once it waits ``where``; its status, stdout, stderr."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    script = _SLEEPER.format(wait=wait, where=WHERE[where])
    # the child starts with Ctrl-C's default disposition: a test that ran main() in this
    # process left it ignored here (main() ignores Ctrl-C once the app is over), and a child
    # inheriting SIG_IGN would never see the SIGINT
    with subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, env=env,
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL)
                          ) as process:
        assert process.stdout.readline() == "working\n"
        assert process.stdout.readline() == "running\n"
        process.send_signal(signal.SIGINT)
        out, err = process.communicate(timeout=60)
    return process.returncode, out, err


def test_ctrl_c_prints_one_line_and_exits_130():
    """typer turned the KeyboardInterrupt into a silent exit 130, before oretrofit's handler."""
    code, _, err = _ctrl_c("verb", 60)
    _one_interrupted_line(code, err)


def test_ctrl_c_after_the_verb_returned_still_says_so():
    """Landing while typer closes the verb's context (past the verb's own handler), typer exits
    130 silently; the entry point prints the line."""
    code, _, err = _ctrl_c("closing", 60)
    _one_interrupted_line(code, err)


def test_ctrl_c_while_the_interpreter_exits_leaves_the_verbs_exit():
    """After the app is over (an atexit handler still running, as libraries register), a
    Ctrl-C changes nothing: no traceback from the handler, the verb's status 0."""
    code, out, err = _ctrl_c("exiting", 3)
    assert (code, out, err) == (0, "", ""), err


def _one_interrupted_line(code: int, err: str) -> None:
    assert code == 130
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("interrupted: stopped by Ctrl-C; nothing is "
                                                   "half-written"), err
    assert "Rerun the same command" in lines[0] and "Traceback" not in err
