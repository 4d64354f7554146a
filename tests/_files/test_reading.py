"""Reliability, round 4, the bounded reader (oretrofit._files.reading): every file oretrofit is given is
a regular file within the cap of its kind; a device, FIFO or folder is refused by what it is
without being read, a file that grows past the cap while read is refused."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from oretrofit import apply_spec
from oretrofit._files import reading as _files
from oretrofit._files.reading import FileRefused, read_json, read_text
from oretrofit._surgery.registry import RetrofitError
from torch import nn


def test_dev_zero_as_a_spec_is_refused_without_reading_it():
    with pytest.raises(RetrofitError, match=r"the patch spec /dev/zero is a character device, "
                                            r"not a regular file; pass a spec saved by "
                                            r"Retrofit.save_spec"):
        apply_spec(nn.Linear(2, 2), "/dev/zero")


def test_a_fifo_is_refused_at_once_not_waited_on(tmp_path):
    """A FIFO without a writer would block ``open`` for reading forever."""
    fifo = tmp_path / "spec.json"
    os.mkfifo(fifo)
    with pytest.raises(FileRefused, match=rf"the file {fifo} is a named pipe \(FIFO\), not a "
                                          r"regular file; fix"):
        read_json(fifo, "the file", "fix")


@pytest.mark.parametrize("make", [lambda p: p.mkdir(), lambda p: None])
def test_a_folder_or_a_missing_file_is_named_as_such(tmp_path, make):
    path = tmp_path / "x.json"
    make(path)
    what = "is a folder, not a regular file" if path.exists() else "does not exist"
    with pytest.raises(FileRefused, match=rf"the file {path} {what}; fix"):
        read_text(path, "the file", "json", "fix")


def test_a_file_over_its_kinds_cap_is_refused(tmp_path, monkeypatch):
    path = tmp_path / "big.json"
    path.write_text("[" + "0," * 600 + "0]")
    monkeypatch.setitem(_files.LIMITS, "json", 1024)
    with pytest.raises(FileRefused, match=rf"the file {path} holds 0.0 MiB or more, more than "
                                          r"the 0 MiB oretrofit reads for a json file; fix"):
        read_json(path, "the file", "fix")


def test_a_text_file_is_read_whole_below_its_cap(tmp_path):
    path = tmp_path / "t.txt"
    path.write_text("one\ntwo ü\n")
    assert read_text(path, "--text-file", "text", "fix") == "one\ntwo ü\n"


def test_dev_zero_as_text_file_is_refused_by_the_cli(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "oretrofit.cli.app", "calibrate", "--model", "minilm",
         "--text-file", "/dev/zero", "--out", str(tmp_path / "s.json")],
        capture_output=True, text=True, timeout=300, check=False,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert ("error: --text-file /dev/zero is a character device, not a regular file; give a "
            "UTF-8 text file, one calibration sample per line") in " ".join(result.stderr.split())
    assert not Path(tmp_path / "s.json").exists()


def test_a_file_larger_than_its_size_says_is_cut_at_the_cap(monkeypatch):
    """/proc files are regular files that report size 0: the read itself stops at the cap."""
    monkeypatch.setitem(_files.LIMITS, "text", 64)
    with pytest.raises(FileRefused, match=r"the file /proc/self/maps holds .* MiB or more, more "
                                          r"than the 0 MiB oretrofit reads for a text file"):
        read_text("/proc/self/maps", "the file", "text", "fix")
