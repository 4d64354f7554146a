"""`oretrofit regress --host tabdpt` end to end, in an environment with tabdpt (`make
test-tabdpt`), on a random checkpoint in the vendor's format."""

from __future__ import annotations

from pathlib import Path

from typer.testing import CliRunner

from oretrofit.cli.app import app
from oretrofit.regress.host_tables import host_table
from oretrofit.regress.store import read_cells


def test_regress_host_tabdpt_runs_every_arm_end_to_end(checkpoint: Path, tmp_path: Path):
    out = tmp_path / "run"
    result = CliRunner().invoke(app, [
        "regress", "--host", "tabdpt", "--model-path", str(checkpoint), "--out", str(out),
        "--datasets", "sklearn:diabetes", "--seeds", "11", "--max-train", "32",
        "--max-test", "16", "--no-plots", "--tau", "1e-8"])
    assert result.exit_code == 0, result.output
    settings, _, cells = read_cells([out])
    assert settings["host"] == "tabdpt"
    assert sorted(c["arm"] for c in cells) == ["base", "full-o", "oa"]
    assert all(c["sites_patched"] > 0 for c in cells if c["arm"] != "base")
    rmse = {c["arm"]: c["rmse"] for c in cells}
    assert abs(rmse["full-o"] - rmse["base"]) <= 1e-5 * rmse["base"]     # τ → 0: the host
    tables = (out / "tables" / "tables.md").read_text()
    assert "Table 2 layout" in tables and "Table 7 layout" in tables
    assert host_table([out]).rows[0][:3] == ["tabdpt", "run", "1e-08"]
