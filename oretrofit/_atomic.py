"""Writing a file whole or not at all, and never through a symbolic link.

Every file oretrofit writes (receipts, specs, tables, checkpoints, saved models) goes through
:func:`atomic_file`: the bytes go to a new temporary file beside the target, opened with
``O_EXCL | O_NOFOLLOW``, which is renamed over the target once complete. A rename replaces a
symbolic link at the target by the new file and never writes to what the link points at, and a
failure (or a kill) before the rename leaves the old file untouched.

A killed writer leaves its temporary file behind. Its name says whose it was:
``.<target name>.<host>.<pid>.<random>.oretrofit-tmp``; the next write into the same folder
(:func:`sweep_temp_files`) deletes those of processes on this host that are no longer alive.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
from pathlib import Path
from typing import IO, Iterator

__all__ = ["atomic_file", "write_text_atomic", "sweep_temp_files", "TEMP_SUFFIX"]

TEMP_SUFFIX = ".oretrofit-tmp"


def _host() -> str:
    return socket.gethostname().replace(".", "-")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:              # another user's live process
        return True
    return True


def sweep_temp_files(folder: str | os.PathLike[str]) -> list[Path]:
    """Delete the temporary files in ``folder`` whose writer (a process of this host) is gone;
    returns them. Files of live writers and of other hosts are kept."""
    swept = []
    for path in Path(folder).glob(f".*{TEMP_SUFFIX}"):
        parts = path.name[:-len(TEMP_SUFFIX)].rsplit(".", 3)
        if len(parts) != 4 or parts[1] != _host() or not parts[2].isdigit():
            continue
        if not _alive(int(parts[2])) and not path.is_symlink() and path.is_file():
            path.unlink(missing_ok=True)
            swept.append(path)
    return swept


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike[str], mode: str = "wb",
                permissions: int = 0o644) -> Iterator[IO]:
    """Open a temporary file for writing (``mode`` "wb" or "w"); on leaving the block it becomes
    ``path`` by a rename (module docstring). Stale temporary files in the folder are swept."""
    if mode not in ("wb", "w"):
        raise ValueError(f"mode must be 'wb' or 'w', got {mode!r}")
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.is_dir() and not path.is_symlink():
        raise IsADirectoryError(f"{path} is a folder; name a file to write")
    sweep_temp_files(path.parent)
    tmp = path.parent / (f".{path.name}.{_host()}.{os.getpid()}.{secrets.token_hex(4)}"
                         f"{TEMP_SUFFIX}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, mode) as fh:
            yield fh
        os.chmod(tmp, permissions)          # created 0600 until complete
        os.replace(tmp, path)
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_text_atomic(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` to ``path`` through :func:`atomic_file`."""
    with atomic_file(path, "w") as fh:
        fh.write(text)
    return Path(path)
