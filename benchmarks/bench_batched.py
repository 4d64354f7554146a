"""Ragged batched TabPFN prediction: ``predict_batched`` (its defaults, and ``n_jobs`` variants)
against the per-dataset loop and against tabpfn's own ``predict_batched`` called once per shape
group.

    OMP_NUM_THREADS=1 python benchmarks/bench_batched.py [--size small] [--rounds 3]
                                                         [--datasets 64] [--device cpu]
                                                         [--two-thread-loop]
                                                         [--out results/bench_batched.json]

Workload: ``--datasets`` ragged regression datasets drawn once (seed 0): 50–500 train rows,
10–100 test rows, 2–30 features, targets on scales 1e-2 to 1e3. Host: the random-init TabPFN v3
regressor of ``--size`` retrofitted ``full-o`` at τ = 1e-8, n_estimators=2, fp32,
``fit_mode='fit_preprocessors'``; every contender fits each dataset (tabpfn's preprocessing)
and predicts its test rows:

* ``predict_batched``: ``oretrofit.tabpfn.predict_batched`` with its defaults (the forwards
  chosen by its measured cost model, ``n_jobs`` the cores torch does not use);
* ``predict_batched, n_jobs=J``: the same with ``J`` workers, J = 1 and 2 where the default
  differs (torch keeps its threads, one on the CPU: ``J`` cores in all);
* ``loop``: ``copy.copy(regressor).fit(X, y).predict(X_test)`` per dataset, torch on its
  threads (one on the CPU); with ``--two-thread-loop`` also ``loop, 2 threads`` (torch on
  two), the loop on the same two cores as ``n_jobs=2``, and n_jobs=2 is held against the
  faster of the two loops;
* ``tabpfn grouped``: ``regressor.predict_batched`` once per group of equal raw shapes
  (tabpfn ≥ 8.1; it refuses ragged groups). With ragged draws most groups hold one dataset.

The contenders run in interleaved rounds after a warm-up (other load hits them alike); the
table gives each one's median seconds, datasets per second and its throughput relative to the
loop's in the same run. Prints a Markdown table and writes a JSON receipt with provenance.
"""

from __future__ import annotations

import argparse
import copy
import json
import math
import statistics
import sys
import time
import warnings
from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from oretrofit._files.markdown import pipe_table
from oretrofit._files.provenance import environment, portable, write_json_atomic
from oretrofit.hosts.tabpfn import releases
from oretrofit.hosts.tabpfn.batched import default_jobs
from oretrofit.hosts.tabpfn.checkpoints import cache_dir
from oretrofit.hosts.tabpfn.reload import patched_model
from oretrofit.tabpfn import (checkpoint_sha256, make_regressor, predict_batched,
                              write_random_checkpoint)

TAU, SEED, N_ESTIMATORS = 1e-8, 0, 2
TARGETS = {"cpu": {"default": 1.0, "n_jobs=2": 1.5}, "cuda": {"default": 3.0, "grouped": 5.0}}
"""Throughput over the loop's: the defaults (CPU and GPU), n_jobs=2 over the faster loop on
two cores (CPU), the defaults over tabpfn grouped (GPU)."""
Data = list[tuple[np.ndarray, np.ndarray, np.ndarray]]
Run = Callable[[Data], list[np.ndarray]]


def host(size: str) -> Path:
    path = (cache_dir()
            / f"tabpfn-v3-random-{size}-seed{SEED}-tabpfn{releases.installed_version()}.ckpt")
    return path if path.exists() else write_random_checkpoint(path, size, SEED)


def ragged(count: int) -> Data:
    rng = np.random.default_rng(SEED)
    out = []
    for _ in range(count):
        n, m, c = int(rng.integers(50, 501)), int(rng.integers(10, 101)), int(rng.integers(2, 31))
        x = rng.normal(size=(n + m, c))
        y = np.tanh(x @ rng.normal(size=c)) + 0.1 * rng.normal(size=n + m)
        y = y * 10 ** rng.uniform(-2, 3)
        out.append((x[:n], y[:n], x[n:]))
    return out


def contenders(regressor: Any, two_thread_loop: bool) -> dict[str, tuple[int, Run]]:
    """Each contender's torch threads and its run."""
    def loop(data: Data) -> list[np.ndarray]:
        return [copy.copy(regressor).fit(x, y).predict(t) for x, y, t in data]

    def grouped(data: Data) -> list[np.ndarray]:
        groups: dict[tuple, list[int]] = defaultdict(list)
        for i, (x, _, t) in enumerate(data):
            groups[(x.shape, t.shape)].append(i)
        out: list[Any] = [None] * len(data)
        for members in groups.values():
            for i, p in zip(members, regressor.predict_batched(*[[data[i][k] for i in members]
                                                                 for k in range(3)])):
                out[i] = p
        return out

    def batched(**options: Any) -> Run:
        return lambda data: predict_batched(regressor, *zip(*data), **options)

    threads = torch.get_num_threads()
    runs: dict[str, tuple[int, Run]] = {"loop": (threads, loop)}
    if two_thread_loop:
        runs["loop, 2 threads"] = (2, loop)
    runs["predict_batched"] = (threads, batched())
    for jobs in sorted({1, 2} - {default_jobs(regressor)}):
        runs[f"predict_batched, n_jobs={jobs}"] = (threads, batched(n_jobs=jobs))
    if hasattr(regressor, "predict_batched"):
        runs["tabpfn grouped"] = (threads, grouped)
    return runs


def timed(regressor: Any, runs: dict[str, tuple[int, Run]], data: Data, rounds: int,
          device: str) -> tuple[dict[str, list[float]], dict[str, int], dict[str, float]]:
    """Interleaved rounds after a warm-up (which also measures predict_batched's cost model
    once) that counts each contender's model forwards (calls of the first ICL block) and finds
    the largest relative difference of each one's predictions from the loop's."""
    predict_batched(regressor, *zip(*data[:2]))
    block, first, forwards = patched_model(regressor.model_path).icl_blocks[0], {}, {}
    for name, (threads, run) in runs.items():
        count = [0]
        hook = block.register_forward_pre_hook(lambda *_: count.__setitem__(0, count[0] + 1))
        torch.set_num_threads(threads)
        try:
            first[name] = run(data)
        finally:
            hook.remove()
        forwards[name] = count[0]
    agree = {name: max(float(np.abs(a - b).max() / np.abs(b).max())
                       for a, b in zip(first[name], first["loop"])) for name in runs}
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    for _ in range(rounds):
        for name, (threads, run) in runs.items():
            torch.set_num_threads(threads)
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            start = time.perf_counter()
            run(data)
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            seconds[name].append(time.perf_counter() - start)
    return seconds, forwards, agree


def fixed_forward_seconds(regressor: Any, device: str, repeats: int = 5) -> float:
    """Median seconds of the smallest forward (2 train + 10 test rows, 2 features, the
    members as lanes): a per-forward cost no batching can go below."""
    model = patched_model(regressor.model_path)
    x = torch.randn(12, N_ESTIMATORS, 2, device=device)
    y = torch.randn(2, N_ESTIMATORS, device=device)
    times = []
    with torch.inference_mode():
        for _ in range(repeats + 1):
            start = time.perf_counter()
            model(x, y)
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            times.append(time.perf_counter() - start)
    return statistics.median(times[1:])


def _ratios(receipt: dict[str, Any]) -> dict[str, float]:
    """Throughput ratios of the targets (see ``TARGETS``) in this receipt."""
    median = {r["contender"]: r["seconds_median"] for r in receipt["rows"]}
    out = {"default": median["loop"] / median["predict_batched"]}
    if "predict_batched, n_jobs=2" in median:
        out["n_jobs=2"] = (min(median["loop"], median.get("loop, 2 threads", math.inf))
                           / median["predict_batched, n_jobs=2"])
    if "tabpfn grouped" in median:
        out["grouped"] = median["tabpfn grouped"] / median["predict_batched"]
    return out


def markdown(receipt: dict[str, Any]) -> str:
    rows = receipt["rows"]
    loop = next(r for r in rows if r["contender"] == "loop")["seconds_median"]
    lines = [f"{receipt['datasets']} ragged regression datasets (50–500 train rows, 10–100 test "
             f"rows, 2–30 features), TabPFN v3 {receipt['size']} host (random weights), full-o "
             f"τ={TAU:g}, n_estimators={N_ESTIMATORS}, fp32, {receipt['device']}, torch on "
             f"{receipt['threads']} thread(s) unless the row says otherwise, predict_batched's "
             f"default n_jobs={receipt['default_n_jobs']}, {receipt['rounds']} interleaved "
             "rounds.", ""]
    header = ["contender", "forwards", "seconds (median)", "datasets / s", "throughput vs loop",
              "max rel. difference from loop"]
    table = [[r["contender"], str(r["forwards"]), f"{r['seconds_median']:.2f}",
              f"{receipt['datasets'] / r['seconds_median']:.2f}",
              f"{loop / r['seconds_median']:.2f}×", f"{r['max_rel_difference']:.1e}"]
             for r in rows]
    lines.append(pipe_table(header, table, align=["left"] + ["right"] * 5))
    what = {"default": "predict_batched (defaults) over the loop",
            "n_jobs=2": "n_jobs=2 over the loop" + (" (the faster of its one- and two-thread "
                                                    "runs)" if "loop, 2 threads" in
                                                    {r["contender"] for r in rows} else ""),
            "grouped": "predict_batched (defaults) over tabpfn grouped"}
    ratios = _ratios(receipt)
    goals = [f"{what[key]} ≥ {target:g}× — {'met' if ratios[key] >= target else 'missed'} "
             f"({ratios[key]:.2f}×)" for key, target in receipt["targets"].items()
             if key in ratios]
    lines.append(f"\nGoals: {'; '.join(goals)}. The smallest forward takes "
                 f"{receipt['fixed_forward_s'] * 1e3:.0f} ms, so batching that removed every "
                 f"forward's fixed cost and padded nothing would reach about "
                 f"{receipt['ceiling']:.2f}× the loop here on one core.")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size", default="small", choices=["small", "default"])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--datasets", type=int, default=64)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, default=Path("results/bench_batched.json"))
    parser.add_argument("--two-thread-loop", action="store_true",
                        help="also time the loop with torch on two threads (CPU)")
    parser.add_argument("--report-only", action="store_true",
                        help="re-render the table of the receipt at --out; run nothing")
    args = parser.parse_args()
    if args.report_only:
        print(markdown(json.loads(args.out.read_text())))
        return
    warnings.filterwarnings("ignore", message="Running on CPU with more than")
    if args.device == "cpu":
        torch.set_num_threads(1)
    path = host(args.size)
    regressor, _ = make_regressor(path, "full-o", TAU, n_estimators=N_ESTIMATORS,
                                  device=args.device, inference_precision=torch.float32)
    data = ragged(args.datasets)
    runs = contenders(regressor, args.two_thread_loop)
    threads = torch.get_num_threads()
    seconds, forwards, agree = timed(regressor, runs, data, args.rounds, args.device)
    torch.set_num_threads(threads)
    fixed = fixed_forward_seconds(regressor, args.device)
    loop = statistics.median(seconds["loop"])
    rows = [{"contender": name, "seconds": seconds[name], "forwards": forwards[name],
             "seconds_median": statistics.median(seconds[name]),
             "max_rel_difference": agree[name]} for name in runs]
    receipt = {"schema_version": 2, "benchmark": "bench_batched", "size": args.size,
               "checkpoint": portable(path), "checkpoint_sha256": checkpoint_sha256(path),
               "weights": "random", "tau": TAU, "seed": SEED, "n_estimators": N_ESTIMATORS,
               "datasets": args.datasets, "rounds": args.rounds, "device": args.device,
               "threads": threads, "targets": TARGETS["cuda" if args.device.startswith("cuda")
                                                       else "cpu"],
               "default_n_jobs": default_jobs(regressor),
               "fixed_forward_s": fixed,
               "ceiling": loop / max(loop - args.datasets * fixed, 1e-9),
               "shapes": [[x.shape[0], t.shape[0], x.shape[1]] for x, _, t in data],
               "rows": rows, "environment": environment()}
    receipt["markdown"] = markdown(receipt)
    write_json_atomic(args.out, receipt)
    print(receipt["markdown"])
    print(json.dumps({"receipt": str(args.out)}), file=sys.stderr)


if __name__ == "__main__":
    main()
