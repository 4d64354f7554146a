#!/usr/bin/env python3
"""OAttention against SDPA at the shapes of issue 55, per dtype: time, memory and error vs fp64.

    python scripts/gpu_attention_shapes.py [--device cuda] [--rounds 10] [--out results/cuda]

Rows: (B, H, Hkv, N, d) ∈ {(8, 9, 9, 2048, 64), (1, 16, 16, 8192, 128), (1, 32, 8, 8192, 128)}
(``--device cpu``: tiny shapes, a smoke run of this script's logic), dtypes bf16 / fp16 / fp32,
passes ``fwd`` (no grad) and ``fwd+bwd`` (q, k, v, p_q, p_k require grad; SDPA: q, k, v).
OAttention is ``oretrofit.o_attention`` with presences in (0.1, 1], no mask, on the route it picks
(for bf16/fp16 on CUDA the first of Triton, cuDNN, FlexAttention, memory-efficient that passes its
check, else fp32 compute; each row records its ``route``, and a route whose check failed is named
with the reason in ``route_failures``); SDPA is ``F.scaled_dot_product_attention`` in the same
dtype (``enable_gqa`` for GQA).

* time: median of ``--rounds`` interleaved calls after warm-up (CUDA events), ratio OA / SDPA;
* memory: peak allocated during one call beyond its inputs (``max_memory_allocated``), ratio;
* error: output and every gradient against an fp64 evaluation of the same (rounded) inputs,
  relative to the reference's largest magnitude, at the row's B, H, Hkv and d and
  ``N = min(N, --error-n)`` (the fp64 reference materialises N² scores); beside it SDPA's own
  error the same way, and their ratio for the output and dq, dk, dv (the issue's bound: ≤ 2×).

Writes ``OUT/attention_shapes.json`` (rows + provenance) and ``OUT/attention_shapes.md``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
import warnings
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

from oretrofit import o_attention
from oretrofit._kernels import routes
from oretrofit._operators.attention import o_attention_reference
from oretrofit._files.markdown import pipe_table
from oretrofit._files.provenance import environment, write_json_atomic

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
SHAPES = {"cuda": [(8, 9, 9, 2048, 64), (1, 16, 16, 8192, 128), (1, 32, 8, 8192, 128)],
          "cpu": [(2, 4, 4, 64, 16), (1, 4, 2, 96, 32)]}
PASSES = ("fwd", "fwd+bwd")
GRADS = ("q", "k", "v", "p_q", "p_k")


def inputs(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, grad: bool,
           seed: int = 0) -> dict[str, torch.Tensor]:
    """q, k, v in ``dtype``, fp32 presences in (0.1, 1], and an output gradient."""
    b, h, hkv, n, d = shape
    g = torch.Generator(device=device).manual_seed(seed)
    t = {"q": torch.randn(b, h, n, d, device=device, generator=g, dtype=dtype),
         "k": torch.randn(b, hkv, n, d, device=device, generator=g, dtype=dtype),
         "v": torch.randn(b, hkv, n, d, device=device, generator=g, dtype=dtype),
         "p_q": 0.1 + 0.9 * torch.rand(b, n, device=device, generator=g),
         "p_k": 0.1 + 0.9 * torch.rand(b, n, device=device, generator=g),
         "grad": torch.randn(b, h, n, d, device=device, generator=g, dtype=dtype)}
    for name in GRADS:
        t[name].requires_grad_(grad)
    return t


def call(impl: str, t: dict[str, torch.Tensor]) -> torch.Tensor:
    if impl == "sdpa":
        return F.scaled_dot_product_attention(t["q"], t["k"], t["v"],
                                              enable_gqa=t["k"].shape[1] != t["q"].shape[1])
    return o_attention(t["q"], t["k"], t["v"], t["p_q"], t["p_k"])[0]


def step(impl: str, t: dict[str, torch.Tensor], mode: str) -> None:
    with torch.no_grad() if mode == "fwd" else torch.enable_grad():
        out = call(impl, t)
        if mode != "fwd":
            out.backward(t["grad"])
            for name in GRADS:
                t[name].grad = None


def timed(fn: Callable[[], None], device: torch.device) -> float:
    """Milliseconds of one call (CUDA events on a GPU)."""
    if device.type == "cuda":
        start, end = (torch.cuda.Event(enable_timing=True) for _ in range(2))
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end)
    began = time.perf_counter()
    fn()
    return 1e3 * (time.perf_counter() - began)


def peak_bytes(fn: Callable[[], None], device: torch.device) -> int | None:
    if device.type != "cuda":
        return None
    torch.cuda.synchronize()
    base = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    fn()
    torch.cuda.synchronize()
    return torch.cuda.max_memory_allocated() - base


def errors(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device, error_n: int
           ) -> dict[str, float]:
    """Relative errors vs fp64 of OAttention's output and gradients and of SDPA's (``sdpa_*``)."""
    shape = shape[:3] + (min(shape[3], error_n),) + shape[4:]
    t = inputs(shape, dtype, device, grad=True, seed=1)
    ref = {name: x.detach().double().requires_grad_(name != "grad") for name, x in t.items()}
    result: dict[str, float] = {}
    for impl in ("oa", "sdpa"):
        out = call(impl, t)
        out.backward(t["grad"])
        if impl == "oa":
            want = o_attention_reference(ref["q"], ref["k"], ref["v"], ref["p_q"], ref["p_k"])[0]
        else:
            group = shape[1] // shape[2]
            k, v = (ref[n].repeat_interleave(group, 1) for n in ("k", "v"))
            want = torch.softmax(ref["q"] @ k.transpose(-1, -2) * shape[4] ** -0.5, -1) @ v
        want.backward(ref["grad"])
        names = GRADS if impl == "oa" else GRADS[:3]
        prefix = "" if impl == "oa" else "sdpa_"
        result[prefix + "out"] = _relative(out, want)
        for name in names:
            result[f"{prefix}d{name}"] = _relative(t[name].grad, ref[name].grad)
            t[name].grad = ref[name].grad = None
    return result


def _relative(got: torch.Tensor, want: torch.Tensor) -> float:
    return float((got.detach().double() - want.detach()).abs().max()
                 / want.detach().abs().max().clamp_min(1e-300))


def row(shape: tuple[int, ...], dtype_name: str, mode: str, rounds: int, device: torch.device
        ) -> dict[str, object]:
    dtype = DTYPES[dtype_name]
    t = inputs(shape, dtype, device, grad=mode != "fwd")
    for impl in ("sdpa", "oa"):
        step(impl, t, mode), step(impl, t, mode)                        # warm-up (and compile)
    times: dict[str, list[float]] = {"sdpa": [], "oa": []}
    for r in range(rounds):
        for impl in ("sdpa", "oa") if r % 2 == 0 else ("oa", "sdpa"):
            times[impl].append(timed(lambda: step(impl, t, mode), device))
    peaks = {impl: peak_bytes(lambda: step(impl, t, mode), device) for impl in ("sdpa", "oa")}
    ms = {impl: statistics.median(x) for impl, x in times.items()}
    b, h, hkv, n, d = shape
    return {"B": b, "H": h, "Hkv": hkv, "N": n, "d": d, "dtype": dtype_name, "mode": mode,
            "route": routes.describe(device, dtype, d),
            "sdpa_ms": ms["sdpa"], "oa_ms": ms["oa"], "time_ratio": ms["oa"] / ms["sdpa"],
            "sdpa_peak_bytes": peaks["sdpa"], "oa_peak_bytes": peaks["oa"],
            "memory_ratio": None if not peaks["sdpa"] else peaks["oa"] / peaks["sdpa"]}


def warm(device: torch.device) -> None:
    """One call of OAttention per shape, dtype and pass: every kernel compiled (and kept in
    Triton's on-disk cache) before a timed run."""
    for shape in SHAPES[device.type]:
        for dtype_name, dtype in DTYPES.items():
            for mode in PASSES:
                step("oa", inputs(shape, dtype, device, grad=mode != "fwd"), mode)
                print(f"warm: {shape} {dtype_name} {mode}", flush=True)


def route_failures(device: torch.device, shapes: list[tuple[int, ...]]) -> list[str]:
    """Decide each dtype's route for each head size before timing (so no check runs inside a
    timed call) and return the warnings of the routes whose check failed."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", RuntimeWarning)
        for dtype in DTYPES.values():
            for d in sorted({shape[4] for shape in shapes}):
                routes.describe(device, dtype, d)
    return [str(w.message) for w in caught]


def markdown(device_name: str, failures: list[str], rows: list[dict[str, object]],
             rounds: int, error_n: int) -> str:
    header = ["B", "H", "Hkv", "N", "d", "dtype", "pass", "route", "SDPA ms", "OA ms",
              "OA / SDPA",
              "memory OA / SDPA", "error OA", "error SDPA", "OA / SDPA error (worst of out, dq, dk, dv)"]
    body = []
    for r in rows:
        e = r.get("errors", {})
        worst = max((e[k] / max(e["sdpa_" + k], 1e-300) for k in ("out", "dq", "dk", "dv")
                     if k in e), default=None)
        body.append([r["B"], r["H"], r["Hkv"], r["N"], r["d"], r["dtype"], r["mode"], r["route"],
                     f"{r['sdpa_ms']:.3f}", f"{r['oa_ms']:.3f}", f"{r['time_ratio']:.2f}×",
                     "–" if r["memory_ratio"] is None else f"{r['memory_ratio']:.2f}×",
                     f"{e['out']:.1e}" if e else "–", f"{e['sdpa_out']:.1e}" if e else "–",
                     "–" if worst is None else f"{worst:.2f}×"])
    failed = "".join(f"\n\nRoute check failed: {f}" for f in failures)
    return (f"OAttention vs SDPA on {device_name}; route: the one each row took. Median of "
            f"{rounds} interleaved rounds; memory: peak beyond the inputs; errors vs fp64 "
            f"relative to the reference's largest value, at N ≤ {error_n}.{failed}\n\n"
            + pipe_table(header, body) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda", help="cuda; cpu runs tiny shapes (smoke)")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--error-n", type=int, default=2048,
                        help="N of the error check (its fp64 reference is materialised)")
    parser.add_argument("--out", type=Path, default=Path("results/cuda"))
    parser.add_argument("--warm", action="store_true",
                        help="only run each shape, dtype and pass once (compiling the kernels "
                             "into Triton's cache for a timed run after it), no receipt")
    args = parser.parse_args()
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch has no CUDA device here; use --device cpu for a smoke run")
    failures = route_failures(device, SHAPES[device.type])
    if args.warm:
        warm(device)
        return
    rows = []
    for shape in SHAPES[device.type]:
        for dtype_name in DTYPES:
            for mode in PASSES:
                rows.append(row(shape, dtype_name, mode, args.rounds, device))
                if mode == "fwd+bwd":
                    rows[-1]["errors"] = errors(shape, DTYPES[dtype_name], device, args.error_n)
                print(json.dumps(rows[-1]), flush=True)
    name = torch.cuda.get_device_name() if device.type == "cuda" else "cpu"
    text = markdown(name, failures, rows, args.rounds, args.error_n)
    args.out.mkdir(parents=True, exist_ok=True)
    write_json_atomic(args.out / "attention_shapes.json",
                      {"schema_version": 2, "route_failures": failures, "rounds": args.rounds,
                       "error_n": args.error_n, "rows": rows,
                       "environment": environment(device.type)})
    (args.out / "attention_shapes.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
