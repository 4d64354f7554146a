"""Which files of an output folder oretrofit wrote, so that it never replaces one it did not.

A writer of named files into a folder (a run's tables, ``tables --out``, a study's receipt and
table, the operator sweep's) first calls :func:`claim` with the names it is about to write.
The folder's record ``.oretrofit-written`` (JSON: the names oretrofit has written there) is
the proof of ownership: a file of one of those names that is there but not in the record (the
user's own ``tables.md``, ``summary.csv``, …) is refused, all such names in one error, and
nothing is written. The user moves them away (or deletes them, when they are oretrofit's from
before the record existed) or names another folder. Otherwise the names join the record before
any is written, so a write killed half way leaves a name that is still oretrofit's.

Refusing, rather than writing beside a foreign file under another name, keeps every output at
the name that documentation, scripts and the ``--json`` summary give for it.

The record is updated under an exclusive ``flock`` on the folder itself, so writers of
different outputs into one folder (two studies into ``results/studies``) never lose each
other's names; it is replaced by a rename (:func:`.atomic.write_text_atomic`), never written
into, and read bounded and strictly (:func:`.reading.read_json`).
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
from pathlib import Path
from typing import Iterable, Iterator

from .atomic import write_text_atomic
from .reading import read_json

__all__ = ["RECORD", "ForeignFiles", "claim", "refuse_foreign"]

RECORD = ".oretrofit-written"
_FIX = "delete it; oretrofit then treats every file of the folder as not its own"


class ForeignFiles(FileExistsError):
    """Files oretrofit did not write where it would write files of the same names."""


@contextlib.contextmanager
def _locked(folder: Path) -> Iterator[None]:
    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)                  # waits: an update takes milliseconds
        yield
    finally:
        os.close(fd)


def _recorded(folder: Path) -> set[str]:
    path = folder / RECORD
    if not os.path.lexists(path):
        return set()
    found = read_json(path, "the record of files oretrofit wrote", _FIX)
    files = found.get("files") if isinstance(found, dict) else None
    if not (isinstance(files, list) and all(isinstance(name, str) for name in files)):
        raise ValueError(f"{path} is not a record of files oretrofit wrote (a JSON object with "
                         f"a list of names under files); {_FIX}")
    return set(files)


def refuse_foreign(folder: str | os.PathLike[str], names: Iterable[str]) -> set[str]:
    """Refuse (:class:`ForeignFiles`) the files of ``names`` in ``folder`` that its record
    lacks, all in one error; returns the names recorded. Changes nothing: a runner checks its
    output folder with it before its work, and :func:`claim` again before it writes."""
    folder = Path(folder)
    recorded = _recorded(folder)
    foreign = sorted(name for name in set(names)
                     if name not in recorded and os.path.lexists(folder / name))
    if foreign:
        raise ForeignFiles(
            f"{folder} holds {', '.join(foreign)}, which oretrofit did not write (its record "
            f"{folder / RECORD} does not list {'it' if len(foreign) == 1 else 'them'}), and "
            "would replace; move them elsewhere (or delete them, if an oretrofit older than "
            "the record wrote them), or write to another folder")
    return recorded


def claim(folder: str | os.PathLike[str], names: Iterable[str]) -> None:
    """Claim ``names`` in the folder ``folder`` (made by the caller) for writing (module
    docstring): :func:`refuse_foreign`, then the names join the record."""
    folder = Path(folder)
    names = sorted(set(names))
    with _locked(folder):
        recorded = refuse_foreign(folder, names)
        if not set(names) <= recorded:
            write_text_atomic(folder / RECORD, json.dumps(
                {"schema_version": 1, "kind": "oretrofit.written",
                 "files": sorted(recorded | set(names))}, indent=1) + "\n")
