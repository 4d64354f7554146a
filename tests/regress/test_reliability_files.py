"""Reliability, round 3, where files come in and go out: an OpenML cache runs no code, a symbolic
link in a run folder is never written through, numeric columns with stray strings and tables
wider than TabPFN's limit are refused by name, and calibrate names a constant target."""

from __future__ import annotations

import os
import pickle
import subprocess
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from oretrofit._files.atomic import TEMP_SUFFIX, LinkedPath, atomic_file
from oretrofit._files.written import ForeignFiles
from oretrofit.cli.app import app
from oretrofit.regress import Matrix, ModelSettings, render, run_matrix
from oretrofit.regress.data import MAX_FEATURES, DatasetUnavailable, load_dataset
from oretrofit.regress.protocol import SplitProtocol

SMALL = SplitProtocol(max_train=16, max_test=8)


def _table(path: Path, rows: int = 40) -> Path:
    frame = pd.DataFrame({"a": np.arange(rows, dtype=float), "b": np.arange(rows) % 7})
    frame["y"] = 0.5 * frame["a"] + frame["b"]
    frame.to_csv(path, index=False)
    return path


def _run(out: Path, data: Path, arms=("base", "oa")):
    return run_matrix(Matrix((f"file:{data}#y",), (11,), arms, (1.0,)), ModelSettings("demo"),
                      out, protocol=SMALL)


# --- the OpenML cache ---------------------------------------------------------------------------

def test_a_pickle_in_the_openml_cache_is_never_loaded(openml_cache, code_payload):
    folder = openml_cache / "org" / "openml" / "www" / "datasets" / "42"
    # a pickle that would load cleanly as another table is not read, nor one that runs code
    other = load_dataset("sklearn:friedman1")
    frame = pd.DataFrame(other.X[:, :3], columns=["p", "q", "target"])
    (folder / "dataset.pkl.py3").write_bytes(pickle.dumps((frame, [False] * 3, ["p", "q",
                                                                                  "target"])))
    (folder / "dataset.feather.attributes.pkl.py3").write_bytes(pickle.dumps(code_payload))
    (folder / "dataset.feather").write_bytes(pickle.dumps(code_payload))
    ds = load_dataset(42, openml_cache=openml_cache, network=False)
    assert not code_payload.marker.exists()
    assert ds.X.shape == (442, 10) and ds.source["data_file"] == "dataset.arff"
    assert ds.checksum == load_dataset(43, openml_cache=openml_cache, network=False).checksum


def test_the_openml_write_back_never_follows_a_link(openml_cache, tmp_path, monkeypatch):
    """openml writes features.xml into its scratch root; a dangling link of that name in the
    user's cache is a taken name, not a path to write."""
    folder = openml_cache / "org" / "openml" / "www" / "datasets" / "42"
    victim = tmp_path / "victim.txt"
    (folder / "qualities.xml").symlink_to(victim)
    from oretrofit.regress import data
    scratch = tmp_path / "work"
    scratch.mkdir()
    (scratch / "qualities.xml").write_text("<xml/>")
    data._write_back(scratch, folder, 42)
    assert not victim.exists() and (folder / "qualities.xml").is_symlink()


# --- symbolic links in a run folder -------------------------------------------------------------

def test_a_linked_lock_file_is_refused_and_its_target_kept(tmp_path):
    out, victim = tmp_path / "run", tmp_path / "precious.txt"
    victim.write_text("keep me")
    out.mkdir()
    (out / ".lock").symlink_to(victim)
    with pytest.raises(LinkedPath, match=r"\.lock is a symbolic link .*never writes through a "
                                         r"link: delete it"):
        _run(out, _table(tmp_path / "t.csv"))
    assert victim.read_text() == "keep me"


def test_tables_replace_a_link_and_never_write_its_target(tmp_path):
    """A link where oretrofit wrote a table before is replaced, never written through; one of a
    name it has not written there is not its own, and is refused (_files.written)."""
    out = tmp_path / "run"
    _run(out, _table(tmp_path / "t.csv"))
    (out / "tables").mkdir()
    victims = {name: tmp_path / f"precious-{name}" for name in ("tables.md", "summary.csv",
                                                                "delta_rmse.png")}
    for name, victim in victims.items():
        victim.write_text("keep me")
        (out / "tables" / name).symlink_to(victim)
    with pytest.raises(ForeignFiles, match="holds delta_rmse.png, summary.csv, tables.md, "
                                           "which oretrofit did not write"):
        render([out], plots=True)
    assert all((out / "tables" / name).is_symlink() for name in victims)
    for name in victims:
        (out / "tables" / name).unlink()
    render([out], plots=True)                                   # its own files now
    for name, victim in victims.items():
        (out / "tables" / name).unlink()
        (out / "tables" / name).symlink_to(victim)
    render([out], plots=True)
    for name, victim in victims.items():
        assert victim.read_text() == "keep me"
        assert not (out / "tables" / name).is_symlink() and (out / "tables" / name).stat().st_size


# --- temporary files of every atomic writer -------------------------------------------------------

def test_a_dead_writers_temp_file_is_swept_by_the_next_write_a_live_ones_kept(tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()
    host = os.uname().nodename.replace(".", "-")
    stale = tmp_path / f".spec.json.{host}.{dead.pid}.0bad{TEMP_SUFFIX}"
    live = tmp_path / f".spec.json.{host}.{os.getpid()}.0bad{TEMP_SUFFIX}"
    other_host = tmp_path / f".spec.json.elsewhere.{dead.pid}.0bad{TEMP_SUFFIX}"
    for path in (stale, live, other_host):
        path.write_text("{")
    with atomic_file(tmp_path / "out.bin") as fh:
        fh.write(b"done")
    assert not stale.exists() and live.exists() and other_host.exists()
    assert (tmp_path / "out.bin").read_bytes() == b"done"


def test_a_failed_write_leaves_the_old_file_and_no_temp_file(tmp_path):
    target = tmp_path / "out.json"
    target.write_text("old")
    with pytest.raises(RuntimeError), atomic_file(target, "w") as fh:
        fh.write("half")
        raise RuntimeError("killed mid-write")
    assert target.read_text() == "old" and sorted(tmp_path.iterdir()) == [target]


# --- columns and sizes ----------------------------------------------------------------------------

@pytest.mark.parametrize("column", ["a", "y"])
def test_a_numeric_column_with_a_stray_string_is_refused_by_column_and_row(tmp_path, column):
    frame = pd.DataFrame({"a": np.arange(30, dtype=float), "y": np.arange(30) * 0.5})
    frame[column] = frame[column].astype(object)
    frame.loc[17, column] = "n/a?"
    path = tmp_path / "t.csv"
    frame.to_csv(path, index=False)
    kind = "target" if column == "y" else "feature"
    with pytest.raises(DatasetUnavailable, match=rf"{kind} column '{column}' holds numbers but 1 "
                                                 r"value\(s\) that are not, first 'n/a\?' in row 17"):
        load_dataset(f"file:{path}#y")


def test_a_categorical_column_keeps_its_codes(tmp_path):
    frame = pd.DataFrame({"c": ["x", "y", "z", "1"] * 5, "y": np.arange(20.0)})
    path = tmp_path / "t.csv"
    frame.to_csv(path, index=False)
    ds = load_dataset(f"file:{path}#y")
    assert sorted(set(ds.X[:, 0])) == [0.0, 1.0, 2.0, 3.0]


def test_a_table_wider_than_tabpfns_limit_is_refused_before_loading_a_model(tmp_path):
    frame = pd.DataFrame(np.zeros((4, MAX_FEATURES + 1)), columns=[f"f{i}" for i in
                                                                    range(MAX_FEATURES + 1)])
    frame["y"] = np.arange(4.0)
    path = tmp_path / "wide.parquet"
    frame.to_parquet(path)
    with pytest.raises(DatasetUnavailable, match=f"{MAX_FEATURES + 1} feature columns, more "
                                                 f"than the {MAX_FEATURES}"):
        load_dataset(f"file:{path}#y")


def test_calibrate_names_a_constant_target(tmp_path):
    frame = pd.DataFrame({"a": np.arange(40.0), "y": np.full(40, 3.0)})
    frame.to_csv(tmp_path / "t.csv", index=False)
    result = CliRunner().invoke(app, ["calibrate", "--model-path", "demo", "--dataset",
                                      f"file:{tmp_path / 't.csv'}#y", "--seed", "11",
                                      "--out", str(tmp_path / "spec.json")])
    assert result.exit_code != 0 and "have a constant target (3)" in result.output, result.output
    assert "site '" not in result.output                       # no site is blamed
    assert not (tmp_path / "spec.json").exists()
