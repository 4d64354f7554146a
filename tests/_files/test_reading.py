"""Reliability, round 4, the bounded reader (oretrofit._files.reading): every file oretrofit is given is
a regular file within the cap of its kind; a device, FIFO or folder is refused by what it is
without being read, a file that grows past the cap while read is refused."""

from __future__ import annotations

import os
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

from oretrofit import apply_spec
from oretrofit._files import reading as _files
from oretrofit._files.reading import FileRefused, read_json, read_text, text_lines
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


# --- text_lines: a text file read lazily, a line at a time ----------------------------------

def test_text_lines_splits_as_splitlines_and_cuts_each_line(tmp_path):
    path = tmp_path / "t.txt"
    text = "a\r\nbé\rc\n\n\u2028d\n" + "long " * 40 + "\nlast"
    path.write_bytes(text.encode())
    assert list(text_lines(path, "--text-file", "text", "fix", 12)) == [
        line[:12] for line in text.splitlines()]


def test_text_lines_holds_one_cut_line_not_the_file(tmp_path):
    """A 40 MB file of one line is read to its end (the next line follows it), yet never held:
    the reading peaks at kilobytes (a whole-file read held 40 MB, its decoding 40 more)."""
    path = tmp_path / "one-line.txt"
    with path.open("w") as fh:
        for _ in range(40):
            fh.write("word " * 200_000)
        fh.write("\nnext line\n")
    tracemalloc.start()
    try:
        lines = list(text_lines(path, "--text-file", "text", "fix", 1000))
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert lines == [("word " * 200)[:1000], "next line"]
    assert peak < 1 << 20


def test_text_lines_names_the_line_that_is_not_utf8(tmp_path):
    path = tmp_path / "latin1.txt"
    path.write_bytes("one\ncaf\xe9\n".encode("latin-1"))
    with pytest.raises(FileRefused, match=rf"--text-file {path} is not UTF-8 text \(line 2, "
                                          r"byte b'\\xe9'\); fix"):
        list(text_lines(path, "--text-file", "text", "fix", 100))


def test_text_lines_stops_reading_at_its_kinds_cap(tmp_path, monkeypatch):
    """A file of one endless line (a sparse file of zeros) is not read to its end."""
    path = tmp_path / "sparse.txt"
    with path.open("wb") as fh:
        fh.truncate(1 << 30)
    monkeypatch.setitem(_files.LIMITS, "text", 1 << 20)
    with pytest.raises(FileRefused, match=rf"--text-file {path}: 1 MiB were read \(the tails of "
                                          r"long lines included\) before the reading stopped"):
        list(text_lines(path, "--text-file", "text", "fix", 100))
