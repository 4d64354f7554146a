"""One writer at a time per output: an exclusive ``flock`` on a lock file beside it.

:func:`hold_lock` takes the lock for a block and records the holder (host, pid, start time,
command line) in the lock file, so a second writer is refused naming the output and who holds
it. The kernel drops a ``flock`` when its holder dies, so the lock of a killed run is taken over
by the next one; the file itself stays (it is the lock's name, not its state). A symbolic link
or a hard-linked file in the lock file's place is refused (:func:`.atomic.refuse_link`), before
and after it is opened, so the holder record is never written through one.

Every runner that writes an output folder holds one: ``regress``/``reproduce`` on the run
folder (``DIR/.lock``), ``experiment`` and ``sweep`` on their receipt ``R``
(:func:`receipt_lock`: ``.R.lock`` beside it, so runs of other studies into one folder do not
wait on each other).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import socket
import sys
import time
from pathlib import Path
from typing import Iterator

from .atomic import is_full, make_folder, no_space, refuse_link

__all__ = ["FolderBusy", "hold_lock", "receipt_lock"]


class FolderBusy(RuntimeError):
    """Another live process holds the lock of an output."""


@contextlib.contextmanager
def hold_lock(lock: str | os.PathLike[str], output: str | os.PathLike[str]) -> Iterator[None]:
    """Hold the exclusive lock ``lock`` (a file, created with its folder) for the block; while
    another live process holds it, :class:`FolderBusy` names ``output`` (what the lock guards)
    and the holder."""
    lock = Path(lock)
    make_folder(lock.parent)
    refuse_link(lock)
    fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK, 0o644)
    try:
        refuse_link(lock, os.fstat(fd))             # linked since the look above?
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.pread(fd, 4096, 0).decode(errors="replace").strip() or "unknown"
            raise FolderBusy(f"{output} is in use by another run ({holder}); wait for it to "
                             "finish, or use another --out folder") from None
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, (f"host {socket.gethostname()}, pid {os.getpid()}, since "
                           f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}, command "
                           f"{' '.join(sys.argv)[:300]}").encode(), 0)
        except OSError as exc:
            if is_full(exc):
                raise no_space(lock, exc) from exc
            raise
        yield
    finally:
        os.close(fd)                                # releases the flock


def receipt_lock(receipt: str | os.PathLike[str]) -> contextlib.AbstractContextManager[None]:
    """:func:`hold_lock` on ``.<name>.lock`` beside the file ``receipt``, guarding it."""
    receipt = Path(receipt)
    return hold_lock(receipt.parent / f".{receipt.name}.lock", receipt)
