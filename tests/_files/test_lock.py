"""hold_lock and receipt_lock: one writer per output, the holder named; a full disk named."""

from __future__ import annotations

import errno
import os

import pytest

from oretrofit._files import lock
from oretrofit._files.atomic import NoSpace
from oretrofit._files.lock import FolderBusy, hold_lock, receipt_lock


def test_a_second_holder_is_refused_naming_the_output_and_the_first(tmp_path):
    receipt = tmp_path / "study.json"
    with receipt_lock(receipt):
        assert f"pid {os.getpid()}, since " in (tmp_path / ".study.json.lock").read_text()
        with pytest.raises(FolderBusy, match=rf"{receipt} is in use by another run \(host .*, "
                                             rf"pid {os.getpid()}, since .*\); wait for it to "
                                             "finish, or use another --out folder"):
            with receipt_lock(receipt):
                pass
        with hold_lock(tmp_path / ".other.lock", tmp_path / "other.json"):   # another output
            pass
    with receipt_lock(receipt):                                 # released with its block
        pass


def test_a_full_disk_when_recording_the_holder_names_the_lock_file(tmp_path, monkeypatch):
    def pwrite(fd, data, offset):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
    monkeypatch.setattr(lock.os, "pwrite", pwrite)
    with pytest.raises(NoSpace, match=rf"no space left on the device to write "
                                      rf"{tmp_path / '.lock'} \("):
        with hold_lock(tmp_path / ".lock", tmp_path):
            pass
