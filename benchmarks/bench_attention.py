"""OAttention speed and memory against plain scaled_dot_product_attention on the same shapes.

    OMP_NUM_THREADS=1 python benchmarks/bench_attention.py [--quick] [--resume] [--max-reference-n N]

Cells (heads H, head size d, N = Nq = Nk), B = 1, fp32 inputs, presences in (0.1, 1], no mask:
H = 4 with d ∈ {64, 32} and N ∈ {256, 1024, 4096, 8192}, and H = 1 with d = 64, N = 4096. Passes:

* ``fwd``: the forward under ``torch.no_grad()`` (a frozen host; the fused path saves nothing);
* ``fwd+bwd``: forward and backward with every input requiring grad (q, k, v, p_q and p_k);

and at the target cells (N = 4096, d = 64, H = 1 and 4) also

* ``fwd (grad)``: the forward with every input requiring grad, no backward (what a training
  step holds from its forward to its backward);
* ``fwd+bwd (p_k fixed)``: as ``fwd+bwd`` with p_k not requiring grad (the fused backward then
  augments nothing; see oretrofit/_kernels/lse.py).

Time: each implementation runs interleaved with SDPA on the same inputs (fused: 7/5/3 rounds
for N ≤ 1024 / 4096 / 8192; the materialised reference, fwd and fwd+bwd only: at most 3), so
load from other processes hits both alike. Each call's CPU time of this (single compute) thread
(``time.thread_time``) and wall time are recorded; the table reports the median CPU-time ratio to
SDPA (on this shared machine the process is descheduled at random for tens of milliseconds,
which wall time counts and CPU time does not) and, beside it, the median wall-time ratio. The
verdicts use the CPU-time ratio. Rows are measured in priority order (the target cells first) and
the receipt is rewritten after each row; ``--resume`` continues an interrupted run.

Peak memory (Linux only): per row, each implementation runs once in a fresh worker subprocess, with
``MALLOC_MMAP_THRESHOLD_`` fixed at 128 KiB so that large blocks go back to the OS when freed and
the resident set tracks live memory. Per call, after a small warm-up call, the worker resets its
resident-set high-water mark (``/proc/self/clear_refs``), allocates the inputs (and, for the
backward, the output gradient), runs the call and reads ``VmHWM − VmRSS_before``: the peak memory
of the call *including its inputs*, as ``torch.cuda.max_memory_allocated`` would count it on a
GPU. The table gives it as a ratio to SDPA's. It counts every page the process touches
(workspaces, autograd buffers, heap blocks under 128 KiB that glibc keeps), not only live tensors.

Run with OMP_NUM_THREADS=1. The script prints a Markdown table (stdout) and writes it with a JSON
receipt with provenance (``--out``, default results/bench_attention.json, and the same name with
.md).
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
from oretrofit._files.markdown import pipe_table
from oretrofit._files.provenance import environment, write_json_atomic

IMPLS = ("sdpa", "fused", "reference")
MODES = ("fwd", "fwd+bwd")
TARGET_MODES = ("fwd", "fwd (grad)", "fwd+bwd", "fwd+bwd (p_k fixed)")
TARGET_CELLS = ((4, 64, 4096), (1, 64, 4096))                 # (H, d, N)
# fused vs SDPA at the target cells: median CPU-time ratio, and peak-memory ratio
TIME_TARGET = {"fwd": 1.05, "fwd+bwd": 1.15}
MEMORY_TARGET = {"fwd": 1.05, "fwd (grad)": 1.05, "fwd+bwd": 1.10}


def make_inputs(n: int, d: int, mode: str, heads: int = 4) -> dict[str, torch.Tensor]:
    """q, k, v (1, H, N, d), presences (1, N) in (0.1, 1], and for a backward the output gradient;
    requiring grad as ``mode`` says."""
    g = torch.Generator().manual_seed(0)
    t = {name: torch.randn(1, heads, n, d, generator=g) for name in ("q", "k", "v")}
    t["p_q"] = torch.rand(1, n, generator=g) * 0.9 + 0.1
    t["p_k"] = torch.rand(1, n, generator=g) * 0.9 + 0.1
    if mode != "fwd":
        for name, x in t.items():
            x.requires_grad_(not (name == "p_k" and mode == "fwd+bwd (p_k fixed)"))
    if backward(mode):
        t["grad"] = torch.randn(1, heads, n, d, generator=g)
    return t


def backward(mode: str) -> bool:
    return mode.startswith("fwd+bwd")


def grad_context(mode: str) -> Callable[[], object]:
    return torch.no_grad if mode == "fwd" else torch.enable_grad


def step(impl: str, t: dict[str, torch.Tensor], mode: str) -> torch.Tensor:
    """One forward (and backward) of ``impl``; gradients are cleared afterwards."""
    if impl == "sdpa":
        out = F.scaled_dot_product_attention(t["q"], t["k"], t["v"])
    elif impl == "fused":
        out = o_attention_fused(t["q"], t["k"], t["v"], t["p_q"], t["p_k"])
    else:
        out = o_attention_reference(t["q"], t["k"], t["v"], t["p_q"], t["p_k"])[0]
    if backward(mode):
        out.backward(t["grad"])
        for x in t.values():
            x.grad = None
    return out


def time_case(heads: int, n: int, d: int, mode: str, impls: tuple[str, ...], rounds: int
              ) -> dict[str, dict[str, list[float]]]:
    """CPU and wall seconds per call of each implementation, interleaved, after one warm-up."""
    t = make_inputs(n, d, mode, heads)
    times: dict[str, dict[str, list[float]]] = {impl: {"cpu": [], "wall": []} for impl in impls}
    with grad_context(mode)():
        for impl in impls:
            step(impl, t, mode)
        for r in range(rounds):
            for impl in impls if r % 2 == 0 else impls[::-1]:
                cpu, wall = time.thread_time(), time.perf_counter()
                step(impl, t, mode)
                times[impl]["wall"].append(time.perf_counter() - wall)
                times[impl]["cpu"].append(time.thread_time() - cpu)
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


def measure_memory_here(impl: str, heads: int, n: int, d: int, mode: str) -> int:
    """Peak RSS in bytes of one call and its inputs (in the worker; see module docstring)."""
    small = make_inputs(16, d, mode, heads)        # first-call initialisation, kept off the books
    with grad_context(mode)():
        step(impl, small, mode)
    del small
    with open("/proc/self/clear_refs", "w") as fh:
        fh.write("5")                                 # reset the high-water mark to the current RSS
    before = _rss_kib()["VmRSS"]
    t = make_inputs(n, d, mode, heads)
    with grad_context(mode)():
        step(impl, t, mode)
    return (_rss_kib()["VmHWM"] - before) * 1024


def memory_cases(cases: list[tuple[str, int, int, int, str]]) -> list[int]:
    """Peak bytes of each (impl, H, N, d, mode) case, each in a fresh worker subprocess."""
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": str(128 * 1024)}
    peaks = []
    for case in cases:
        cmd = [sys.executable, __file__, "--memory-probe", json.dumps(case)]
        done = subprocess.run(cmd, capture_output=True, text=True, check=True, env=env)
        peaks.append(int(done.stdout.strip().splitlines()[-1]))
    return peaks


def _ratios(times: dict[str, dict[str, list[float]]], impl: str) -> dict[str, float]:
    return {f"{impl}_{clock}_median_ratio": statistics.median(times[impl][clock])
            / statistics.median(times["sdpa"][clock]) for clock in ("cpu", "wall")}


def measure_row(heads: int, d: int, n: int, mode: str, impls: tuple[str, ...], memory: bool
                ) -> dict:
    """Time ratios and peak-memory ratios of one (H, d, N, pass) row.

    Fused and SDPA run interleaved for all rounds; the materialised reference (≈10× slower) runs
    interleaved with SDPA for at most 3 rounds, and its ratios use those SDPA times.
    """
    rounds = 7 if n <= 1024 else (5 if n <= 4096 else 3)
    print(f"H={heads} d={d} N={n} {mode}: {rounds} rounds of {', '.join(impls)}", file=sys.stderr,
          flush=True)
    times = {"fused": time_case(heads, n, d, mode, ("sdpa", "fused"), rounds)}
    if "reference" in impls:
        times["reference"] = time_case(heads, n, d, mode, ("sdpa", "reference"), min(rounds, 3))
    row: dict = {"heads": heads, "d": d, "n": n, "mode": mode, "rounds": rounds, "seconds": times,
                 "sdpa_cpu_median_ms": 1e3 * statistics.median(times["fused"]["sdpa"]["cpu"])}
    for impl, t in times.items():
        row.update(_ratios(t, impl))
    if memory:
        peaks = memory_cases([(impl, heads, n, d, mode) for impl in impls])
        row["peak_bytes"] = dict(zip(impls, peaks))
        for impl in impls[1:]:
            row[f"{impl}_memory_ratio"] = row["peak_bytes"][impl] / max(row["peak_bytes"]["sdpa"], 1)
    return row


def cells(quick: bool) -> list[tuple[int, int, int]]:
    """(H, d, N) in priority order: the target cells first."""
    if quick:
        return [(4, 64, n) for n in (256, 1024)]
    grid = [(4, d, n) for d in (64, 32) for n in (256, 1024, 4096, 8192)]
    return [*TARGET_CELLS, *(c for c in grid if c not in TARGET_CELLS)]


def run(grid: list[tuple[int, int, int]], max_reference_n: int, memory: bool,
        on_row: Callable[[list[dict]], None], done: list[dict]) -> list[dict]:
    """Rows of ``grid``; ``on_row`` sees each new list. Rows in ``done`` (an interrupted run's
    receipt) are kept and not measured again."""
    rows = list(done)
    finished = {(r["heads"], r["d"], r["n"], r["mode"]) for r in done}
    for heads, d, n in grid:
        modes = TARGET_MODES if (heads, d, n) in TARGET_CELLS else MODES
        for mode in modes:
            impls = IMPLS if n <= max_reference_n and mode in MODES else IMPLS[:2]
            if (heads, d, n, mode) not in finished:
                rows.append(measure_row(heads, d, n, mode, impls, memory))
                on_row(rows)
    return rows


def _fmt(row: dict, key: str) -> str:
    return f"{row[key]:.2f}×" if key in row else "–"


def verdicts(rows: list[dict]) -> list[str]:
    """One line per target cell: each targeted ratio, the target, met or missed."""
    lines = []
    for heads, d, n in TARGET_CELLS:
        parts = []
        for mode in TARGET_MODES:
            row = next((r for r in rows if (r["heads"], r["d"], r["n"], r["mode"])
                        == (heads, d, n, mode)), None)
            if row is None:
                continue
            checks = [("", row["fused_cpu_median_ratio"], TIME_TARGET.get(mode)),
                      (" memory", row.get("fused_memory_ratio"), MEMORY_TARGET.get(mode))]
            for what, value, target in checks:
                if value is None:
                    continue
                if target is None:
                    parts.append(f"{mode}{what} {value:.2f}×")
                else:
                    parts.append(f"{mode}{what} {value:.2f}× (target ≤ {target:.2f}×, "
                                 f"{'met' if value <= target else 'missed'})")
        if parts:
            lines.append(f"Fused at N={n}, d={d}, H={heads}: " + "; ".join(parts) + ".")
    return lines


def markdown(rows: list[dict], threads: int) -> str:
    order = {mode: i for i, mode in enumerate(TARGET_MODES)}
    lines = [
        f"OAttention vs plain SDPA, B=1, fp32, CPU, {threads} thread(s); time ratios are "
        "fused/SDPA and reference/SDPA, medians over interleaved rounds of the thread's CPU time "
        "(and of wall time); memory ratios are the peak RSS of one call including its inputs / "
        "SDPA's.",
        "",
        pipe_table(["H", "d", "N", "pass", "SDPA median ms (CPU)", "fused (CPU)", "fused (wall)",
                    "fused mem", "reference (CPU)", "reference mem"],
                   [[r["heads"], r["d"], r["n"], r["mode"], f"{r['sdpa_cpu_median_ms']:.1f}",
                     _fmt(r, "fused_cpu_median_ratio"), _fmt(r, "fused_wall_median_ratio"),
                     _fmt(r, "fused_memory_ratio"), _fmt(r, "reference_cpu_median_ratio"),
                     _fmt(r, "reference_memory_ratio")]
                    for r in sorted(rows, key=lambda r: (-r["heads"], -r["d"], r["n"],
                                                         order[r["mode"]]))]),
    ]
    for line in verdicts(rows):
        lines += ["", line]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="H = 4, d = 64, N ∈ {256, 1024} only")
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
    parser.add_argument("--memory-probe", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.memory_probe:
        impl, heads, n, d, mode = json.loads(args.memory_probe)
        print(measure_memory_here(impl, heads, n, d, mode))
        return
    environment_record = environment("cpu")

    def write(rows: list[dict], complete: bool = False) -> str:
        table = markdown(rows, environment_record["torch_threads"])
        write_json_atomic(args.out, {"schema_version": 2, "benchmark": "attention",
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
    done = []
    if args.resume and args.out.exists():
        receipt = json.loads(args.out.read_text())
        done = receipt["rows"] if receipt.get("schema_version") == 2 else []
    rows = run(cells(args.quick), args.max_reference_n, not args.no_memory, on_row=write,
               done=done)
    print(write(rows, complete=True))
    if args.note:
        print(f"\nNote: {args.note}")
    print(f"receipt: {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
