"""`oretrofit sweep operators`: receipt with provenance, Markdown with the paper's values."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from typer.testing import CliRunner

from oretrofit.cli.app import app


def test_sweep_operators_quick_writes_receipt_and_table(tmp_path) -> None:
    result = CliRunner().invoke(app, ["sweep", "operators", "--quick", "--out", str(tmp_path),
                                      "--json"])
    assert result.exit_code == 0, result.output
    receipt = json.loads(result.stdout)
    assert receipt["schema_version"] == 1 and receipt["config"]["quick"] is True
    assert receipt["environment"]["device"] == "cpu" and "torch" in receipt["environment"]["packages"]
    assert json.loads((tmp_path / "operators-quick.json").read_text()) == receipt
    for table in ("table1", "table6"):
        for case in receipt[table]["cases"]:
            assert case["finite"]
            assert case["inserted_receiver_output"] == 0.0 and case["inserted_source_weight"] == 0.0
            assert case["empty_support"] == 0.0 and case["fully_masked"] == 0.0
            assert case["equation_output"] < 1e-6 and case["insertion_old_weight"] < 1e-6
            assert abs(case["near_origin_slope"] - 2.0) < 1e-3
    assert all(c["inserted_output"] == 0.0 and c["gradients_finite"] for c in receipt["b5"]["cases"])
    markdown = (tmp_path / "operators-quick.md").read_text()
    assert "≤ 8.94×10⁻⁸" in markdown and "| Canonical equation |" in markdown
    assert "**B.5 — OStandardize**" in markdown


def test_sweep_rejects_unknown_device(tmp_path) -> None:
    result = CliRunner().invoke(app, ["sweep", "operators", "--device", "tpu", "--out",
                                      str(tmp_path)])
    assert result.exit_code != 0
    assert "Invalid value for '--device': 'tpu' is not one of cpu, cuda" in result.output


def test_a_second_sweep_on_the_same_out_is_refused_by_name_and_loses_nothing(tmp_path) -> None:
    first = CliRunner().invoke(app, ["sweep", "operators", "--quick", "--out", str(tmp_path)])
    assert first.exit_code == 0, first.output
    receipt = tmp_path / "operators-quick.json"
    before = receipt.read_bytes(), (tmp_path / "operators-quick.md").read_bytes()
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import time
            from oretrofit._files.lock import receipt_lock
            with receipt_lock({str(receipt)!r}):
                print("locked", flush=True)
                time.sleep(120)
        """)], stdout=subprocess.PIPE, text=True,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])})
    try:
        assert holder.stdout.readline().strip() == "locked"
        second = CliRunner().invoke(app, ["sweep", "operators", "--quick", "--out",
                                          str(tmp_path)])
        assert second.exit_code == 2
        assert (f"error: {receipt} is in use by another run (host " in second.output
                and f"pid {holder.pid}," in second.output), second.output
        assert (receipt.read_bytes(), (tmp_path / "operators-quick.md").read_bytes()) == before
    finally:
        holder.kill()
        holder.wait()


def test_a_users_own_files_of_the_sweeps_names_are_never_replaced(tmp_path) -> None:
    (tmp_path / "operators-quick.md").write_text("my notes")
    refused = CliRunner().invoke(app, ["sweep", "operators", "--quick", "--out", str(tmp_path)])
    assert refused.exit_code == 2
    assert (f"error: {tmp_path} holds operators-quick.md, which oretrofit did not write"
            in refused.output), refused.output
    assert (tmp_path / "operators-quick.md").read_text() == "my notes"
    assert not (tmp_path / "operators-quick.json").exists()
