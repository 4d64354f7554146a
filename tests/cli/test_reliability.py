"""Issue 33's CLI cases through the real entry point (``oretrofit.cli.app:main``): every error
is one plain ``error:`` line (no traceback, no rich markup) that names the fix, and a refused
start writes nothing into ``--out``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pandas as pd
import pytest
import torch

from oretrofit.cli import errors
from oretrofit.cli.app import main

ROOT = Path(__file__).resolve().parents[2]
SMALL = ["--model-path", "demo", "--max-train", "16", "--max-test", "8", "--no-plots"]


def _cli(capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch, *args: object
         ) -> tuple[int, str, str]:
    monkeypatch.setattr(sys, "argv", ["oretrofit", *map(str, args)])
    with pytest.raises(SystemExit) as exit_:
        main()
    out, err = capsys.readouterr()
    return exit_.value.code, out, " ".join(err.split())


@pytest.fixture()
def table(tmp_path: Path) -> Path:
    path = tmp_path / "t.csv"
    pd.DataFrame({"a": range(40), "y": [0.5 * i for i in range(40)]}).to_csv(path, index=False)
    return path


def _refused(result: tuple[int, str, str], *fragments: str) -> str:
    code, out, err = result
    assert code == 2 and out == "" and "Traceback" not in err and "error: " in err
    err = err[err.index("error: "):]                # after the progress line, if any
    for fragment in fragments:
        assert fragment in err
    return err


def test_brackets_in_paths_and_values_are_shown_verbatim(capsys, monkeypatch, tmp_path, table):
    missing = tmp_path / "dir[x]" / "f.csv"
    _refused(_cli(capsys, monkeypatch, "regress", "--data", missing, "--target-column", "y",
                  "--out", tmp_path / "run", *SMALL), f"data file {missing} does not exist")
    result = _cli(capsys, monkeypatch, "regress", "--data", table, "--target", "[/bold]",
                  "--out", tmp_path / "run", *SMALL)
    _refused(result, "target column '[/bold]' not found; columns are a, y")
    assert "note: --target of `regress` is now --target-column" in result[2]
    _refused(_cli(capsys, monkeypatch, "regress", "--data", table, "--target-column", "y",
                  "--tau", "nan,inf", "--out", tmp_path / "run", *SMALL),
             "every τ must be a finite positive number, got [nan, inf]")
    assert not (tmp_path / "run" / "run.json").exists()


@pytest.mark.parametrize("option", [
    ["--device", "foo"], ["--device", "mps"], ["--device", "cuda"], ["--n-estimators", "0"],
    ["--seeds", "11,11"], ["--arms", "base,oa,base"], ["--n-jobs", "0"]])
def test_a_refused_setting_writes_nothing(capsys, monkeypatch, tmp_path, table, option):
    if option[-1] in ("cuda", "mps") and (torch.cuda.is_available()
                                          or torch.backends.mps.is_available()):
        pytest.skip("this machine has the accelerator")        # the refusal needs its absence
    out = tmp_path / "run"
    err = _refused(_cli(capsys, monkeypatch, "regress", "--data", table, "--target-column", "y",
                        "--out", out, *SMALL, *option))
    assert any(word in err for word in ("use", "list each once", ">= 1"))   # names the fix
    assert not (out / "run.json").exists()


def test_the_corrected_rerun_works_after_a_refusal(capsys, monkeypatch, tmp_path, table):
    out = tmp_path / "run"
    odd = tmp_path / "d[/bold]" / "t.csv"                  # a markup-like folder name
    odd.parent.mkdir(parents=True)
    table.rename(odd)
    _refused(_cli(capsys, monkeypatch, "regress", "--data", odd, "--target-column", "y",
                  "--out", out, "--device", "foo", *SMALL))
    code, stdout, err = _cli(capsys, monkeypatch, "regress", "--data", odd, "--target-column",
                             "y", "--arms", "base", "--seeds", "1", "--out", out, *SMALL)
    assert code == 0 and "Table 2 layout" in stdout           # no MarkupError on the way


def test_a_second_regress_on_the_same_out_is_refused(capsys, monkeypatch, tmp_path, table):
    out = tmp_path / "run"
    holder = subprocess.Popen(
        [sys.executable, "-c", textwrap.dedent(f"""
            import time
            from oretrofit.regress import RunFolder
            with RunFolder({str(out)!r}).lock():
                print("locked", flush=True)
                time.sleep(120)
        """)], env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "locked"
        _refused(_cli(capsys, monkeypatch, "regress", "--data", table, "--target-column", "y",
                      "--out", out, *SMALL),
                 f"{out} is in use by another run", f"pid {holder.pid}", "another --out folder")
    finally:
        holder.kill()
        holder.wait()


def test_patch_refusals_name_the_pattern_and_the_fix(capsys, monkeypatch):
    _refused(_cli(capsys, monkeypatch, "patch", "--model-path", "demo", "--arm", "base",
                  "--site-tau", "icl.*=1e-3"), "arm 'base' patches no site")
    _refused(_cli(capsys, monkeypatch, "patch", "--model-path", "demo", "--arm", "oa",
                  "--target", "re:icl.("),
             "site pattern 're:icl.(' is not a valid regular expression")
    _refused(_cli(capsys, monkeypatch, "patch", "--model-path", "demo", "--arm", "oa",
                  "--site-tau", "re:[=1e-3"),
             "site pattern 're:[' is not a valid regular expression")


def test_tables_names_a_corrupt_run_json(capsys, monkeypatch, tmp_path):
    (tmp_path / "run.json").write_text("{oops")
    _refused(_cli(capsys, monkeypatch, "tables", tmp_path, "--no-plots"),
             f"the run-folder record {tmp_path / 'run.json'} is not valid JSON (line 1, "
             "column 2", "restore it or re-run into a new --out folder")


@pytest.mark.parametrize("text, message", [
    ('{"settings": {}, "settings": {}}', "gives the key 'settings' twice in one object"),
    ('{"a": ' * 40 + "0" + "}" * 40, "nests objects or lists more than 32 levels deep, below "
                                     "['a']['a']"),
    ("[" * 100_000 + "]" * 100_000, "deeper than Python's JSON parser follows")])
def test_tables_refuses_a_run_json_with_a_key_twice_or_nested_too_deep(
        capsys, monkeypatch, tmp_path, text, message):
    """Run-folder JSON is parsed as strictly as a spec: a key given twice was kept silently,
    deep nesting a bare "maximum recursion depth exceeded"."""
    (tmp_path / "run.json").write_text(text)
    _refused(_cli(capsys, monkeypatch, "tables", tmp_path, "--no-plots"),
             f"the run-folder record {tmp_path / 'run.json'} ", message,
             "restore it or re-run into a new --out folder")


def test_an_unexpected_error_is_one_plain_line(capsys, monkeypatch):
    def broken() -> None:
        raise ZeroDivisionError("division by zero [bold]")
    with pytest.raises(SystemExit) as exit_:
        errors.run(broken)
    assert exit_.value.code == 2
    assert capsys.readouterr().err == "error: ZeroDivisionError: division by zero [bold]\n"


@pytest.mark.parametrize("args", [["sweep", "operators", "--quick", "--out", "{out}"],
                                  ["tables", "{run}", "--no-plots", "--out", "{out}"]])
@pytest.mark.parametrize("out, message", [
    ("file", "{file} is a file, not a folder, and --out {file} must be a folder"),
    ("file/sub", "{file} is a file, not a folder, so --out {file}/sub cannot be made under it")])
def test_an_out_folder_that_is_a_file_is_named_before_any_work(
        capsys, monkeypatch, tmp_path, table, args, out, message):
    """`sweep operators --out FILE` ran the whole sweep, then failed; `tables --out FILE` said
    "[Errno 17] File exists"."""
    import oretrofit.sweep
    monkeypatch.setattr(oretrofit.sweep, "run_operator_sweep", lambda *a, **k: pytest.fail(
        "the sweep ran before --out was checked"))
    file, run = tmp_path / "file", tmp_path / "run"
    file.write_text("x")
    if args[0] == "tables":
        _cli(capsys, monkeypatch, "regress", "--data", table, "--target", "y", "--out", run, *SMALL)
    given = [a.format(out=tmp_path / out, run=run) for a in args]
    _refused(_cli(capsys, monkeypatch, *given), message.format(file=file),
             "name an output path whose folders are folders, or move the file")
    assert file.read_text() == "x"


def test_demo_host_train_into_a_file_is_named(tmp_path):
    """`demo-host train --out FILE` said "[Errno 17] File exists"."""
    from oretrofit.demo_host.train import TrainConfig, train
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotADirectoryError, match=f"{tmp_path / 'file'} is a file, not a folder, "
                                                  f"and --out {tmp_path / 'file'} must be"):
        train(tmp_path / "file", TrainConfig(max_steps=1), progress=False)


def test_a_nan_r2_is_written_as_strict_json_and_read_back(capsys, monkeypatch, tmp_path):
    """A constant target's R² (NaN) was written as a bare NaN, which strict JSON parsers refuse,
    and two run folders holding the same NaN cell were "different results" (NaN != NaN)."""
    path = tmp_path / "c.csv"
    pd.DataFrame({"a": range(40), "y": [3.0] * 40}).to_csv(path, index=False)
    runs = [tmp_path / "r1", tmp_path / "r2"]
    for run in runs:
        code, _, err = _cli(capsys, monkeypatch, "regress", "--data", path, "--target", "y",
                            "--out", run, *SMALL)
        assert code == 0, err
    cells = sorted((runs[0] / "cells").glob("*.json"))
    assert cells
    for cell in cells:
        stored = json.loads(cell.read_text(), parse_constant=lambda token: pytest.fail(token))
        assert stored["r2"] == "NaN" and stored["rmse"] == pytest.approx(0.0, abs=1e-6)
    code, out, err = _cli(capsys, monkeypatch, "tables", *runs, "--no-plots", "--out",
                          tmp_path / "t")
    assert code == 0 and "error" not in err, err
    assert "undefined where base RMSE is 0" in out


def test_a_users_own_tables_in_an_out_folder_are_never_replaced(capsys, monkeypatch, tmp_path,
                                                                table):
    """`regress --out DIR` and `tables RUN --out DIR` overwrote the user's own tables.md,
    tables.tex and summary.csv."""
    users = {"tables.md": "my notes", "tables.tex": "my paper", "summary.csv": "mine,1\n"}

    def place(folder: Path) -> Path:
        folder.mkdir(parents=True)
        for name, text in users.items():
            (folder / name).write_text(text)
        return folder

    mine = place(tmp_path / "mine" / "tables")
    _refused(_cli(capsys, monkeypatch, "regress", "--data", table, "--target-column", "y",
                  "--arms", "base", "--seeds", "1", "--out", mine.parent, *SMALL),
             f"{mine} holds summary.csv, tables.md, tables.tex, which oretrofit did not write",
             "move them elsewhere")
    assert not (mine.parent / "run.json").exists()          # refused before any work
    out = tmp_path / "run"
    code, _, _ = _cli(capsys, monkeypatch, "regress", "--data", table, "--target-column", "y",
                      "--arms", "base", "--seeds", "1", "--out", out, *SMALL)
    assert code == 0
    theirs = place(tmp_path / "theirs")
    _refused(_cli(capsys, monkeypatch, "tables", out, "--out", theirs, "--no-plots"),
             f"{theirs} holds summary.csv, tables.md, tables.tex, which oretrofit did not write")
    for folder in (mine, theirs):
        assert {name: (folder / name).read_text() for name in users} == users
    fresh = tmp_path / "fresh"
    for _ in range(2):                                      # and again: its own files now
        code, stdout, _ = _cli(capsys, monkeypatch, "tables", out, "--out", fresh, "--no-plots")
        assert code == 0 and "Table 2 layout" in stdout
