"""`oretrofit sweep operators`: receipt with provenance, Markdown with the paper's values."""

from __future__ import annotations

import json

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
