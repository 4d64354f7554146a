"""Forward-time cost of retrofitting real transformers hosts: patched / unpatched.

    OMP_NUM_THREADS=1 python benchmarks/bench_hosts.py [--repeats 7] [--rows all|long|short]
        [--out results]

all-MiniLM-L6-v2 (BERT) on a batch of 32 × 128 tokens and SmolLM2-135M (Llama) on 1 × 512
tokens, fp32, arms ``oa`` and ``full-o`` at τ = 1e-8. Unpatched and patched forwards run
interleaved (patching is a class swap, so each round measures both under the same load) and the
table reports the median ratio with the median seconds. Targets: ≤ 1.15× (oa), ≤ 1.25× (full-o).
Patch time (``retrofit``: derive the sites from a cold start, validate, apply) is the median
over the rounds; target < 50 ms.

Short calls (``--rows short``; both by default), where the hooks' fixed cost per call shows:
SmolLM2-135M prefill of 16, 32 and 64 tokens and one decoded token after a 32-token prompt (a
KV cache the same arm filled, cropped back after each step), unpatched and patched interleaved
per round, median ratio. Targets: ≤ 1.10× (oa), ≤ 1.15× (full-o).
Writes ``results/bench_hosts.json`` (provenance) and ``results/bench_hosts.md``; prints the table.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

import contextlib

import torch
from transformers import DynamicCache

from oretrofit import retrofit, retrofitted
from oretrofit._markdown import pipe_table
from oretrofit._provenance import environment, write_json_atomic
from oretrofit.hosts.transformers.report import forward_time_ratio, load_minilm, load_smollm2
from oretrofit.hosts.transformers.host import forget_structures

TARGETS = {"oa": 1.15, "full-o": 1.25}
SHORT_TARGETS = {"oa": 1.10, "full-o": 1.15}
PATCH_TARGET_S = 0.05
CASES = {"all-MiniLM-L6-v2": (load_minilm, 32, 128), "SmolLM2-135M": (load_smollm2, 1, 512)}
PREFILLS = (16, 32, 64)
DECODE_AFTER = 32
TAU = 1e-8


def _ids(tokens: int) -> torch.Tensor:
    return torch.randint(100, 1000, (1, tokens), generator=torch.Generator().manual_seed(0))


@torch.no_grad()
def _short_call_seconds(model: torch.nn.Module, arm: str | None, prefill: int | None,
                        steps: int = 5) -> float:
    """Mean seconds of one short call over ``steps``: a prefill of ``prefill`` tokens, or (None)
    one decoded token after a :data:`DECODE_AFTER`-token prompt whose cache ``arm`` filled."""
    with retrofitted(model, arm, TAU) if arm else contextlib.nullcontext():
        if prefill is not None:
            ids = _ids(prefill)
            model(ids)                                                         # warm-up
            start = time.perf_counter()
            for _ in range(steps):
                model(ids)
            return (time.perf_counter() - start) / steps
        cache, ids = DynamicCache(config=model.config), _ids(DECODE_AFTER + 1)
        model(ids[:, :-1], past_key_values=cache, use_cache=True)
        seconds = []
        for _ in range(steps + 1):                                             # 1 warm-up
            start = time.perf_counter()
            model(ids[:, -1:], past_key_values=cache, use_cache=True)
            seconds.append(time.perf_counter() - start)
            cache.crop(-1)
        return statistics.mean(seconds[1:])


def measure_short(repeats: int) -> list[dict[str, object]]:
    """The short-call rows (module docstring): per call and arm, unpatched and patched seconds
    measured interleaved, median ratio."""
    model, _ = load_smollm2()
    rows = []
    for prefill in (*PREFILLS, None):
        call = f"prefill {prefill}" if prefill else f"decode 1 after {DECODE_AFTER}"
        for arm, target in SHORT_TARGETS.items():
            base, patched = [], []
            for _ in range(repeats):
                base.append(_short_call_seconds(model, None, prefill))
                patched.append(_short_call_seconds(model, arm, prefill))
            b, p = statistics.median(base), statistics.median(patched)
            rows.append({"model": "SmolLM2-135M", "call": call, "arm": arm, "target": target,
                         "unpatched_s": b, "patched_s": p, "ratio": p / b})
            print(f"SmolLM2 {call} {arm}: {p / b:.3f}×", file=sys.stderr)
    return rows


def measure(repeats: int) -> list[dict[str, object]]:
    rows = []
    for name, (load, batch, tokens) in CASES.items():
        model, _ = load()
        ids = torch.randint(100, 1000, (batch, tokens), generator=torch.Generator().manual_seed(0))
        inputs = {"input_ids": ids}
        for arm, target in TARGETS.items():
            timing = forward_time_ratio(model, inputs, arm, repeats)
            rows.append({"model": name, "shape": f"{batch}×{tokens}", "arm": arm,
                         "target": target, **timing, "patch_s": patch_time(model, arm, repeats)})
            print(f"{name} {arm}: {timing['ratio']:.3f}×", file=sys.stderr)
        del model
    return rows


def patch_time(model: torch.nn.Module, arm: str, repeats: int) -> float:
    """Median seconds of a cold ``retrofit(model, arm)`` (each followed by an untimed revert)."""
    seconds = []
    for _ in range(repeats):
        forget_structures()
        start = time.perf_counter()
        r = retrofit(model, arm, TAU)
        seconds.append(time.perf_counter() - start)
        r.revert()
    return statistics.median(seconds)


def _footer(env: dict[str, object], repeats: int) -> str:
    return (f"Median of {repeats} interleaved rounds, fp32, {env['torch_threads']} thread(s), "
            f"{env['device_name']}, torch {env['packages'].get('torch')}, transformers "
            f"{env['packages'].get('transformers')}, git {env['git_revision']}. Generated by "
            "`OMP_NUM_THREADS=1 python benchmarks/bench_hosts.py`.")


def _verdict(row: dict[str, object]) -> str:
    return f"≤ {row['target']}× {'✓' if row['ratio'] <= row['target'] else '✗'}"


def markdown(rows: list[dict[str, object]], env: dict[str, object], repeats: int) -> str:
    table = [[r["model"], r["shape"], f"`{r['arm']}`", f"{r['unpatched_s']:.3f}",
              f"{r['patched_s']:.3f}", f"{r['ratio']:.3f}×", _verdict(r),
              f"{1e3 * r['patch_s']:.1f} {'✓' if r['patch_s'] < PATCH_TARGET_S else '✗'}"]
             for r in rows]
    return "\n".join([pipe_table(["model", "batch × tokens", "arm", "unpatched (s)",
                                  "patched (s)", "ratio", "target",
                                  f"patch (ms, < {1e3 * PATCH_TARGET_S:.0f})"], table), "",
                      _footer(env, repeats)]) + "\n"


def markdown_short(rows: list[dict[str, object]], env: dict[str, object], repeats: int) -> str:
    table = [[r["model"], r["call"], f"`{r['arm']}`", f"{1e3 * r['unpatched_s']:.2f}",
              f"{1e3 * r['patched_s']:.2f}", f"{r['ratio']:.3f}×", _verdict(r)] for r in rows]
    return "\n".join([pipe_table(["model", "call (batch 1)", "arm", "unpatched (ms)",
                                  "patched (ms)", "ratio", "target"], table), "",
                      _footer(env, repeats)]) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--rows", choices=("all", "long", "short"), default="all")
    parser.add_argument("--out", type=Path, default=Path("results"))
    args = parser.parse_args()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.manual_seed(0)
    env = environment("cpu")
    for kind, name, run, render in (("long", "bench_hosts", measure, markdown),
                                    ("short", "bench_hosts_short", measure_short,
                                     markdown_short)):
        if args.rows not in ("all", kind):
            continue
        rows = run(args.repeats)
        write_json_atomic(args.out / f"{name}.json",
                          {"schema_version": 1, "repeats": args.repeats, "tau": TAU,
                           "rows": rows, "environment": env})
        table = render(rows, env, args.repeats)
        (args.out / f"{name}.md").write_text(table)
        print(table)


if __name__ == "__main__":
    main()
