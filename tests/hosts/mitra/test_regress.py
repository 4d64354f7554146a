"""`oretrofit regress --host mitra` end to end, in the Mitra environment (`make test-mitra`), on
a random checkpoint directory in the vendor's format, at the vendor's defaults (fine-tuning at
every fit, a bfloat16 autocast forward: the arms' RMSEs differ by that rounding, not asserted
here; the estimators' exact contract is in test_estimators.py)."""

from __future__ import annotations

import math
from pathlib import Path

from typer.testing import CliRunner

from oretrofit.cli.app import app
from oretrofit.regress.host_tables import host_table
from oretrofit.regress.store import read_cells


def test_regress_host_mitra_runs_every_arm_end_to_end(checkpoints, tmp_path: Path):
    out = tmp_path / "run"
    result = CliRunner().invoke(app, [
        "regress", "--host", "mitra", "--model-path", str(checkpoints["regression"]),
        "--out", str(out), "--datasets", "sklearn:diabetes", "--seeds", "11",
        "--max-train", "32", "--max-test", "16", "--no-plots", "--tau", "1e-8"])
    assert result.exit_code == 0, result.output
    settings, _, cells = read_cells([out])
    assert settings["host"] == "mitra"
    assert sorted(c["arm"] for c in cells) == ["base", "full-o", "oa"]
    assert all(math.isfinite(c["rmse"]) and c["n_train"] == 32 for c in cells)
    assert all(c["sites_patched"] > 0 for c in cells if c["arm"] != "base")
    tables = (out / "tables" / "tables.md").read_text()
    assert "Table 2 layout" in tables and "Table 7 layout" in tables
    assert host_table([out]).rows[0][:3] == ["mitra", "run", "1e-08"]


def test_a_checkpoint_that_is_no_directory_is_refused_naming_the_format(tmp_path: Path):
    result = CliRunner().invoke(app, [
        "regress", "--host", "mitra", "--model-path", str(tmp_path / "missing"),
        "--out", str(tmp_path / "run"), "--datasets", "sklearn:diabetes", "--no-plots"])
    assert result.exit_code != 0
    assert "config.json and model.safetensors" in result.output
