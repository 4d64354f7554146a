"""One seeded section of torch's global generator at a time while datasets work side by side.

tabpfn seeds torch's process-global generator inside ``torch.random.fork_rng`` where a draw takes
no generator argument (``torch.svd_lowrank`` in its SVD preprocessing step, for matrices of over
a million cells). Two datasets doing that at once on two threads interleave their draws: each
gets another projection than it gets alone (so ``predict_batched`` with ``n_jobs > 1`` would not
equal the per-dataset loop), and the forks restore each other's saved state, so the caller's
generator ends up in a state no sequential run gives. While :func:`serialized_rng_forks` is
entered, every ``fork_rng`` in the process holds one re-entrant lock from its fork to its
restore, so seeded sections run one after another and each sees exactly the draws it seeded.

tabpfn 8.x draws that projection unseeded, outside any fork: there its own result depends on the
generator's state, and with ``n_jobs > 1`` on the order the datasets' threads reach the draw.
"""

from __future__ import annotations

import contextlib
import threading
from typing import Any, Iterator

import torch

__all__ = ["serialized_rng_forks"]

_FORK = threading.RLock()        # held by the thread inside a fork, from fork to restore
_INSTALLED = threading.Lock()    # guards _users and the swap of torch.random.fork_rng
_users = 0
_original = torch.random.fork_rng


@contextlib.contextmanager
def _serialized_fork_rng(*args: Any, **kwargs: Any) -> Iterator[None]:
    """``torch.random.fork_rng`` holding the process's one fork lock throughout."""
    with _FORK, _original(*args, **kwargs):
        yield


@contextlib.contextmanager
def serialized_rng_forks() -> Iterator[None]:
    """Within this context every ``torch.random.fork_rng`` in the process is serialized (see
    the module doc); nested and concurrent entries share one installation, and the last exit
    puts torch's own ``fork_rng`` back."""
    global _users
    with _INSTALLED:
        if _users == 0:
            torch.random.fork_rng = _serialized_fork_rng
        _users += 1
    try:
        yield
    finally:
        with _INSTALLED:
            _users -= 1
            if _users == 0:
                torch.random.fork_rng = _original
