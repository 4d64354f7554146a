"""Reading a file oretrofit is given, bounded: regular files only, at most a size that fits the
kind of file.

Every file oretrofit reads from a user (a patch spec, ``--text-file``, a checkpoint, a model
folder, an OpenML cache, a run folder's JSON) is first checked by :func:`regular_file`: a folder,
a named pipe (FIFO), a device or a socket is refused by what it is, from its ``stat`` alone (a
FIFO is never opened, so nothing waits for a writer), and so is a file larger than the cap of its
kind (:data:`LIMITS`). The readers here (:func:`read_bytes`, :func:`read_text`,
:func:`read_json`) open with ``O_NONBLOCK``, check the opened file again (it may have been
swapped since) and read at most the cap, so ``/dev/zero`` or a file that grows while it is read
is refused instead of filling the memory; :func:`text_lines` reads a text file's lines lazily
instead, each cut to a length, so a file of any size costs the memory of one line. JSON is parsed by one strict parse,
:func:`parse_json` (a key given twice or nesting deeper than :data:`JSON_MAX_DEPTH` refused by
key or path), which the patch spec reader wraps too.
"""

from __future__ import annotations

import codecs
import itertools
import json
import os
import stat
from pathlib import Path
from typing import Any, Iterator

__all__ = ["LIMITS", "FileRefused", "regular_file", "check_folder_files", "read_bytes",
           "read_text", "text_lines", "read_json", "parse_json", "JSON_MAX_DEPTH"]

_MiB = 1 << 20
# The largest file of each kind oretrofit reads (bytes): far above any real one of the kind.
LIMITS: dict[str, int] = {
    "json": 64 * _MiB,            # patch specs, run-folder records, model configs
    "xml": 16 * _MiB,             # OpenML descriptions
    "text": 256 * _MiB,           # --text-file
    "table": 8 << 30,             # --data CSV/parquet, OpenML ARFF/parquet
    "checkpoint": 64 << 30,       # TabPFN checkpoints, model weights
}
# How deeply a JSON file oretrofit reads may nest objects and lists (a spec's calibration record
# is the deepest oretrofit writes, at 3 levels; model configs and run-folder records are shallower).
JSON_MAX_DEPTH = 32


class FileRefused(ValueError):
    """A file that is not a regular file, or larger than its kind allows; the message names
    the file, what it is and the fix."""


def _kind_of(mode: int) -> str:
    for test, what in ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a named pipe (FIFO)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return what
    return "not a regular file"


def _check(path: Path, found: os.stat_result, what: str, kind: str | None, fix: str) -> None:
    if not stat.S_ISREG(found.st_mode):
        raise FileRefused(f"{what} {path} is {_kind_of(found.st_mode)}, not a regular file; "
                          f"{fix}")
    if kind is not None and found.st_size > LIMITS[kind]:
        raise _too_large(path, found.st_size, what, kind, fix)


def _too_large(path: Path, size: int, what: str, kind: str, fix: str) -> FileRefused:
    return FileRefused(f"{what} {path} holds {size / _MiB:,.1f} MiB or more, more than the "
                       f"{LIMITS[kind] / _MiB:,.0f} MiB oretrofit reads for a {kind} file; {fix}")


def regular_file(path: str | os.PathLike[str], what: str, kind: str | None, fix: str) -> Path:
    """``path`` when it is a regular file (a link to one counts) within the cap of ``kind``
    (a key of :data:`LIMITS`; None: any size); otherwise :class:`FileRefused` naming ``what`` it should be, what
    it is, and ``fix``. Never opens the file."""
    path = Path(path)
    try:
        found = path.stat()
    except FileNotFoundError:
        raise FileRefused(f"{what} {path} does not exist; {fix}") from None
    except OSError as exc:
        raise FileRefused(f"{what} {path} cannot be read ({exc.strerror}); {fix}") from None
    _check(path, found, what, kind, fix)
    return path


def check_folder_files(folder: str | os.PathLike[str], what: str, fix: str) -> None:
    """Refuse a FIFO, device or socket among ``folder``'s entries (and those of its
    subfolders), by name: a library reading the folder would wait on it or read it without
    end. Never opens an entry."""
    for root, _, names in os.walk(folder):
        for name in names:
            path = Path(root) / name
            try:
                mode = path.stat().st_mode
            except OSError:                   # a dangling link: the reader reports it
                continue
            if not stat.S_ISREG(mode):
                raise FileRefused(f"{what} {folder} holds {path.name} ({path}), which is "
                                  f"{_kind_of(mode)}, not a regular file; {fix}")


def _open(path: str | os.PathLike[str], what: str, kind: str | None, fix: str
          ) -> tuple[Path, int]:
    """``path`` checked (:func:`regular_file`) and opened for reading without waiting on it,
    checked again once open (it may have been swapped since): the path and the descriptor."""
    path = regular_file(path, what, kind, fix)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    except OSError as exc:
        raise FileRefused(f"{what} {path} cannot be read ({exc.strerror}); {fix}") from None
    try:
        _check(path, os.fstat(fd), what, kind, fix)
    except FileRefused:
        os.close(fd)
        raise
    return path, fd


def read_bytes(path: str | os.PathLike[str], what: str, kind: str, fix: str) -> bytes:
    """The bytes of a regular file of at most the cap of ``kind`` (module docstring)."""
    path, fd = _open(path, what, kind, fix)
    chunks, size = [], 0
    with os.fdopen(fd, "rb") as fh:
        while chunk := fh.read(_MiB):
            size += len(chunk)
            if size > LIMITS[kind]:                          # it grew while read
                raise _too_large(path, size, what, kind, fix)
            chunks.append(chunk)
    return b"".join(chunks)


def read_text(path: str | os.PathLike[str], what: str, kind: str, fix: str) -> str:
    """:func:`read_bytes` decoded as UTF-8 (a file that is not is refused by name)."""
    data = read_bytes(path, what, kind, fix)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise FileRefused(f"{what} {path} is not UTF-8 text (byte {exc.start}: "
                          f"{data[exc.start:exc.start + 1]!r}); {fix}") from None


def text_lines(path: str | os.PathLike[str], what: str, kind: str, fix: str, max_chars: int
               ) -> Iterator[str]:
    """The lines of a regular UTF-8 text file, read lazily, as ``str.splitlines`` splits the
    text; each line cut to its first ``max_chars`` characters, the rest of a longer line skipped
    unread into memory (at most ``4·max_chars`` bytes of a line, UTF-8's longest characters, are
    held). The file may be of any size, as long as the reader stops within the cap of ``kind``:
    reading past it (skipped tails included) is refused, as is text that is not UTF-8, by line
    (:class:`FileRefused`)."""
    path, fd = _open(path, what, None, fix)
    limit, size = 4 * max_chars, 0
    with os.fdopen(fd, "rb") as fh:
        for number in itertools.count(1):
            head = piece = fh.readline(limit)
            size += len(piece)
            while piece and not piece.endswith(b"\n") and (piece := fh.readline(limit)):
                size += len(piece)                           # the rest of a long line
                if size > LIMITS[kind]:
                    break
            if size > LIMITS[kind]:
                raise FileRefused(f"{what} {path}: {LIMITS[kind] / _MiB:,.0f} MiB were read (the "
                                  f"tails of long lines included) before the reading stopped, "
                                  f"more than oretrofit reads of a {kind} file; give fewer or "
                                  f"shorter lines, or {fix}")
            if not head:
                return
            try:          # not final: a character cut at the byte limit is dropped, not refused
                text = codecs.getincrementaldecoder("utf-8")().decode(head, final=False)
            except UnicodeDecodeError as exc:
                raise FileRefused(f"{what} {path} is not UTF-8 text (line {number}, byte "
                                  f"{head[exc.start:exc.start + 1]!r}); {fix}") from None
            for line in text.splitlines():
                yield line[:max_chars]


def read_json(path: str | os.PathLike[str], what: str, fix: str) -> Any:
    """The JSON value of a file of at most ``LIMITS["json"]`` bytes, parsed strictly
    (:func:`parse_json`)."""
    return parse_json(read_text(path, what, "json", fix), f"{what} {path}", fix)


def parse_json(text: str, what: str, fix: str) -> Any:
    """The JSON value of ``text`` (the content of ``what``), parsed strictly: text that is not
    JSON (named by line and column), a key given twice in one object (JSON would keep the last
    without a word) and nesting deeper than :data:`JSON_MAX_DEPTH` (or than Python's parser
    follows, a bare RecursionError) are each a :class:`FileRefused` naming ``what``, the key or
    the path, and ``fix``."""
    def unique(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        found: dict[str, Any] = {}
        for key, value in pairs:
            if key in found:
                keys = ", ".join(repr(k) for k, _ in pairs)
                raise FileRefused(f"{what} gives the key {key!r} twice in one object (in "
                                  f"{{{keys[:120]}}}); JSON would keep only the last. Keep one "
                                  f"of them, or {fix}")
            found[key] = value
        return found

    try:
        value = json.loads(text, object_pairs_hook=unique)
        below = _too_deep(value, "", JSON_MAX_DEPTH)
    except json.JSONDecodeError as exc:
        raise FileRefused(f"{what} is not valid JSON (line {exc.lineno}, column {exc.colno}: "
                          f"{exc.msg}); {fix}") from None
    except RecursionError:
        below = "[…] (deeper than Python's JSON parser follows)"
    if below is not None:
        raise FileRefused(f"{what} nests objects or lists more than {JSON_MAX_DEPTH} levels "
                          f"deep, below {below[:60]}{'…' * (len(below) > 60)}; {fix}")
    return value


def _too_deep(value: Any, path: str, levels: int) -> str | None:
    """The path below which ``value`` nests more than ``levels`` objects or lists, else None."""
    children = (value.items() if isinstance(value, dict) else enumerate(value)
                if isinstance(value, list) else ())
    for key, child in children:
        where = f"{path}[{key!r}]"
        if levels == 0:
            return where
        found = _too_deep(child, where, levels - 1)
        if found is not None:
            return found
    return None
