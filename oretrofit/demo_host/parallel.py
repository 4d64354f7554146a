"""Data-parallel prior-fitting on one machine: one worker process per core, gradients averaged.

With W workers, each draws ``batch_size / W`` tasks per step from its own seeded stream and
back-propagates the bar NLL of its tasks; one all-reduce (gloo over localhost) then replaces
every worker's gradient by the mean over workers,

    g = (1/W) Σ_w ∇ NLL_w,

so every worker applies the same AdamW step and the weights stay identical: a step on W
workers is one step on the union of their tasks, each worker's mean NLL weighted 1/W. Rank 0
owns the clock (the schedule, the stop and the saves read its elapsed time, broadcast every step) and
writes the run folder; at each save the workers' weight digests are compared, so a drift
between workers stops the run instead of going unnoticed.
"""

from __future__ import annotations

import dataclasses
import os
import sys
import tempfile
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from .._files.atomic import scratch_folder
from .._files.provenance import weights_digest as state_digest

__all__ = ["SOLO", "Workers", "spawn", "weights_digest"]


@dataclasses.dataclass(frozen=True)
class Workers:
    """This process's place among the run's workers; ``SOLO`` (one worker) makes every method a no-op."""

    rank: int = 0
    size: int = 1

    def samplers(self, seed: int) -> tuple[np.random.Generator, np.random.Generator | None]:
        """This worker's task stream and the workers' shared shape stream (None for one worker,
        whose one stream draws both, as every run before ``--workers`` did). A shared shape makes
        a step's tasks cost about the same on every worker, so none waits long for another."""
        if self.size == 1:
            return np.random.default_rng(seed), None
        return np.random.default_rng([seed, self.rank + 1]), np.random.default_rng([seed, 0])

    def average_gradients(self, model: torch.nn.Module, loss: torch.Tensor) -> float:
        """Replace each parameter's gradient by its mean over the workers; return the mean loss.

        A parameter without a gradient on some worker counts as a zero gradient, so every worker
        steps the same parameters."""
        if self.size == 1:
            return loss.item()
        params = list(model.parameters())
        flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in params]
                         + [loss.detach().reshape(1)])
        dist.all_reduce(flat)
        flat /= self.size
        offset = 0
        for p in params:
            p.grad = flat[offset:offset + p.numel()].view_as(p)
            offset += p.numel()
        return flat[-1].item()

    def from_rank0(self, value: float) -> float:
        """Rank 0's ``value`` on every worker (the run's clock is rank 0's)."""
        if self.size == 1:
            return value
        t = torch.tensor([value], dtype=torch.float64)
        dist.broadcast(t, src=0)
        return t.item()

    def gather(self, obj: Any) -> list[Any]:
        """``obj`` from every worker, in rank order (every worker must call it)."""
        if self.size == 1:
            return [obj]
        out: list[Any] = [None] * self.size
        dist.all_gather_object(out, obj)
        return out


SOLO = Workers()


def weights_digest(model: torch.nn.Module) -> str:
    """sha256 of the model's state, bit for bit: equal digests mean equal weights."""
    return state_digest(model.state_dict())


def _worker(rank: int, size: int, rendezvous: str, fn: Callable[..., None], args: tuple) -> None:
    # one thread on one core per worker: the workers are the parallelism, threads would compete with them
    cores = sorted(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {cores[rank % len(cores)]})
    torch.set_num_threads(1)
    # The workers meet in a file, not at a TCP store rank 0 would serve: a worker that finishes
    # first (rank 0 with nothing to do) would take such a store down while another worker still
    # reads it at the end of its init (DistNetworkError in place of that worker's own result).
    dist.init_process_group("gloo", init_method=f"file://{rendezvous}", rank=rank, world_size=size)
    try:
        fn(Workers(rank, size), *args)
    finally:
        dist.destroy_process_group()
    # A gloo thread may still be letting go of the last collective's tensors, which takes the GIL.
    # Once the interpreter is finalizing, a thread that waits for the GIL is ended mid-destructor and
    # the process aborts (SIGABRT, "terminate called without an active exception"; 8 of 23 runs of
    # the two-worker resume test on two cores). So a worker that finished leaves without finalizing,
    # as a forked multiprocessing child does; everything it wrote is closed by now.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def spawn(size: int, fn: Callable[..., None], *args: Any) -> None:
    """Run ``fn(workers, *args)`` in ``size`` worker processes, worker k pinned to the k-th core this
    process may use; returns when all have finished, and raises if any of them raised."""
    with scratch_folder(tempfile.gettempdir(), "oretrofit-workers") as folder:
        rendezvous = os.path.join(folder, "rendezvous")
        torch.multiprocessing.spawn(_worker, args=(size, rendezvous, fn, args), nprocs=size, join=True)
