#!/usr/bin/env python3
"""Fused OAttention against plain ``scaled_dot_product_attention`` on CUDA, and the SDPA kernel
each one runs (called by ``scripts/gpu_check.sh``; needs a CUDA device).

B = 1, H = 4, d = 64, N = Nq = Nk ∈ {1024, 4096, 8192}, inputs in fp32 / bf16 / fp16, presences
in (0.1, 1], no mask. Per row: forward time of each (CUDA events, median of ``--rounds`` after
warm-up, the two interleaved) and the ratio fused / SDPA; the CUDA kernels of one call of each,
read with ``torch.profiler``, classified as flash / efficient (mem-efficient) / cudnn / math.
Half-precision inputs are computed in fp32 by the fused path (see
:func:`oretrofit._attention.o_attention`), which the kernel column shows.

Writes ``OUT/attention.json`` (rows + provenance) and ``OUT/attention.md``.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from oretrofit._attention import o_attention_fused
from oretrofit._markdown import pipe_table
from oretrofit._provenance import environment, write_json_atomic

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
KERNEL_FAMILIES = (("flash", "flash"), ("efficient", "efficient"), ("efficient", "fmha"),
                   ("cudnn", "cudnn"))


def kernels(call: Callable[[], object]) -> list[str]:
    """Attention kernel families of the CUDA kernels one ``call`` launches ('math' if none)."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    names = [e.name.lower() for e in prof.events() if e.device_type.name == "CUDA"]
    found = sorted({family for family, key in KERNEL_FAMILIES if any(key in n for n in names)})
    return found or ["math"]


def milliseconds(calls: dict[str, Callable[[], object]], rounds: int) -> dict[str, float]:
    """Median forward time of each call, interleaved, after two warm-up calls."""
    for call in calls.values():
        call(), call()
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(rounds):
        for name, call in calls.items():
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            call()
            end.record()
            torch.cuda.synchronize()
            times[name].append(start.elapsed_time(end))
    return {name: statistics.median(t) for name, t in times.items()}


def row(n: int, dtype: str, rounds: int) -> dict[str, object]:
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(1, 4, n, 64, device="cuda", generator=g, dtype=DTYPES[dtype])
               for _ in range(3))
    p = 0.1 + 0.9 * torch.rand(1, n, device="cuda", generator=g)
    calls = {"sdpa": lambda: F.scaled_dot_product_attention(q, k, v),
             "fused": lambda: o_attention_fused(q, k, v, p, p)}
    with torch.no_grad():
        ms = milliseconds(calls, rounds)
        return {"n": n, "dtype": dtype, "sdpa_ms": ms["sdpa"], "fused_ms": ms["fused"],
                "ratio": ms["fused"] / ms["sdpa"], "sdpa_kernels": kernels(calls["sdpa"]),
                "fused_kernels": kernels(calls["fused"])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("results/cuda"))
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args()
    if not torch.cuda.is_available():
        raise SystemExit("error: no CUDA device; this check runs on a GPU machine")
    rows = [row(n, dtype, args.rounds) for dtype in DTYPES for n in (1024, 4096, 8192)]
    header = ["dtype", "N", "SDPA ms", "fused ms", "fused / SDPA", "SDPA kernel", "fused kernel"]
    table = pipe_table(header, [[r["dtype"], r["n"], f"{r['sdpa_ms']:.3f}", f"{r['fused_ms']:.3f}",
                                 f"{r['ratio']:.2f}×", ", ".join(r["sdpa_kernels"]),
                                 ", ".join(r["fused_kernels"])] for r in rows])
    text = (f"OAttention (fused) vs SDPA on {torch.cuda.get_device_name()}: B=1, H=4, d=64, "
            f"forward, median of {args.rounds} interleaved rounds.\n\n{table}\n")
    args.out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(args.out / "attention.json",
                      {"schema_version": 1, "rows": rows, "environment": environment("cuda")})
    (args.out / "attention.md").write_text(text)
    print(text)
    print(json.dumps({"receipt": str(args.out / "attention.json")}))


if __name__ == "__main__":
    main()
