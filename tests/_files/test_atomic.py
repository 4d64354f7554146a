"""atomic_file: a full disk is named with its file and the free space, whoever wrote the
bytes; a target name up to the file system's limit is legal."""

from __future__ import annotations

import errno
import os
import subprocess

import pytest
import torch
from typer.testing import CliRunner

import oretrofit
from oretrofit._files import atomic
from oretrofit._files.atomic import NoSpace, TEMP_SUFFIX, sweep_temp_files, write_text_atomic
from oretrofit._files.provenance import write_json_atomic
from oretrofit.cli.app import app

FULL = r"no space left on the device to write {} \(\d+(\.\d)? [KMGT]?i?B free in {}, No space " \
       r"left on device\); free some space there, or write to another folder"


@pytest.fixture
def full_disk(monkeypatch):
    """Every write into a temporary file meets a full disk."""
    def write_through(self, data):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(atomic._TempFile, "write_through", write_through)


@pytest.mark.parametrize("name, write", [
    ("t.md", lambda path: write_text_atomic(path, "x" * 100_000)),
    ("r.json", lambda path: write_json_atomic(path, {"x": list(range(10_000))})),
    # through torch's zip writer (inline_container.cc)
    ("m.pt", lambda path: oretrofit.save(torch.nn.Linear(64, 64), path)),
])
def test_a_full_disk_names_the_file_and_the_free_space(tmp_path, full_disk, name, write):
    path = tmp_path / name
    path.write_text("the old contents")
    with pytest.raises(NoSpace, match=FULL.format(path, tmp_path)) as refused:
        write(path)
    assert refused.value.errno == errno.ENOSPC
    assert path.read_text() == "the old contents"                 # untouched
    assert sorted(p.name for p in tmp_path.iterdir()) == [name]    # no temporary file left


def test_a_full_disk_is_one_error_line_of_the_command(tmp_path, full_disk):
    result = CliRunner().invoke(app, ["sweep", "operators", "--quick", "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert result.output.startswith("error: no space left on the device to write "
                                    f"{tmp_path / '.oretrofit-written'} ("), result.output


@pytest.mark.parametrize("length", [238, 239, 240, 255])
def test_a_target_name_up_to_the_limit_is_written(tmp_path, length):
    """The hidden temporary file's name (the target's, plus host, pid and a random part) was
    refused as too long from a 238-byte target name on."""
    path = tmp_path / ("é" * ((length - 3) // 2) + "x" * ((length - 3) % 2) + ".md")
    assert len(path.name.encode()) == length
    write_text_atomic(path, "ok")
    assert path.read_text() == "ok" and [p.name for p in tmp_path.iterdir()] == [path.name]


def test_the_shortened_temporary_file_of_a_killed_writer_is_swept(tmp_path):
    dead = subprocess.Popen(["true"])
    dead.wait()
    name = atomic._temp_name("." + "x" * 250).replace(f".{os.getpid()}.", f".{dead.pid}.")
    assert len(name.encode()) <= 255 and name.endswith(TEMP_SUFFIX)
    (tmp_path / name).write_text("half")
    assert sweep_temp_files(tmp_path) == [tmp_path / name]
