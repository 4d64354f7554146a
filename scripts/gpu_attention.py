#!/usr/bin/env python3
"""Fused OAttention on CUDA: which route it takes, that it is exact, and its cost against plain
``scaled_dot_product_attention`` (called by ``scripts/gpu_check.sh``; needs a CUDA device, or
``--device cpu`` for a smoke run of this script's own logic).

1. Route: the kernel :func:`oretrofit._kernels.routes.route_for` picks for fp32 compute
   (``cuda-efficient``: SDPA's memory-efficient kernel with its LSE; or the augmented-copy
   fallback, with the reason its check gave).
2. Exactness: forward and the gradients of q, k, v, p_q and p_k (p_k also detached) on small
   cases (MHA, GQA, per-head presences; no mask, bool, additive bias; null sources, null
   receivers, a batch with no live source), with tiles small enough that the backward runs
   several query and key tiles, against the fp64 reference on the CPU: the largest error
   relative to max(1, |reference|), per case (bound 2e-6 for fp32, as the CPU tests).
3. Cost: B = 1, H = 4, d = 64, N ∈ {1024, 4096, 8192}, inputs fp32 / bf16 / fp16, presences in
   (0.1, 1], no mask; passes ``fwd`` (no grad), ``fwd+bwd`` (every input requires grad) and
   ``fwd+bwd (p_k fixed)``. Per row: median time of each (CUDA events, ``--rounds`` interleaved
   after warm-up) and the ratio fused / SDPA; peak memory of one call including its inputs
   (``torch.cuda.max_memory_allocated``) and its ratio; the CUDA kernels of one forward of each
   (``torch.profiler``: flash / efficient / cudnn / math). Half-precision inputs are computed in
   fp32 by the fused path (see :func:`oretrofit._operators.attention.o_attention`), SDPA runs in the
   inputs' dtype, so those ratios compare fp32 work with half-precision work.

Writes ``OUT/attention.json`` (route, checks, rows + provenance) and ``OUT/attention.md``.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
import warnings
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from oretrofit._kernels import lse as kernels, routes
from oretrofit._operators.attention import o_attention_fused, o_attention_reference
from oretrofit._files.markdown import pipe_table
from oretrofit._files.provenance import environment, write_json_atomic

DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
PASSES = ("fwd", "fwd+bwd", "fwd+bwd (p_k fixed)")
KERNEL_FAMILIES = (("flash", "flash"), ("efficient", "efficient"), ("efficient", "fmha"),
                   ("cudnn", "cudnn"))
EXACT_BOUND = 2e-6
CHECK_LAYOUTS = {"mha": (4, 4, None), "gqa": (4, 2, None), "per_head": (4, 4, 4),
                 "gqa_per_query_head": (4, 2, 4)}


def route(device: torch.device) -> dict[str, str]:
    """The backend fp32 OAttention takes on ``device``, or the fallback and why."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        name = routes.describe(device, torch.float32, 16)
    reasons, kernel = [str(w.message) for w in caught], name != "augmented-copy"
    return {"kernel": name if kernel else "augmented-copy fallback",
            "reason": "; ".join(reasons) or ("checked" if kernel else "no kernel for this device")}


def check_case(device: torch.device, layout: str, mask_kind: str, pk_grad: bool) -> float:
    """Largest error of the output and every gradient against the fp64 CPU reference, relative
    to max(1, |reference|)."""
    h, hkv, ph = CHECK_LAYOUTS[layout]
    g = torch.Generator().manual_seed(0)
    b, n_q, n_k, d = 2, 37, 45, 16
    q, k, v = (torch.randn(b, heads, n, d, generator=g, dtype=torch.float64)
               for heads, n in ((h, n_q), (hkv, n_k), (hkv, n_k)))
    p_q = torch.rand((b, n_q) if ph is None else (b, h, n_q), generator=g, dtype=torch.float64)
    p_k = torch.rand((b, n_k) if ph is None else (b, ph, n_k), generator=g, dtype=torch.float64)
    p_q, p_k = 0.1 + 0.9 * p_q, 0.1 + 0.9 * p_k
    p_q[..., 3] = 0.0                                               # a null receiver
    p_k[..., 5] = 0.0                                               # a null source
    p_k[1] = 0.0                                                    # no live source in batch 1
    mask = None
    if mask_kind != "none":
        visible = torch.rand(b, 1, n_q, n_k, generator=g) > 0.3
        visible[..., 0] = True
        mask = visible if mask_kind == "bool" else torch.where(
            visible, torch.randn(b, 1, n_q, n_k, generator=g, dtype=torch.float64), -math.inf)
    d_out = torch.randn(b, h, n_q, d, generator=g, dtype=torch.float64)
    inputs = [q, k, v, p_q, p_k]
    wants = [True, True, True, True, pk_grad]

    def run(fn, tensors, mask_t):
        leaves = [t.detach().clone().requires_grad_(w) for t, w in zip(tensors, wants)]
        out = fn(*leaves, mask=mask_t, eps=1e-3)
        out.backward(d_out.to(out.device, out.dtype))
        return [out.detach().cpu().double()] + [t.grad.cpu().double() for t, w in
                                                zip(leaves, wants) if w]

    want = run(lambda *a, **kw: o_attention_reference(*a, **kw)[0], inputs, mask)
    mask_dev = None if mask is None else mask.to(device, torch.float32 if mask.is_floating_point()
                                                  else torch.bool)
    got = run(o_attention_fused, [t.to(device, torch.float32) for t in inputs], mask_dev)
    return max(((a - w).abs().max() / max(1.0, w.abs().max().item())).item()
               for a, w in zip(got, want))


def exactness(device: torch.device) -> list[dict[str, object]]:
    saved = kernels.BACKWARD_TILE
    kernels.BACKWARD_TILE = (16, 8)                # several query and key tiles per backward
    try:
        return [{"layout": layout, "mask": mask_kind, "p_k_grad": pk_grad,
                 "error": check_case(device, layout, mask_kind, pk_grad)}
                for layout in CHECK_LAYOUTS for mask_kind in ("none", "bool", "additive_bias")
                for pk_grad in (True, False)]
    finally:
        kernels.BACKWARD_TILE = saved


def kernel_families(call: Callable[[], object]) -> list[str]:
    """Attention kernel families of the CUDA kernels one ``call`` launches ('math' if none)."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        call()
        torch.cuda.synchronize()
    names = [e.name.lower() for e in prof.events() if e.device_type.name == "CUDA"]
    found = sorted({family for family, key in KERNEL_FAMILIES if any(key in n for n in names)})
    return found or ["math"]


def make_inputs(n: int, dtype: torch.dtype, mode: str, device: torch.device
                ) -> dict[str, torch.Tensor]:
    g = torch.Generator(device=device).manual_seed(0)
    t = {name: torch.randn(1, 4, n, 64, device=device, generator=g, dtype=dtype)
         for name in ("q", "k", "v")}
    for name in ("p_q", "p_k"):
        t[name] = 0.1 + 0.9 * torch.rand(1, n, device=device, generator=g, dtype=dtype)
    if mode != "fwd":
        for name, x in t.items():
            x.requires_grad_(not (name == "p_k" and mode == "fwd+bwd (p_k fixed)"))
        t["grad"] = torch.randn(1, 4, n, 64, device=device, generator=g, dtype=dtype)
    return t


def step(impl: str, t: dict[str, torch.Tensor], mode: str) -> None:
    with torch.no_grad() if mode == "fwd" else torch.enable_grad():
        if impl == "sdpa":
            out = F.scaled_dot_product_attention(t["q"], t["k"], t["v"])
        else:
            out = o_attention_fused(t["q"], t["k"], t["v"], t["p_q"], t["p_k"])
        if mode != "fwd":
            out.backward(t["grad"])
            for x in t.values():
                x.grad = None


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def milliseconds(t: dict[str, torch.Tensor], mode: str, rounds: int, device: torch.device
                 ) -> dict[str, float]:
    """Median time of each implementation, interleaved, after two warm-up calls."""
    for impl in ("sdpa", "fused"):
        step(impl, t, mode), step(impl, t, mode)
    times: dict[str, list[float]] = {"sdpa": [], "fused": []}
    for r in range(rounds):
        for impl in ("sdpa", "fused") if r % 2 == 0 else ("fused", "sdpa"):
            _sync(device)
            if device.type == "cuda":
                start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
                start.record()
                step(impl, t, mode)
                end.record()
                torch.cuda.synchronize()
                times[impl].append(start.elapsed_time(end))
            else:
                began = time.perf_counter()
                step(impl, t, mode)
                times[impl].append(1e3 * (time.perf_counter() - began))
    return {impl: statistics.median(x) for impl, x in times.items()}


def peak_bytes(impl: str, n: int, dtype: torch.dtype, mode: str, device: torch.device
               ) -> int | None:
    """Peak memory of one call including its inputs (CUDA only)."""
    if device.type != "cuda":
        return None
    step(impl, make_inputs(16, dtype, mode, device), mode)          # warm-up, off the books
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    t = make_inputs(n, dtype, mode, device)
    step(impl, t, mode)
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def row(n: int, dtype: str, mode: str, rounds: int, device: torch.device) -> dict[str, object]:
    t = make_inputs(n, DTYPES[dtype], mode, device)
    ms = milliseconds(t, mode, rounds, device)
    peaks = {impl: peak_bytes(impl, n, DTYPES[dtype], mode, device) for impl in ("sdpa", "fused")}
    result: dict[str, object] = {
        "n": n, "dtype": dtype, "mode": mode, "sdpa_ms": ms["sdpa"], "fused_ms": ms["fused"],
        "ratio": ms["fused"] / ms["sdpa"], "sdpa_peak_bytes": peaks["sdpa"],
        "fused_peak_bytes": peaks["fused"],
        "memory_ratio": None if peaks["sdpa"] is None else peaks["fused"] / peaks["sdpa"]}
    if device.type == "cuda" and mode == "fwd":
        t = make_inputs(n, DTYPES[dtype], mode, device)
        result["sdpa_kernels"] = kernel_families(lambda: step("sdpa", t, mode))
        result["fused_kernels"] = kernel_families(lambda: step("fused", t, mode))
    return result


def markdown(device_name: str, found: dict[str, str], checks: list[dict[str, object]],
             rows: list[dict[str, object]], rounds: int) -> str:
    worst = max(c["error"] for c in checks)
    header = ["dtype", "N", "pass", "SDPA ms", "fused ms", "fused / SDPA", "fused mem / SDPA",
              "SDPA kernel", "fused kernel"]
    table = pipe_table(header, [
        [r["dtype"], r["n"], r["mode"], f"{r['sdpa_ms']:.3f}", f"{r['fused_ms']:.3f}",
         f"{r['ratio']:.2f}×", "–" if r["memory_ratio"] is None else f"{r['memory_ratio']:.2f}×",
         ", ".join(r.get("sdpa_kernels", ["–"])), ", ".join(r.get("fused_kernels", ["–"]))]
        for r in rows])
    return (f"OAttention (fused) vs SDPA on {device_name}: route {found['kernel']} "
            f"({found['reason']}).\n\n"
            f"Exactness: {len(checks)} cases (layouts × masks × p_k grad, nulls, tiled backward) "
            f"against the fp64 CPU reference; largest error relative to max(1, |reference|) "
            f"{worst:.1e} (bound {EXACT_BOUND:.0e}: "
            f"{'met' if worst <= EXACT_BOUND else 'MISSED'}).\n\n"
            f"B=1, H=4, d=64, median of {rounds} interleaved rounds; memory: peak of one call "
            f"including its inputs.\n\n{table}\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("results/cuda"))
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--sizes", default="1024,4096,8192", help="comma-separated N")
    parser.add_argument("--device", default="cuda",
                        help="cuda (the check); cpu runs this script's logic on small sizes")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit("error: no CUDA device; this check runs on a GPU machine")
    found = route(device)
    checks = exactness(device)
    rows = [row(n, dtype, mode, args.rounds, device) for dtype in DTYPES
            for n in (int(s) for s in args.sizes.split(",")) for mode in PASSES]
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    text = markdown(name, found, checks, rows, args.rounds)
    args.out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(args.out / "attention.json",
                      {"schema_version": 2, "route": found, "checks": checks, "rows": rows,
                       "environment": environment(device.type)})
    (args.out / "attention.md").write_text(text)
    print(text)
    print(json.dumps({"receipt": str(args.out / "attention.json")}))


if __name__ == "__main__":
    main()
