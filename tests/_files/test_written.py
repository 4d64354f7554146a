"""claim: a file of a folder that oretrofit did not write is never replaced."""

from __future__ import annotations

import json
import threading

import pytest

from oretrofit._files.written import RECORD, ForeignFiles, claim


def test_names_are_recorded_and_a_foreign_file_is_refused_by_name(tmp_path):
    claim(tmp_path, ["a.md", "b.csv"])
    assert json.loads((tmp_path / RECORD).read_text())["files"] == ["a.md", "b.csv"]
    (tmp_path / "a.md").write_text("oretrofit's")
    (tmp_path / "c.tex").write_text("the user's")
    (tmp_path / "d.csv").write_text("the user's")
    claim(tmp_path, ["a.md"])                                      # its own: claimed again
    with pytest.raises(ForeignFiles, match=rf"{tmp_path} holds c.tex, d.csv, which oretrofit "
                                           rf"did not write \(its record {tmp_path / RECORD} "
                                           r"does not list them\), and would replace; move "
                                           "them elsewhere"):
        claim(tmp_path, ["a.md", "c.tex", "d.csv", "e.md"])
    assert json.loads((tmp_path / RECORD).read_text())["files"] == ["a.md", "b.csv"]


def test_a_link_of_a_foreign_name_is_refused_too(tmp_path):
    (tmp_path / "t.md").symlink_to(tmp_path / "nowhere")
    with pytest.raises(ForeignFiles, match="holds t.md, which"):
        claim(tmp_path, ["t.md"])


def test_a_record_that_is_not_one_is_named(tmp_path):
    (tmp_path / RECORD).write_text('{"files": "a.md"}')
    with pytest.raises(ValueError, match=rf"{tmp_path / RECORD} is not a record of files "
                                         "oretrofit wrote .*; delete it"):
        claim(tmp_path, ["a.md"])


def test_writers_claiming_at_once_keep_every_name(tmp_path):
    """Two studies writing into one folder at once: no name is lost from the record."""
    names = [f"study{i}.json" for i in range(12)]
    threads = [threading.Thread(target=claim, args=(tmp_path, [name])) for name in names]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert json.loads((tmp_path / RECORD).read_text())["files"] == sorted(names)
