"""run_study: one process at a time writes a study's receipt."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from typer.testing import CliRunner

from oretrofit.cli.app import app

ROOT = Path(__file__).resolve().parents[2]


def _holder(out: Path) -> subprocess.Popen:
    """A run of study ``ostandardize --quick`` into ``out`` that has finished its first run and
    is in its second (which waits), as a process of its own."""
    code = textwrap.dedent(f"""
        import time
        from oretrofit.studies import StudyOptions, run_study
        from oretrofit.studies.receipts import PlannedRun

        def waits():
            print("running", flush=True)
            time.sleep(120)

        class Study:
            NAME, TASKS = "ostandardize", ("float32",)

            def plan(self, options):
                return [PlannedRun("first", {{"i": 0}}, lambda: {{"value": 1}}),
                        PlannedRun("second", {{"i": 1}}, waits)]

            def report(self, runs, plan):
                return ""

        run_study(Study(), StudyOptions(quick=True), {str(out)!r}, quiet=True)
    """)
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, text=True,
                            env={**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1"})


def test_a_second_experiment_on_the_same_out_is_refused_by_name_and_loses_nothing(tmp_path):
    holder = _holder(tmp_path)
    receipt = tmp_path / "ostandardize-quick.json"
    try:
        assert holder.stdout.readline().strip() == "running"
        before = receipt.read_bytes()
        second = CliRunner().invoke(app, ["experiment", "ostandardize", "--quick", "--epochs",
                                          "2", "--out", str(tmp_path)])
        assert second.exit_code == 2
        assert (f"error: {receipt} is in use by another run (host " in second.output
                and f"pid {holder.pid}," in second.output and "another --out folder"
                in second.output), second.output
        assert receipt.read_bytes() == before                   # the first run's record
        assert list(json.loads(before)["runs"]) == ["first"]
        assert not (tmp_path / "ostandardize-quick.md").exists()
    finally:
        holder.kill()
        holder.wait()
    other = CliRunner().invoke(app, ["experiment", "adapters", "--quick", "--epochs", "1",
                                     "--report-only", "--out", str(tmp_path)])
    assert "in use" not in other.output                       # another study's receipt: free


def test_a_users_own_table_of_the_studys_name_is_never_replaced(tmp_path):
    (tmp_path / "ostandardize-quick.md").write_text("my notes")
    refused = CliRunner().invoke(app, ["experiment", "ostandardize", "--quick", "--epochs", "2",
                                       "--out", str(tmp_path)])
    assert refused.exit_code == 2
    assert (f"error: {tmp_path} holds ostandardize-quick.md, which oretrofit did not write"
            in refused.output), refused.output
    assert (tmp_path / "ostandardize-quick.md").read_text() == "my notes"
    assert not (tmp_path / "ostandardize-quick.json").exists()
