"""OAttention speed and memory against plain scaled_dot_product_attention on the same shapes.

    OMP_NUM_THREADS=1 python benchmarks/bench_attention.py [--quick] [--resume] [--max-reference-n N]

B = 1, H = 4, d ∈ {32, 64}, N = Nq = Nk ∈ {256, 1024, 4096, 8192}; forward and forward+backward;
fp32 inputs, presences in (0.1, 1], no mask. Each implementation runs interleaved with SDPA on
the same inputs (fused: 7/5/3 rounds for N ≤ 1024 / 4096 / 8192; the materialised reference: at
most 3), so load from other processes hits both alike, and the table reports the fused and
reference times as *ratios* to SDPA (min and median over the rounds). Rows are measured in
priority order (N = 4096, d = 64 first) and the receipt is rewritten after each row; ``--resume``
continues an interrupted run.

Peak memory (Linux only): per row, one worker subprocess runs each implementation once, with
``MALLOC_MMAP_THRESHOLD_`` fixed at 128 KiB so that large blocks go back to the OS when freed and
the resident set tracks live memory. Per call, after a small warm-up call, the worker resets its
resident-set high-water mark (``/proc/self/clear_refs``), allocates the inputs (and, for the
backward, the output gradient), runs the call and reads ``VmHWM − VmRSS_before``: the peak memory
of the call *including its inputs*, as ``torch.cuda.max_memory_allocated`` would count it on a
GPU. The table gives it as a ratio to SDPA's. It counts every page the process touches
(workspaces, autograd buffers), not only torch allocations.

Run with OMP_NUM_THREADS=1 for stable numbers. The script prints a Markdown table (stdout) and
writes it with a JSON receipt with provenance (``--out``, default results/bench_attention.json,
and the same name with .md).
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
from typing import Callable

import torch
import torch.nn.functional as F

from oretrofit import o_attention_fused, o_attention_reference
from oretrofit._markdown import pipe_table
from oretrofit._provenance import environment, write_json_atomic

IMPLS = ("sdpa", "fused", "reference")
TARGET = {"fwd": 1.10, "fwd+bwd": 1.20, "memory": 1.2}       # fused vs SDPA at N = 4096, d = 64


def make_inputs(n: int, d: int, backward: bool, heads: int = 4) -> dict[str, torch.Tensor]:
    """q, k, v (1, H, N, d), presences (1, N) in (0.1, 1], and the output gradient."""
    g = torch.Generator().manual_seed(0)
    t = {name: torch.randn(1, heads, n, d, generator=g) for name in ("q", "k", "v")}
    t["p_q"] = torch.rand(1, n, generator=g) * 0.9 + 0.1
    t["p_k"] = torch.rand(1, n, generator=g) * 0.9 + 0.1
    for x in t.values():
        x.requires_grad_(backward)
    if backward:
        t["grad"] = torch.randn(1, heads, n, d, generator=g)
    return t


def step(impl: str, t: dict[str, torch.Tensor], backward: bool) -> None:
    """One forward (and backward) of ``impl``; gradients are cleared afterwards."""
    if impl == "sdpa":
        out = F.scaled_dot_product_attention(t["q"], t["k"], t["v"])
    elif impl == "fused":
        out = o_attention_fused(t["q"], t["k"], t["v"], t["p_q"], t["p_k"])
    else:
        out = o_attention_reference(t["q"], t["k"], t["v"], t["p_q"], t["p_k"])[0]
    if backward:
        out.backward(t["grad"])
        for x in t.values():
            x.grad = None


def time_case(n: int, d: int, backward: bool, impls: tuple[str, ...], rounds: int
              ) -> dict[str, list[float]]:
    """Seconds per call of each implementation over interleaved rounds after one warm-up."""
    t = make_inputs(n, d, backward)
    grad_ctx: Callable[[], object] = torch.enable_grad if backward else torch.no_grad
    times: dict[str, list[float]] = {impl: [] for impl in impls}
    with grad_ctx():
        for impl in impls:
            step(impl, t, backward)
        for r in range(rounds):
            order = impls if r % 2 == 0 else impls[::-1]
            for impl in order:
                start = time.perf_counter()
                step(impl, t, backward)
                times[impl].append(time.perf_counter() - start)
    return times


def _rss_kib() -> dict[str, int]:
    """VmRSS and VmHWM (peak since the last reset) of this process, in KiB."""
    fields = {}
    with open("/proc/self/status") as fh:
        for line in fh:
            if line.startswith(("VmRSS:", "VmHWM:")):
                name, value = line.split(":")
                fields[name] = int(value.split()[0])
    return fields


def measure_memory_here(impl: str, n: int, d: int, backward: bool) -> int:
    """Peak RSS in bytes of one call and its inputs (in the worker; see module docstring)."""
    small = make_inputs(16, d, backward)              # first-call initialisation, kept off the books
    with torch.enable_grad() if backward else torch.no_grad():
        step(impl, small, backward)
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")                                 # reset the high-water mark to the current RSS
    before = _rss_kib()["VmRSS"]
    t = make_inputs(n, d, backward)
    with torch.enable_grad() if backward else torch.no_grad():
        step(impl, t, backward)
    return (_rss_kib()["VmHWM"] - before) * 1024


def memory_cases(cases: list[tuple[str, int, int, bool]]) -> list[int]:
    """Peak bytes of each (impl, N, d, backward) case, measured in one worker subprocess."""
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(128 * 1024)}
    cmd = [sys.executable, __file__, "--memory-probes", json.dumps(cases)]
    done = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure_row(d: int, n: int, mode: str, impls: tuple[str, ...], memory: bool) -> dict:
    """Time ratios and peak-memory ratios of one (d, N, pass) row.

    Fused and SDPA run interleaved for all rounds; the materialised reference (≈10× slower) runs
    interleaved with SDPA for at most 3 rounds, and its ratios use those SDPA times.
    """
    backward = mode == "fwd+bwd"
    rounds = 7 if n <= 1024 else (5 if n <= 4096 else 3)
    print(f"d={d} N={n} {mode}: {rounds} rounds of {', '.join(impls)}", file=sys.stderr, flush=True)
    times = {"fused": time_case(n, d, backward, ("sdpa", "fused"), rounds)}
    if "reference" in impls:
        times["reference"] = time_case(n, d, backward, ("sdpa", "reference"), min(rounds, 3))
    row: dict = {"d": d, "n": n, "mode": mode, "rounds": rounds, "seconds": times,
                 "sdpa_median_ms": 1e3 * statistics.median(times["fused"]["sdpa"])}
    for impl, t in times.items():
        row[f"{impl}_min_ratio"] = min(t[impl]) / min(t["sdpa"])
        row[f"{impl}_median_ratio"] = statistics.median(t[impl]) / statistics.median(t["sdpa"])
    if memory:
        peaks = memory_cases([(impl, n, d, backward) for impl in impls])
        row["peak_bytes"] = dict(zip(impls, peaks))
        for impl in impls[1:]:
            row[f"{impl}_memory_ratio"] = row["peak_bytes"][impl] / max(row["peak_bytes"]["sdpa"], 1)
    return row


def run(ns: list[int], ds: list[int], max_reference_n: int, memory: bool,
        on_row: Callable[[list[dict]], None], done: list[dict]) -> list[dict]:
    """Rows in priority order (the N = 4096, d = 64 target first); ``on_row`` sees each new list.

    Rows in ``done`` (from an interrupted run's receipt) are kept and not measured again.
    """
    cells = [(d, n) for d in ds for n in ns]
    cells.sort(key=lambda c: (c != (64, 4096), c[0] != 64, c[1]))
    rows = list(done)
    finished = {(r["d"], r["n"], r["mode"]) for r in done}
    for d, n in cells:
        impls = IMPLS if n <= max_reference_n else IMPLS[:2]
        for mode in ("fwd", "fwd+bwd"):
            if (d, n, mode) not in finished:
                rows.append(measure_row(d, n, mode, impls, memory))
                on_row(rows)
    return rows


def _fmt(row: dict, key: str) -> str:
    return f"{row[key]:.2f}×" if key in row else "–"


def markdown(rows: list[dict], threads: int) -> str:
    lines = [
        f"OAttention vs plain SDPA, B=1, H=4, fp32, CPU, {threads} thread(s); time ratios are "
        "fused/SDPA and reference/SDPA (min and median over interleaved rounds); memory ratios "
        "are the peak RSS of one call including its inputs / SDPA's.",
        "",
        pipe_table(["d", "N", "pass", "SDPA median ms", "fused min", "fused median", "fused mem",
                    "reference min", "reference median", "reference mem"],
                   [[r["d"], r["n"], r["mode"], f"{r['sdpa_median_ms']:.1f}",
                     *(_fmt(r, f"{impl}_{stat}_ratio") for impl in ("fused", "reference")
                       for stat in ("min", "median", "memory"))]
                    for r in sorted(rows, key=lambda r: (-r["d"], r["n"], r["mode"]))]),
    ]
    target = [r for r in rows if r["n"] == 4096 and r["d"] == 64]
    if target:
        verdicts = []
        for r in target:
            ok = r["fused_median_ratio"] <= TARGET[r["mode"]]
            verdicts.append(f"{r['mode']} {r['fused_median_ratio']:.2f}× "
                            f"(target ≤ {TARGET[r['mode']]:.2f}×, {'met' if ok else 'missed'})")
            if "fused_memory_ratio" in r:
                ok = r["fused_memory_ratio"] <= TARGET["memory"]
                verdicts.append(f"{r['mode']} memory {r['fused_memory_ratio']:.2f}× "
                                f"(target ≤ {TARGET['memory']:.1f}×, {'met' if ok else 'missed'})")
        lines += ["", "Fused at N=4096, d=64: " + "; ".join(verdicts) + "."]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="N ∈ {256, 1024}, d = 64 only")
    parser.add_argument("--no-memory", action="store_true", help="skip the peak-memory probes")
    parser.add_argument("--max-reference-n", type=int, default=8192,
                        help="largest N for the materialised reference (O(N²) memory)")
    parser.add_argument("--note", default="", help="free text recorded with the run (e.g. load); "
                        "with --render, replaces the receipt's")
    parser.add_argument("--out", type=Path, default=Path("results/bench_attention.json"))
    parser.add_argument("--render", action="store_true",
                        help="only re-render the Markdown table from the receipt in --out")
    parser.add_argument("--resume", action="store_true",
                        help="keep the rows already in --out (an interrupted run) and add the rest")
    parser.add_argument("--memory-probes", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_probes:
        print(json.dumps([measure_memory_here(impl, n, d, backward)
                          for impl, n, d, backward in json.loads(args.memory_probes)]))
        return
    ns, ds = ([256, 1024], [64]) if args.quick else ([256, 1024, 4096, 8192], [64, 32])
    environment_record = environment("cpu")

    def write(rows: list[dict], complete: bool = False) -> str:
        table = markdown(rows, environment_record["torch_threads"])
        write_json_atomic(args.out, {"schema_version": 1, "benchmark": "attention",
                                     "quick": args.quick, "complete": complete, "note": args.note,
                                     "environment": environment_record, "rows": rows,
                                     "markdown": table})
        args.out.with_suffix(".md").write_text(table + (f"\n\nNote: {args.note}\n" if args.note
                                                        else "\n"))
        return table

    if args.render:
        receipt = json.loads(args.out.read_text())
        environment_record = receipt["environment"]
        args.note = args.note or receipt["note"]          # --note with --render adds one afterwards
        print(write(receipt["rows"], complete=receipt["complete"]))
        return
    done = json.loads(args.out.read_text())["rows"] if args.resume and args.out.exists() else []
    rows = run(ns, ds, args.max_reference_n, not args.no_memory, on_row=write, done=done)
    print(write(rows, complete=True))
    if args.note:
        print(f"\nNote: {args.note}")
    print(f"receipt: {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
