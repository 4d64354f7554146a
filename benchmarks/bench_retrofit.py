"""TabPFN v3 retrofit cost: predict time, peak memory and patch time of each arm vs base.

    OMP_NUM_THREADS=1 python benchmarks/bench_retrofit.py [--quick] [--rounds N] [--device cuda]
                                                          [--out results/bench_retrofit.json]

Host: the default-size (58.3M parameters) random-init TabPFN v3 regressor (``--quick``: the
small host), 512 × 10 train rows and 256 test rows of a fixed synthetic table, n_estimators=1,
one thread, ``fit_mode='fit_preprocessors'``, τ = 1e-8 (the O arms; ``base`` is unpatched).
``--device cuda`` runs tabpfn on the GPU at its default inference precision (it autocasts).

* Predict time: one regressor per arm, fitted once; the arms' ``predict`` calls run in
  interleaved rounds (load from other processes hits all of them alike); the table gives the
  median and its ratio to base's median in the same run.
* Cached predict time: the same with ``fit_mode='fit_with_cache'`` (tabpfn's KV cache of the
  train rows; under O it carries their presences), every arm with an unquantized cache
  (``kv_cache_precision='auto'`` where tabpfn has it), ratio to base's cached median.
* Peak memory: each arm runs once in a fresh subprocess. On the CPU (Linux), after fit the
  process resets its resident-set high-water mark (``/proc/self/clear_refs``) and reads
  ``VmHWM − VmRSS_before`` over its first ``predict`` (glibc's mmap threshold is fixed at
  128 KiB, so large tensors are mapped and unmapped); on CUDA, ``max_memory_allocated`` over
  that ``predict`` less the memory allocated before it. The table gives it as a ratio to base.
* Patch time: ``oretrofit.retrofit(model, arm, τ)`` on a loaded model (median of 5, reverted
  in between).

Prints a Markdown table (stdout) and writes a JSON receipt with provenance.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

import oretrofit
from oretrofit._files.markdown import pipe_table
from oretrofit._files.provenance import environment, portable, write_json_atomic
from oretrofit.hosts.tabpfn import releases
from oretrofit.tabpfn import (build_model, checkpoint_sha256, load_checkpoint, make_regressor,
                              write_random_checkpoint)
from oretrofit.hosts.tabpfn.checkpoints import cache_dir

ARMS = ("base", "oa", "full-o")
TARGET = {"oa": 1.10, "full-o": 1.20}        # predict-time ratio to base
PATCH_TARGET_S = 0.5
TAU, SEED = 1e-8, 0
N_TRAIN, N_TEST, N_FEATURES = 512, 256, 10


def host(size: str) -> Path:
    path = (cache_dir()
            / f"tabpfn-v3-random-{size}-seed{SEED}-tabpfn{releases.installed_version()}.ckpt")
    return path if path.exists() else write_random_checkpoint(path, size, SEED)


def table_data() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    rng = np.random.default_rng(SEED)
    x = rng.normal(size=(N_TRAIN + N_TEST, N_FEATURES))
    y = np.sin(x[:, 0]) + x[:, 1] * x[:, 2] + 0.1 * rng.normal(size=len(x))
    return x[:N_TRAIN], y[:N_TRAIN], x[N_TRAIN:]


def fitted(path: Path, arm: str, device: str, fit_mode: str = "fit_preprocessors"):
    """A regressor of ``arm`` fitted on the table (``base``: unpatched, so no τ)."""
    from tabpfn import TabPFNRegressor
    x_train, y_train, _ = table_data()
    options = (releases.cache_options(TabPFNRegressor, {}) if fit_mode == "fit_with_cache"
               else {})
    regressor, _ = make_regressor(path, arm, None if arm == "base" else TAU, random_state=SEED,
                                  n_estimators=1, fit_mode=fit_mode, device=device,
                                  inference_precision=torch.float32, **options)
    return regressor.fit(x_train, y_train)


def _status_kb(field: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise RuntimeError(f"{field} not in /proc/self/status")


def memory_probe(path: Path, arm: str, device: str) -> int:
    """Peak bytes added by one predict (run in a fresh process): resident memory on the CPU,
    allocated CUDA memory on a GPU."""
    regressor = fitted(path, arm, device)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        regressor.predict(table_data()[2])
        return torch.cuda.max_memory_allocated() - before
    Path("/proc/self/clear_refs").write_text("5")          # reset VmHWM to the current RSS
    before = _status_kb("VmRSS")
    regressor.predict(table_data()[2])
    return (_status_kb("VmHWM") - before) * 1024


def patch_seconds(path: Path, arm: str, repeats: int = 5) -> float:
    model, _, _ = build_model(load_checkpoint(path))
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        result = oretrofit.retrofit(model, arm, TAU)
        times.append(time.perf_counter() - start)
        result.revert()
    return statistics.median(times)


def predict_seconds(path: Path, rounds: int, fit_mode: str, device: str
                    ) -> dict[str, list[float]]:
    regressors = {arm: fitted(path, arm, device, fit_mode) for arm in ARMS}
    x_test = table_data()[2]
    for regressor in regressors.values():
        regressor.predict(x_test)                               # warm-up
    times: dict[str, list[float]] = {arm: [] for arm in ARMS}
    for _ in range(rounds):
        for arm, regressor in regressors.items():
            start = time.perf_counter()
            regressor.predict(x_test)
            times[arm].append(time.perf_counter() - start)
    return times


def markdown(rows: list[dict[str, Any]], size: str, device: str = "cpu") -> str:
    precision = "fp32, 1 thread" if device == "cpu" else f"{device}, tabpfn's default precision"
    lines = [f"TabPFN v3 {size} host (random weights), {N_TRAIN}×{N_FEATURES} train / {N_TEST} "
             f"test rows, n_estimators=1, {precision}, τ={TAU:g}.",
             ""]
    header = ["arm", "sites", "predict s (median)", "time ratio (median)", "time ratio (min)",
              "target", "cached predict s (median)", "cached time ratio", "peak MB (predict)",
              "memory ratio", "patch s"]
    base_min = min(rows[0]["predict_s"])
    table = [[r["arm"], r["sites"], f"{r['predict_s_median']:.3f}", f"{r['time_ratio']:.3f}×",
              f"{min(r['predict_s']) / base_min:.3f}×",
              f"≤ {TARGET[r['arm']]:.2f}×" if r["arm"] in TARGET else "-",
              f"{r['cached_predict_s_median']:.3f}", f"{r['cached_time_ratio']:.3f}×",
              f"{r['peak_bytes'] / 2**20:.1f}", f"{r['memory_ratio']:.3f}×",
              "-" if r["arm"] == "base" else f"{r['patch_s']:.3f}"] for r in rows]
    lines.append(pipe_table(header, table, align=["left"] + ["right"] * (len(header) - 1)))
    lines.append(f"\nPatch-time target < {PATCH_TARGET_S} s. Ratios are to base in the same run "
                 f"({len(rows[0]['predict_s'])} interleaved rounds); cached: "
                 "fit_mode='fit_with_cache', unquantized cache, ratio to base's cached median.")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small host, 2 rounds")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    parser.add_argument("--out", type=Path, default=Path("results/bench_retrofit.json"))
    parser.add_argument("--memory-probe", nargs=2, help=argparse.SUPPRESS)
    parser.add_argument("--report-only", action="store_true",
                        help="re-render the table of the receipt at --out; run nothing")
    args = parser.parse_args()
    if args.report_only:
        receipt = json.loads(args.out.read_text())
        print(markdown(receipt["rows"], receipt["size"], receipt.get("device", "cpu")))
        return
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        parser.error(f"--device {args.device}: torch has no CUDA device here; use --device cpu")
    torch.set_num_threads(1)
    if args.memory_probe:
        print(memory_probe(Path(args.memory_probe[0]), args.memory_probe[1], args.device))
        return
    size = "small" if args.quick else "default"
    rounds = 2 if args.quick else args.rounds
    path = host(size)
    print(f"host {path}", file=sys.stderr)
    # A fixed mmap threshold makes glibc map every tensor >= 128 KiB afresh and unmap it on
    # free, so the high-water mark measures live memory, not the allocator's history.
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(128 * 1024)}
    peak = {arm: int(subprocess.run([sys.executable, __file__, "--memory-probe", str(path), arm,
                                     "--device", args.device],
                                    check=True, capture_output=True, text=True,
                                    env=env).stdout.split()[-1])
            for arm in ARMS}
    print(f"peak memory {peak}", file=sys.stderr)
    times = predict_seconds(path, rounds, "fit_preprocessors", args.device)
    cached = predict_seconds(path, rounds, "fit_with_cache", args.device)
    model, _, _ = build_model(load_checkpoint(path))
    rows = []
    for arm in ARMS:
        median = statistics.median(times[arm])
        cached_median = statistics.median(cached[arm])
        sites = 0 if arm == "base" else len(oretrofit.plan_retrofit(model, arm, TAU).entries)
        rows.append({"arm": arm, "sites": sites, "predict_s": times[arm],
                     "predict_s_median": median,
                     "time_ratio": median / statistics.median(times["base"]),
                     "cached_predict_s": cached[arm], "cached_predict_s_median": cached_median,
                     "cached_time_ratio": cached_median / statistics.median(cached["base"]),
                     "peak_bytes": peak[arm], "memory_ratio": peak[arm] / peak["base"],
                     "patch_s": 0.0 if arm == "base" else patch_seconds(path, arm)})
    table = markdown(rows, size, args.device)
    receipt = {"schema_version": 1, "benchmark": "bench_retrofit", "size": size,
               "device": args.device,
               "checkpoint": portable(path), "checkpoint_sha256": checkpoint_sha256(path),
               "weights": "random", "tau": TAU, "seed": SEED, "rounds": rounds,
               "shape": {"train": N_TRAIN, "test": N_TEST, "features": N_FEATURES},
               "targets": {"time_ratio": TARGET, "patch_s": PATCH_TARGET_S}, "rows": rows,
               "markdown": table, "environment": environment()}
    write_json_atomic(args.out, receipt)
    print(table)
    print(json.dumps({"receipt": str(args.out)}), file=sys.stderr)


if __name__ == "__main__":
    main()
