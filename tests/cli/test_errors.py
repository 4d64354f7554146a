"""Ctrl-C through the real entry point (``oretrofit.cli.app:main``): one ``interrupted:`` line
that says nothing is half-written and what to rerun, exit status 130."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# A verb that announces itself and then waits, registered on the real app before main() runs.
_SLEEPER = textwrap.dedent("""
    import sys, time
    from oretrofit.cli.app import app, main

    @app.command("wait")
    def wait() -> None:
        print("running", flush=True)
        time.sleep(60)

    sys.argv = ["oretrofit", "wait"]
    main()
""")


def test_ctrl_c_prints_one_line_and_exits_130():
    """typer turned the KeyboardInterrupt into a silent exit 130, before oretrofit's handler."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    with subprocess.Popen([sys.executable, "-c", _SLEEPER], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True, env=env) as process:
        assert process.stdout.readline() == "running\n"
        process.send_signal(signal.SIGINT)
        _, err = process.communicate(timeout=30)
    assert process.returncode == 130
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("interrupted: stopped by Ctrl-C; nothing is "
                                                   "half-written"), err
    assert "Rerun the same command" in lines[0] and "Traceback" not in err
