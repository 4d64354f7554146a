"""Demo-host training throughput by how two CPU cores are used: one thread, two threads, twin runs, data-parallel.

    python benchmarks/bench_pretrain_threads.py [--steps 80] [--warmup 3] [--quick]
                                                [--out results/bench_pretrain_threads.json]

The shipped host's size (``embed_dim`` 32) runs ``training_step`` (through
``bench_pretrain_sizes.throughput``) on the curriculum's shortest and longest tasks
(``max_rows`` 128 and 512, ``noise_max`` 3) in six set-ups, each in fresh worker processes
whose timed steps start together:

* one process, one thread, 4 tasks a step (the shipped recipe; the baseline),
* one process on two threads (torch's intra-op parallelism), 4 tasks a step,
* two processes on one thread each, 4 tasks a step each (two runs side by side, as twins trained),
* two processes on one thread each, 2 tasks a step each: the compute of one data-parallel
  run of 4 tasks a step, without the gradient exchange,
* oretrofit's data-parallel training (``pretrain-demo --workers 2``: gradients averaged every
  step, batch shapes shared), 2 and 4 tasks a step on each worker (4 and 8 a step in all).

Total prior tasks/s and the slowest process's steps/s (which paces a data-parallel run)
are given as ratios to the baseline at the same ``max_rows``, measured in the same run. Prints
a Markdown table and writes a JSON receipt with provenance.
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
from pathlib import Path
from typing import Any

from bench_pretrain_sizes import throughput

from oretrofit._files.markdown import pipe_table
from oretrofit._files.provenance import environment, write_json_atomic
from oretrofit.demo_host.parallel import Workers, spawn
from oretrofit.demo_host.prior import PriorConfig

EMBED_DIM = 32                                     # the shipped host's size
MAX_ROWS = (128, 512)                              # the curriculum's first and last stage
# (processes, threads each, tasks a step each, data-parallel)
SETUPS = ((1, 1, 4, False), (1, 2, 4, False), (2, 1, 4, False), (2, 1, 2, False),
          (2, 1, 2, True), (2, 1, 4, True))
NOISE_MAX = 3.0


def _worker(max_rows: int, threads: int, tasks: int, steps: int, warmup: int,
            start: mp.Barrier, out: mp.Queue) -> None:
    import torch

    torch.set_num_threads(threads)
    start.wait()                                    # the processes of one set-up run together
    out.put(throughput(EMBED_DIM, tasks, steps, warmup, PriorConfig(max_rows=max_rows, noise_max=NOISE_MAX)))


def _data_parallel_worker(workers: Workers, max_rows: int, tasks: int, steps: int, warmup: int,
                          out: mp.Queue) -> None:
    # the gradient exchange of the warm-up steps lines the workers up before the timed ones
    prior = PriorConfig(max_rows=max_rows, noise_max=NOISE_MAX)
    out.put(throughput(EMBED_DIM, tasks, steps, warmup, prior, workers))


def measure(max_rows: int, processes: int, threads: int, tasks: int, data_parallel: bool, steps: int,
            warmup: int) -> dict[str, Any]:
    """Steps/s of each of ``processes`` concurrent workers (``threads`` threads, ``tasks`` tasks a step each;
    with ``data_parallel``, one run through ``oretrofit.demo_host.parallel``) and their total tasks/s."""
    ctx = mp.get_context("spawn")
    out = ctx.Queue()
    if data_parallel:
        spawn(processes, _data_parallel_worker, max_rows, tasks, steps, warmup, out)
        results = [out.get() for _ in range(processes)]
    else:
        start = ctx.Barrier(processes)
        workers = [ctx.Process(target=_worker, args=(max_rows, threads, tasks, steps, warmup, start, out))
                   for _ in range(processes)]
        for worker in workers:
            worker.start()
        results = [out.get() for _ in workers]
        for worker in workers:
            worker.join()
            if worker.exitcode != 0:
                raise RuntimeError(f"a benchmark worker exited with {worker.exitcode}")
    return {"max_rows": max_rows, "processes": processes, "threads": threads, "tasks_per_step": tasks,
            "data_parallel": data_parallel, "steps_per_s": [r["steps_per_s"] for r in results],
            "tasks_per_s": sum(r["tasks_per_s"] for r in results)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=80)
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument("--quick", action="store_true",
                        help="max_rows 128, the baseline and twin processes only: a smoke run")
    parser.add_argument("--out", type=Path, default=Path("results/bench_pretrain_threads.json"))
    args = parser.parse_args()
    max_rows, setups = (MAX_ROWS[:1], SETUPS[:3:2]) if args.quick else (MAX_ROWS, SETUPS)
    rows = [measure(m, *setup, args.steps, args.warmup) for m in max_rows for setup in setups]
    base = {r["max_rows"]: r for r in rows
            if (r["processes"], r["threads"], r["tasks_per_step"], r["data_parallel"]) == SETUPS[0]}
    table = pipe_table(
        ["max_rows", "processes", "threads each", "tasks/step each", "data-parallel", "steps/s each",
         "tasks/s in all", "tasks/s vs first", "slowest steps/s vs first"],
        [[r["max_rows"], r["processes"], r["threads"], r["tasks_per_step"], "yes" if r["data_parallel"] else "no",
          ", ".join(f"{s:.2f}" for s in r["steps_per_s"]), f"{r['tasks_per_s']:.1f}",
          f"{r['tasks_per_s'] / base[r['max_rows']]['tasks_per_s']:.2f}×",
          f"{min(r['steps_per_s']) / base[r['max_rows']]['steps_per_s'][0]:.2f}×"] for r in rows])
    print(table)
    write_json_atomic(args.out, {"schema_version": 1, "kind": "oretrofit.bench.pretrain_threads",
                                 "embed_dim": EMBED_DIM,
                                 "prior": {"max_rows": list(max_rows), "noise_max": NOISE_MAX},
                                 "steps": args.steps, "warmup": args.warmup, "rows": rows,
                                 "markdown": table, "environment": environment()})


if __name__ == "__main__":
    main()
