"""Reliability, round 4, the run folder's own names: a symbolic link or a hard-linked file where
a run creates its lock, subfolders or tables is refused by name and never written through; an
output whose folder is a file is named; killed scratch folders are swept."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from oretrofit._files.atomic import LinkedPath, TEMP_SUFFIX, scratch_folder, write_text_atomic
from oretrofit.regress import Matrix, ModelSettings, render, run_matrix
from oretrofit.regress.protocol import SplitProtocol
from regress.test_reliability_files import _table

SMALL = SplitProtocol(max_train=16, max_test=8)


def _run(out: Path, data: Path):
    return run_matrix(Matrix((f"file:{data}#y",), (11,), ("base",), (1.0,)),
                      ModelSettings("random"), out, protocol=SMALL)


def test_a_hard_link_at_the_lock_is_refused_and_its_file_kept(tmp_path):
    victim = tmp_path / "victim.txt"
    victim.write_text("keep me\n")
    out = tmp_path / "run"
    out.mkdir()
    os.link(victim, out / ".lock")
    with pytest.raises(LinkedPath, match=r"\.lock is a file with 2 hard links"):
        _run(out, _table(tmp_path / "t.csv"))
    assert victim.read_text() == "keep me\n"


def test_a_named_pipe_at_the_lock_is_refused_by_what_it_is(tmp_path):
    out = tmp_path / "run"
    out.mkdir()
    os.mkfifo(out / ".lock")
    with pytest.raises(LinkedPath, match=r"\.lock is a named pipe \(FIFO\), not a file or folder"):
        _run(out, _table(tmp_path / "t.csv"))


@pytest.mark.parametrize("name", ["cells", "datasets", "invocations"])
def test_a_linked_subfolder_of_a_run_is_refused_and_nothing_written_there(tmp_path, name):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    out = tmp_path / "run"
    out.mkdir()
    (out / name).symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(LinkedPath, match=rf"run/{name} is a symbolic link \(to .*elsewhere\)"):
        _run(out, _table(tmp_path / "t.csv"))
    assert list(elsewhere.iterdir()) == []


def test_a_linked_tables_folder_is_refused_and_nothing_written_there(tmp_path):
    out = tmp_path / "run"
    _run(out, _table(tmp_path / "t.csv"))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (out / "tables").symlink_to(elsewhere, target_is_directory=True)
    with pytest.raises(LinkedPath, match=r"run/tables is a symbolic link"):
        render([out], plots=False)
    assert list(elsewhere.iterdir()) == []


def test_an_output_whose_folder_is_a_file_is_named(tmp_path):
    (tmp_path / "file").write_text("x")
    with pytest.raises(NotADirectoryError, match=r"file is a file, not a folder, so "
                                                  r".*file/sub/out.md cannot be made under it; "
                                                  r"name an output path whose folders are"):
        write_text_atomic(tmp_path / "file" / "sub" / "out.md", "x")


def test_a_killed_scratch_folder_is_swept_by_the_next(tmp_path):
    host = os.uname().nodename.replace(".", "-")
    dead = tmp_path / f"oretrofit-openml.{host}.999999999.abcd{TEMP_SUFFIX}"
    live = tmp_path / f"oretrofit-openml.{host}.{os.getpid()}.abcd{TEMP_SUFFIX}"
    other = tmp_path / f"oretrofit-openml.elsewhere.999999999.abcd{TEMP_SUFFIX}"
    for folder in (dead, live, other):
        folder.mkdir()
        (folder / "dataset.arff").write_text("x")
    with scratch_folder(tmp_path, "oretrofit-openml") as scratch:
        assert scratch.is_dir() and scratch.parent == tmp_path
        assert not dead.exists() and live.exists() and other.exists()
    assert not scratch.exists()
