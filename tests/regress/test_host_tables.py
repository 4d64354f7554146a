"""`oretrofit tables --across-hosts`: one row per run folder and τ with each O arm's mean
ΔRMSE % against base, from a TabPFN run and a TabICL run, and its files written only where
oretrofit owns the names."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from oretrofit.cli.app import app
from oretrofit.regress.host_tables import host_table
from oretrofit.regress.store import read_cells

import tabicl  # noqa: F401  (the `tabicl` extra, in `all`)
from oretrofit import tabicl as tabicl_host
from oretrofit import tabpfn as tabpfn_host

SMALL = ["--datasets", "sklearn:diabetes", "--seeds", "11,23", "--max-train", "32",
         "--max-test", "16", "--no-plots"]


def _invoke(*args: object):
    return CliRunner().invoke(app, [str(a) for a in args])


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A TabPFN run (τ 1e-8 and 1, both O arms) and a TabICL run (τ 1e-8, OA only)."""
    root = tmp_path_factory.mktemp("hosts")
    tabpfn = tabpfn_host.write_random_checkpoint(root / "tabpfn-v3-random.ckpt", "small", seed=5)
    tabicl_ckpt = tabicl_host.write_random_checkpoint(root / "tabicl.ckpt", "regressor", seed=3)
    first = _invoke("regress", "--model-path", tabpfn, "--tau", "1e-8,1", "--out",
                    root / "tabpfn-run", *SMALL)
    second = _invoke("regress", "--host", "tabicl", "--model-path", tabicl_ckpt, "--arms",
                     "base,oa", "--tau", "1e-8", "--out", root / "tabicl-run", *SMALL)
    assert first.exit_code == 0 and second.exit_code == 0, first.output + second.output
    return root / "tabpfn-run", root / "tabicl-run"


def _mean_d_rmse(folder: Path, arm: str, tau: float) -> float:
    """The mean over (dataset, seed) cells of 100·(RMSE_arm/RMSE_base − 1), from the cells."""
    _, _, cells = read_cells([folder])
    base = {c["seed"]: c["rmse"] for c in cells if c["arm"] == "base"}
    d = [100 * (c["rmse"] / base[c["seed"]] - 1) for c in cells
         if c["arm"] == arm and c["tau"] == tau]
    assert len(d) == 2
    return sum(d) / len(d)


def test_one_row_per_folder_and_tau_with_each_arms_mean_change(runs, tmp_path):
    tabpfn, tabicl_run = runs
    result = _invoke("tables", "--across-hosts", tabpfn, tabicl_run, "--out", tmp_path / "cmp",
                     "--json")
    assert result.exit_code == 0, result.output
    summary = json.loads(result.stdout)
    assert summary["kind"] == "oretrofit.tables.hosts"
    rows = summary["rows"]
    assert [(r["host"], r["run"], r["tau"], r["cells"]) for r in rows] == [
        ("tabpfn", "tabpfn-run", 1e-8, 2), ("tabpfn", "tabpfn-run", 1.0, 2),
        ("tabicl", "tabicl-run", 1e-8, 2)]
    for row, folder in zip(rows, (tabpfn, tabpfn, tabicl_run)):
        for arm in ("oa", "full-o") if row["host"] == "tabpfn" else ("oa",):
            assert row["d_rmse_pct"][arm] == pytest.approx(
                _mean_d_rmse(folder, arm, row["tau"]), rel=1e-9, abs=1e-12)
    assert rows[2]["d_rmse_pct"]["full-o"] is None               # not run: no value
    assert abs(rows[1]["d_rmse_pct"]["full-o"]) > 1e-3            # τ = 1 moves the host
    assert sorted(summary["files"]) == ["hosts.md", "hosts.tex"]
    markdown = (tmp_path / "cmp" / "hosts.md").read_text()
    assert "| tabicl | tabicl-run | 1e-08 | 2 |" in markdown and "| — |" in markdown
    assert r"\begin{tabular}" in (tmp_path / "cmp" / "hosts.tex").read_text()
    printed = _invoke("tables", "--across-hosts", tabpfn, tabicl_run, "--out", tmp_path / "cmp")
    assert printed.exit_code == 0 and printed.stdout.strip() == markdown.strip()   # rewritten
    assert printed.stdout.strip().startswith("### ΔRMSE % against base across hosts")


def test_the_library_table_matches_the_verb(runs):
    table = host_table(list(runs))
    assert table.header == ["Host", "Run", "τ", "Cells", "OA ΔRMSE %", "Full-O ΔRMSE %"]
    expected = _mean_d_rmse(runs[1], "oa", 1e-8)
    assert table.rows[2] == ["tabicl", "tabicl-run", "1e-08", "2", f"{expected:+.3f}%", "—"]


def test_default_output_is_the_first_folders_tables(runs):
    result = _invoke("tables", "--across-hosts", *runs)
    assert result.exit_code == 0, result.output
    assert (runs[0] / "tables" / "hosts.md").read_text().strip() == result.stdout.strip()


def test_folders_of_different_hosts_are_not_merged_and_the_refusal_names_the_verb(runs):
    result = _invoke("tables", *runs, "--no-plots")
    assert result.exit_code != 0
    assert "--across-hosts" in result.output and "host" in result.output


def test_a_file_oretrofit_did_not_write_is_never_replaced(runs, tmp_path):
    out = tmp_path / "cmp"
    out.mkdir()
    (out / "hosts.tex").write_text("my own\n")
    result = _invoke("tables", "--across-hosts", *runs, "--out", out)
    assert result.exit_code != 0
    assert "hosts.tex, which oretrofit did not write" in result.output
    assert (out / "hosts.tex").read_text() == "my own\n" and not (out / "hosts.md").exists()


def test_a_folder_that_is_not_a_run_is_refused_by_name(tmp_path):
    (tmp_path / "empty").mkdir()
    result = _invoke("tables", "--across-hosts", tmp_path / "empty", "--out", tmp_path / "o")
    assert result.exit_code != 0 and "empty" in result.output
    assert not (tmp_path / "o" / "hosts.md").exists()
