"""Writing a file whole or not at all, and never through a symbolic link.

Every file oretrofit writes (receipts, specs, tables, checkpoints, saved models) goes through
:func:`atomic_file`: the bytes go to a new temporary file beside the target, opened with
``O_EXCL | O_NOFOLLOW``, which is renamed over the target once complete. A rename replaces a
symbolic link at the target by the new file and never writes to what the link points at, and a
failure (or a kill) before the rename leaves the old file untouched.

A full disk (``ENOSPC``, or a quota: ``EDQUOT``) met by any write into the temporary file is
reported as :class:`NoSpace`, naming the target and the free space in its folder
(:func:`no_space`), also where the writer reports it as an error of its own (torch's zip
writer can raise a ``RuntimeError`` from ``inline_container.cc``): the temporary file's raw
writes (:class:`_TempFile`) remember the error they met. Text is written as UTF-8. A target name up to the file
system's limit (255 bytes) is legal: the temporary file's name shortens the target's part of it
to fit.

A killed writer leaves its temporary file behind. Its name says whose it was:
``.<target name>.<host>.<pid>.<random>.oretrofit-tmp``; the next write into the same folder
(:func:`sweep_temp_files`) deletes those of processes on this host that are no longer alive.
Scratch folders (:func:`scratch_folder`) are named the same way and swept the same way when the
next one is made.

The files and folders that oretrofit creates inside an output folder of its own (a run folder's
``.lock``, ``cells``, ``datasets``, ``invocations``, ``tables``) are checked by
:func:`refuse_link`: a symbolic link in their place, or a file with more than one hard link (a
name another file shares), is refused by name, so nothing is written through it
(:func:`own_folder` for a folder; the lock file checks the file it opened).
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import secrets
import shutil
import socket
import stat
from pathlib import Path
from typing import IO, Iterator

from .reading import _kind_of

__all__ = ["atomic_file", "write_text_atomic", "sweep_temp_files", "scratch_folder", "make_folder",
           "own_folder", "refuse_link", "LinkedPath", "NoSpace", "no_space", "is_full",
           "TEMP_SUFFIX"]

TEMP_SUFFIX = ".oretrofit-tmp"
_NAME_MAX = 255                         # bytes in one file name (ext4, xfs, btrfs, tmpfs, APFS)
_FULL = (errno.ENOSPC, errno.EDQUOT)


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


class LinkedPath(ValueError):
    """A link, or a file with several hard links, where oretrofit creates a file or folder of
    its own."""


class NoSpace(OSError):
    """A write that found its disk full; the message names the file and the free space."""


def _free(folder: Path) -> str:
    """The space free to this user in ``folder``'s file system, in binary units."""
    try:
        free = float(shutil.disk_usage(folder).free)
    except OSError:
        return "unknown space"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if free < 1024:
            return f"{free:.0f} {unit}" if unit == "B" else f"{free:.1f} {unit}"
        free /= 1024
    return f"{free:.1f} TiB"


def no_space(path: str | os.PathLike[str], cause: OSError) -> NoSpace:
    """The error for a write of ``path`` that met a full disk (``cause``), naming the file and
    the space free in its folder."""
    path = Path(path)
    found = NoSpace(f"no space left on the device to write {path} ({_free(path.parent)} free "
                    f"in {path.parent}, {os.strerror(cause.errno)}); free some space there, or "
                    "write to another folder")
    found.errno = cause.errno
    return found


def is_full(exc: BaseException) -> bool:
    """Whether ``exc`` is a full disk (``ENOSPC``) or a full quota (``EDQUOT``)."""
    return isinstance(exc, OSError) and exc.errno in _FULL


class _TempFile(io.FileIO):
    """The temporary file's raw writes; remembers a full disk one met (``full``), which the
    writer above may report as an error of its own."""

    full: OSError | None = None

    def write(self, data: bytes) -> int:  # type: ignore[override]
        try:
            return self.write_through(data)
        except OSError as exc:
            if is_full(exc):
                self.full = exc
            raise

    def write_through(self, data: bytes) -> int:
        """The write to disk itself."""
        return super().write(data)


def _temp_name(stem: str) -> str:
    """``<stem>.<host>.<pid>.<random>.oretrofit-tmp``, ``stem`` shortened (by whole UTF-8
    characters) so that the name fits the file system's limit."""
    tail = f".{_host()}.{os.getpid()}.{secrets.token_hex(4)}{TEMP_SUFFIX}"
    room = _NAME_MAX - len(tail.encode())
    return stem.encode()[:room].decode(errors="ignore") + tail


def _stale(path: Path) -> bool:
    """Whether ``path`` is named by :func:`_temp_name` for a process of this host that is gone."""
    parts = path.name[:-len(TEMP_SUFFIX)].rsplit(".", 3)
    return (len(parts) == 4 and parts[1] == _host() and parts[2].isdigit()
            and not _alive(int(parts[2])) and not path.is_symlink())


def sweep_temp_files(folder: str | os.PathLike[str]) -> list[Path]:
    """Delete the temporary files in ``folder`` whose writer (a process of this host) is gone;
    returns them. Files of live writers and of other hosts are kept."""
    swept = [path for path in Path(folder).glob(f".*{TEMP_SUFFIX}")
             if _stale(path) and path.is_file()]
    for path in swept:
        path.unlink(missing_ok=True)
    return swept


@contextlib.contextmanager
def scratch_folder(parent: str | os.PathLike[str], stem: str) -> Iterator[Path]:
    """A new folder ``parent/<stem>.<host>.<pid>.<random>.oretrofit-tmp`` for the block, deleted
    after it; the scratch folders of this stem left by killed processes of this host are deleted
    first."""
    parent = make_folder(parent)
    for stale in parent.glob(f"{stem}.*{TEMP_SUFFIX}"):
        if _stale(stale) and stale.is_dir():
            shutil.rmtree(stale, ignore_errors=True)
    path = parent / _temp_name(stem)
    path.mkdir(mode=0o700)
    try:
        yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def refuse_link(path: str | os.PathLike[str], found: os.stat_result | None = None) -> None:
    """Refuse ``path`` (by :class:`LinkedPath`) when it is a symbolic link, or a file with more
    than one hard link, where oretrofit creates a file or folder of its own (module docstring);
    ``found``: its ``stat`` when already taken (of an opened file). A missing path passes."""
    path = Path(path)
    if found is None:
        try:
            found = os.lstat(path)
        except FileNotFoundError:
            return
    fix = ("oretrofit creates it itself and never writes through a link: delete it (the "
           "place it points at keeps its contents), or use another output folder")
    if stat.S_ISLNK(found.st_mode):
        raise LinkedPath(f"{path} is a symbolic link (to {os.readlink(path)}); {fix}")
    if not (stat.S_ISDIR(found.st_mode) or stat.S_ISREG(found.st_mode)):
        raise LinkedPath(f"{path} is {_kind_of(found.st_mode)}, not a file or folder; {fix}")
    if not stat.S_ISDIR(found.st_mode) and found.st_nlink > 1:
        raise LinkedPath(f"{path} is a file with {found.st_nlink} hard links (other names share "
                         f"its contents); {fix}")


def make_folder(path: str | os.PathLike[str], output: str | os.PathLike[str] | None = None
                ) -> Path:
    """Create the folder ``path`` and its missing parents; a file in the way is refused naming
    it and ``output`` (the output the folder is made for, e.g. a file in it or the option that
    named it), not as ``[Errno 17] File exists``."""
    path = Path(path)
    for folder in (*reversed(path.parents), path):
        if folder.exists() and not folder.is_dir():
            inside = folder != path or (output is not None and Path(output).parent == path)
            where = (f"so {output or path} cannot be made under it" if inside
                     else f"and {output or 'the output folder'} must be a folder")
            raise NotADirectoryError(f"{folder} is a file, not a folder, {where}; name an "
                                     "output path whose folders are folders, or move the file")
    path.mkdir(parents=True, exist_ok=True)
    return path


def own_folder(path: str | os.PathLike[str]) -> Path:
    """:func:`make_folder` for a folder oretrofit creates inside its own output folder: a link
    in its place is refused (:func:`refuse_link`)."""
    refuse_link(path)
    return make_folder(path)


@contextlib.contextmanager
def atomic_file(path: str | os.PathLike[str], mode: str = "wb",
                permissions: int = 0o644) -> Iterator[IO]:
    """Open a temporary file for writing (``mode`` "wb" or "w"); on leaving the block it becomes
    ``path`` by a rename (module docstring). Stale temporary files in the folder are swept."""
    if mode not in ("wb", "w"):
        raise ValueError(f"mode must be 'wb' or 'w', got {mode!r}")
    path = Path(path)
    make_folder(path.parent, path)
    if path.is_dir() and not path.is_symlink():
        raise IsADirectoryError(f"{path} is a folder; name a file to write")
    sweep_temp_files(path.parent)
    tmp = path.parent / _temp_name(f".{path.name}")
    try:
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    except OSError as exc:
        if is_full(exc):                      # no inode left
            raise no_space(path, exc) from exc
        raise
    raw = _TempFile(fd, "wb")
    try:
        with (io.BufferedWriter(raw) if mode == "wb"
              else io.TextIOWrapper(io.BufferedWriter(raw), encoding="utf-8")) as fh:
            yield fh
        os.chmod(tmp, permissions)          # created 0600 until complete
        os.replace(tmp, path)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        full = raw.full or (exc if is_full(exc) else None)
        if full is not None:
            raise no_space(path, full) from exc
        raise


def write_text_atomic(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` to ``path`` through :func:`atomic_file`."""
    with atomic_file(path, "w") as fh:
        fh.write(text)
    return Path(path)
