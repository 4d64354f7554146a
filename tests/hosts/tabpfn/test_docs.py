"""docs/tabpfn.md: its Python and command-line examples run as shown, its benchmark table is
the receipt's, and the version gate is the compat table's passing rows."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
from typer.testing import CliRunner

from oretrofit.cli.app import app
from oretrofit.hosts.tabpfn import releases

ROOT = Path(__file__).resolve().parents[3]
DOC = (ROOT / "docs" / "tabpfn.md").read_text()


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", DOC, flags=re.S)


def test_python_example_runs(capsys):
    (code,) = _blocks("python")
    exec(compile(code, "docs/tabpfn.md", "exec"), {})
    printed = capsys.readouterr().out.splitlines()
    assert printed[1] == "te.col" and printed[2] == "(75, 3)"


@pytest.mark.parametrize("line", [line for block in _blocks("console")
                                  for line in block.splitlines() if line.startswith("$ ")])
def test_console_example_runs(line, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    words = shlex.split(line[2:])
    assert words[0] == "oretrofit"
    result = CliRunner().invoke(app, words[1:])
    assert result.exit_code == 0, result.output
    if "--out" in words:
        assert (tmp_path / words[words.index("--out") + 1]).exists()


def test_benchmark_table_is_the_receipts():
    receipt = json.loads((ROOT / "results" / "bench_retrofit.json").read_text())
    assert receipt["markdown"].strip() in DOC
    assert all("cached_time_ratio" in row for row in receipt["rows"])


def test_the_gate_is_the_compat_tables_passing_rows():
    rows = [line.split("|")[1:3] for line in
            (ROOT / "results" / "tabpfn-compat.md").read_text().splitlines()
            if re.match(r"\| \d+\.\d+\.\d+ \|", line)]
    passing = tuple(release.strip() for release, outcome in rows          # "pass (COMMIT)": a row
                    if re.fullmatch(r"pass( \([0-9a-f]+\))?", outcome.strip()))  # of an earlier sweep
    assert passing == releases.TESTED_RELEASES
    assert {release.strip() for release, _ in rows} >= set(passing)
