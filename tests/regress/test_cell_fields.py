"""A cell edited by hand (or written by something else) is named with its field when a run
folder is read (:mod:`oretrofit.regress.cell_fields`), through `oretrofit tables`."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import pytest

from oretrofit.cli.app import main

ROOT = Path(__file__).resolve().parents[2]
RUN = ROOT / "results" / "regress" / "demo-host"


@pytest.fixture()
def run(tmp_path: Path) -> Path:
    """A copy of the committed demo-host run folder (its cells and receipts, not its tables)."""
    copy = tmp_path / "run"
    shutil.copytree(RUN, copy, ignore=shutil.ignore_patterns("tables"))
    return copy


def _tables(capsys, monkeypatch, run: Path) -> tuple[int, str]:
    monkeypatch.setattr(sys, "argv", ["oretrofit", "tables", str(run), "--no-plots",
                                      "--out", str(run / "tables")])
    with pytest.raises(SystemExit) as exit_:
        main()
    return exit_.value.code, " ".join(capsys.readouterr().err.split())


def test_the_committed_cells_are_sound(capsys, monkeypatch, run):
    assert _tables(capsys, monkeypatch, run)[0] == 0


@pytest.mark.parametrize("field, value, must", [
    ("rmse", "0.5", "a finite number ≥ 0"),          # a string RMSE broke `tables` unnamed
    ("rmse", float("inf"), "a finite number ≥ 0"),
    ("r2", float("-inf"), "a finite number (NaN for a constant target)"),
    ("seed", True, "an integer ≥ 0"), ("tau", 0, "null (base) or a finite number > 0"),
    ("arm", "o", "one of base, oa, full-o"), ("n_test", 2.5, "an integer ≥ 0"),
    ("presence", {"count": 3, "below_half": "x", "quantiles": {"0.5": 0.9}},
     "a presence profile")])
def test_a_cell_field_of_the_wrong_type_or_value_is_named_with_its_file(
        capsys, monkeypatch, run, field, value, must):
    cell = sorted((run / "cells").glob("*__oa__tau1e-08.json"))[0]
    record = json.loads(cell.read_text())
    record[field] = value
    cell.write_text(json.dumps(record))
    code, err = _tables(capsys, monkeypatch, run)
    assert code == 2 and f"error: {cell} field {field!r} is " in err, err
    assert f"but must be {must}" in err and "delete it and re-run" in err
    assert not (run / "tables").exists()
