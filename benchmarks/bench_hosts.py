"""Forward-time cost of retrofitting real transformers hosts: patched / unpatched.

    OMP_NUM_THREADS=1 python benchmarks/bench_hosts.py [--repeats 7]
        [--rows all|long|short|compile] [--backend inductor] [--tiny] [--out results]

all-MiniLM-L6-v2 (BERT) on a batch of 32 × 128 tokens and SmolLM2-135M (Llama) on 1 × 512
tokens, fp32, arms ``oa`` and ``full-o`` at τ = 1e-8. Unpatched and patched forwards run
interleaved (patching is a class swap, so each round measures both under the same load) and the
table reports the median ratio with the median seconds. Targets: ≤ 1.15× (oa), ≤ 1.25× (full-o).
Patch time (``retrofit``: derive the sites from a cold start, validate, apply) is the median
over the rounds; target < 50 ms.

Short calls (``--rows short``), where the hooks' fixed cost per call shows:
SmolLM2-135M prefill of 16, 32 and 64 tokens and one decoded token after a 32-token prompt (a
KV cache the same arm filled, cropped back after each step), unpatched and patched interleaved
per round, median ratio. Targets: ≤ 1.10× (oa), ≤ 1.15× (full-o). Beside the times, which load
moves, the aten ops one call dispatches, unpatched and patched (counted by a
``TorchDispatchMode`` after a warm-up call): what the hooks add per call, whatever the load.

Compiled generation (``--rows compile``): SmolLM2-135M's forward under ``torch.compile``
(``--backend``, inductor by default) greedily generates 8 tokens after a 32-token prompt, per
arm (a copy of the model per arm, retrofitted once, as a served model is), the arms'
generations interleaved per round after two untimed ones (which compile); the
rows are the prefill and the mean seconds per decoded token, median ratio to the compiled
unpatched model (target ≤ 1.15×), and what Dynamo compiled for each arm: graphs, frames
compiled, graph breaks and whether the recompile limit was hit (the run then stops that arm),
and whether the arm greedily generated the unpatched model's tokens (τ→0).

``--rows all`` (the default) runs the three; ``--tiny`` measures tiny random models of the same
architectures on a few tokens instead (the test suite's smoke run). Writes
``results/bench_hosts.json`` (provenance) and ``results/bench_hosts.md``,
``results/bench_hosts_short.*`` and ``results/bench_hosts_compile.*``; prints the tables.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import os
import statistics
import sys
import time
import types
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator

import torch
from torch._dynamo.utils import counters
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import BertConfig, BertModel, DynamicCache, LlamaConfig, LlamaForCausalLM

from oretrofit import retrofit, retrofitted
from oretrofit._files.markdown import pipe_table
from oretrofit._files.provenance import environment, write_json_atomic
from oretrofit.hosts.transformers.host import forget_structures
from oretrofit.hosts.transformers.measures import forward_time_ratio, load_minilm, load_smollm2
from oretrofit.hosts.transformers.shrink import GROUPS, shrunk_config, tiny_model

TARGETS = {"oa": 1.15, "full-o": 1.25}
SHORT_TARGETS = {"oa": 1.10, "full-o": 1.15}
COMPILE_TARGET = 1.15
PATCH_TARGET_S = 0.05
TAU = 1e-8
SEED = 0


def _tiny(model_class: type, config: Any) -> Callable[[], tuple[torch.nn.Module, None]]:
    return lambda: (tiny_model(model_class, shrunk_config(config, GROUPS["tiny"]), SEED), None)


@dataclass(frozen=True)
class Sizes:
    """What one run measures: the long rows' models ``name -> (loader, batch, tokens)``, the
    causal model of the short and compile rows, its prefills, the prompt decoded after and the
    tokens each compiled generation decodes."""
    long: dict[str, tuple[Callable[[], tuple[torch.nn.Module, Any]], int, int]]
    causal: tuple[str, Callable[[], tuple[torch.nn.Module, Any]]]
    prefills: tuple[int, ...]
    decode_after: int
    new_tokens: int


SIZES = {
    "full": Sizes({"all-MiniLM-L6-v2": (load_minilm, 32, 128),
                   "SmolLM2-135M": (load_smollm2, 1, 512)},
                  ("SmolLM2-135M", load_smollm2), (16, 32, 64), 32, 8),
    "tiny": Sizes({"tiny BERT": (_tiny(BertModel, BertConfig()), 2, 16),
                   "tiny Llama": (_tiny(LlamaForCausalLM, LlamaConfig()), 1, 16)},
                  ("tiny Llama", _tiny(LlamaForCausalLM, LlamaConfig())), (4, 8), 8, 3),
}


def _ids(tokens: int) -> torch.Tensor:
    return torch.randint(100, 1000, (1, tokens), generator=torch.Generator().manual_seed(SEED))


@contextlib.contextmanager
def _short_call(model: torch.nn.Module, arm: str | None, prefill: int | None,
                decode_after: int) -> Iterator[tuple[Callable[[], Any], Callable[[], Any]]]:
    """``(call, reset)`` for one short call of ``model``, ``arm`` retrofitted for the block: a
    prefill of ``prefill`` tokens, or (None) one decoded token after a ``decode_after``-token
    prompt whose cache ``arm`` filled; ``reset`` crops that token off the cache again."""
    with torch.no_grad(), retrofitted(model, arm, TAU) if arm else contextlib.nullcontext():
        if prefill is not None:
            ids = _ids(prefill)
            yield (lambda: model(ids)), (lambda: None)
            return
        cache, ids = DynamicCache(config=model.config), _ids(decode_after + 1)
        model(ids[:, :-1], past_key_values=cache, use_cache=True)
        yield (lambda: model(ids[:, -1:], past_key_values=cache, use_cache=True),
               lambda: cache.crop(-1))


def _short_call_seconds(model: torch.nn.Module, arm: str | None, prefill: int | None,
                        decode_after: int, steps: int = 5) -> float:
    """Mean seconds of one short call (:func:`_short_call`) over ``steps``, after a warm-up."""
    with _short_call(model, arm, prefill, decode_after) as (call, reset):
        seconds = []
        for _ in range(steps + 1):                                             # 1 warm-up
            start = time.perf_counter()
            call()
            seconds.append(time.perf_counter() - start)
            reset()
        return statistics.mean(seconds[1:])


class _OpCount(TorchDispatchMode):
    """The aten ops dispatched inside the block: a count that load does not change."""

    def __init__(self) -> None:
        super().__init__()
        self.ops = 0

    def __torch_dispatch__(self, func: Callable, types: tuple, args: tuple = (),
                           kwargs: dict | None = None) -> Any:
        self.ops += 1
        return func(*args, **(kwargs or {}))


def _short_call_ops(model: torch.nn.Module, arm: str | None, prefill: int | None,
                    decode_after: int) -> int:
    """The aten ops one short call (:func:`_short_call`) dispatches, after a warm-up (the first
    call of a retrofit traces the FFN stream)."""
    with _short_call(model, arm, prefill, decode_after) as (call, reset):
        call()
        reset()
        with _OpCount() as count:
            call()
        return count.ops


def measure_short(sizes: Sizes, repeats: int, backend: str) -> list[dict[str, object]]:
    """The short-call rows (module docstring): per call and arm, unpatched and patched seconds
    measured interleaved, median ratio."""
    name, load = sizes.causal
    model, _ = load()
    rows = []
    for prefill in (*sizes.prefills, None):
        call = f"prefill {prefill}" if prefill else f"decode 1 after {sizes.decode_after}"
        for arm, target in SHORT_TARGETS.items():
            base, patched = [], []
            for _ in range(repeats):
                base.append(_short_call_seconds(model, None, prefill, sizes.decode_after))
                patched.append(_short_call_seconds(model, arm, prefill, sizes.decode_after))
            b, p = statistics.median(base), statistics.median(patched)
            rows.append({"model": name, "call": call, "arm": arm, "target": target,
                         "unpatched_s": b, "patched_s": p, "ratio": p / b,
                         "unpatched_ops": _short_call_ops(model, None, prefill,
                                                          sizes.decode_after),
                         "patched_ops": _short_call_ops(model, arm, prefill,
                                                        sizes.decode_after)})
            print(f"{name} {call} {arm}: {p / b:.3f}×", file=sys.stderr)
    return rows


def _own_compiled_forward(model: torch.nn.Module, arm: str, backend: str) -> Callable:
    """``model.forward`` compiled on a copy of its code object named after ``arm``: Dynamo keeps
    graphs, recompile counts and automatic-dynamic shapes per code object (and name), so each
    arm compiles and is counted as in a process of its own while the arms' rounds interleave."""
    forward = type(model).forward
    code = forward.__code__.replace(co_name=f"{forward.__name__}_{arm.replace('-', '_')}")
    own = types.FunctionType(code, forward.__globals__, code.co_name, forward.__defaults__,
                             forward.__closure__)
    own.__kwdefaults__ = forward.__kwdefaults__
    return torch.compile(types.MethodType(own, model), backend=backend)


DYNAMO_COUNTS = ("graphs", "frames_compiled", "graph_breaks")


def _dynamo_counts() -> Counter:
    return Counter({"graphs": counters["stats"]["unique_graphs"],
                    "frames_compiled": counters["frames"]["ok"],
                    "graph_breaks": sum(counters["graph_break"].values())})


def _counts(compiled: Counter) -> dict[str, int]:
    return {key: compiled[key] for key in DYNAMO_COUNTS}


@dataclass
class _CompiledArm:
    """One arm of the compile rows: its model (retrofitted once, as a served model is), its
    compiled forward, what Dynamo compiled for it, its timed generations (prefill seconds,
    seconds per decoded token)."""
    name: str
    model: torch.nn.Module
    forward: Callable
    compiled: Counter = field(default_factory=Counter)
    limit_hit: bool = False
    prefill_s: list[float] = field(default_factory=list)
    decode_s: list[float] = field(default_factory=list)
    tokens: list[int] = field(default_factory=list)          # the last generation's

    @torch.no_grad()
    def generate(self, sizes: Sizes) -> tuple[float, float] | None:
        """Greedy generation of ``sizes.new_tokens`` after ``sizes.decode_after`` tokens:
        (prefill seconds, mean seconds per decoded token); None once the recompile limit was
        hit (the limit made an error here, so a hit cannot pass silently as eager frames)."""
        if self.limit_hit:
            return None
        before = _dynamo_counts()
        try:
            with torch._dynamo.config.patch(fail_on_recompile_limit_hit=True):
                cache = DynamicCache(config=self.model.config)
                start = time.perf_counter()
                logits = self.forward(_ids(sizes.decode_after), past_key_values=cache,
                                      use_cache=True).logits
                prefill = time.perf_counter() - start
                start, tokens = time.perf_counter(), []
                for _ in range(sizes.new_tokens):
                    tokens.append(logits[:, -1:].argmax(-1))
                    logits = self.forward(tokens[-1], past_key_values=cache,
                                          use_cache=True).logits
                decode = (time.perf_counter() - start) / sizes.new_tokens
                self.tokens = torch.cat(tokens, 1)[0].tolist()
                return prefill, decode
        except torch._dynamo.exc.FailOnRecompileLimitHit:
            self.limit_hit = True
            return None
        finally:
            self.compiled.update(_dynamo_counts() - before)


def measure_compile(sizes: Sizes, repeats: int, backend: str) -> list[dict[str, object]]:
    """The compile rows (module docstring): each arm's compiled generations, interleaved per
    round after two untimed ones, median ratio to the compiled unpatched model."""
    name, load = sizes.causal
    model, _ = load()
    torch._dynamo.reset()
    counters.clear()
    arms = [_CompiledArm("unpatched", model, _own_compiled_forward(model, "unpatched", backend))]
    for arm in SHORT_TARGETS:
        patched = copy.deepcopy(model)
        retrofit(patched, arm, TAU)
        arms.append(_CompiledArm(arm, patched, _own_compiled_forward(patched, arm, backend)))
    # graphs counted as a first run makes them: no shapes remembered from earlier runs
    with torch._dynamo.config.patch(automatic_dynamic_local_pgo=False):
        for round_ in range(2 + repeats):
            for arm in arms:
                seconds = arm.generate(sizes)
                if seconds is not None and round_ >= 2:
                    arm.prefill_s.append(seconds[0])
                    arm.decode_s.append(seconds[1])
    base, rows = arms[0], []
    calls = {f"prefill {sizes.decode_after}": "prefill_s",
             f"decode per token ({sizes.new_tokens} after {sizes.decode_after})": "decode_s"}
    for arm in arms[1:]:
        for call, key in calls.items():
            b = statistics.median(getattr(base, key)) if getattr(base, key) else None
            p = statistics.median(getattr(arm, key)) if getattr(arm, key) else None
            ratio = p / b if p is not None and b is not None else None
            rows.append({"model": name, "call": call, "arm": arm.name, "backend": backend,
                         "target": COMPILE_TARGET, "unpatched_s": b, "patched_s": p,
                         "ratio": ratio, "unpatched_dynamo": _counts(base.compiled),
                         "unpatched_limit_hit": base.limit_hit,
                         "patched_dynamo": _counts(arm.compiled), "patched_limit_hit": arm.limit_hit,
                         "same_tokens": arm.tokens == base.tokens})
            print(f"{name} compiled {call} {arm.name}: {ratio}", file=sys.stderr)
    return rows


def measure(sizes: Sizes, repeats: int, backend: str) -> list[dict[str, object]]:
    """The long rows (module docstring): per model and arm, the median forward ratio and the
    median patch time."""
    rows = []
    for name, (load, batch, tokens) in sizes.long.items():
        model, _ = load()
        ids = torch.randint(100, 1000, (batch, tokens),
                            generator=torch.Generator().manual_seed(SEED))
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


def _footer(receipt: dict[str, Any]) -> str:
    env, load = receipt["environment"], receipt["load_average_1min"]
    return (f"Median of {receipt['repeats']} interleaved rounds, fp32, {env['torch_threads']} "
            f"thread(s), {env['device_name']}, torch {env['packages'].get('torch')}, "
            f"transformers {env['packages'].get('transformers')}, git {env['git_revision']}; "
            f"1-minute load average {load['start']:.1f} at the start and {load['end']:.1f} at "
            f"the end on {receipt['cpu_count']} cores. Generated by "
            f"`OMP_NUM_THREADS={env['torch_threads']} python benchmarks/{env['command']}`.")


def _verdict(row: dict[str, object]) -> str:
    if row["ratio"] is None:
        return f"≤ {row['target']}× ✗"
    return f"≤ {row['target']}× {'✓' if row['ratio'] <= row['target'] else '✗'}"


def markdown(receipt: dict[str, Any]) -> str:
    table = [[r["model"], r["shape"], f"`{r['arm']}`", f"{r['unpatched_s']:.3f}",
              f"{r['patched_s']:.3f}", f"{r['ratio']:.3f}×", _verdict(r),
              f"{1e3 * r['patch_s']:.1f} {'✓' if r['patch_s'] < PATCH_TARGET_S else '✗'}"]
             for r in receipt["rows"]]
    return "\n".join([pipe_table(["model", "batch × tokens", "arm", "unpatched (s)",
                                  "patched (s)", "ratio", "target",
                                  f"patch (ms, < {1e3 * PATCH_TARGET_S:.0f})"], table), "",
                      _footer(receipt)]) + "\n"


def markdown_short(receipt: dict[str, Any]) -> str:
    table = [[r["model"], r["call"], f"`{r['arm']}`", f"{1e3 * r['unpatched_s']:.2f}",
              f"{1e3 * r['patched_s']:.2f}", f"{r['ratio']:.3f}×", _verdict(r),
              f"{r['unpatched_ops']} → {r['patched_ops']}"]
             for r in receipt["rows"]]
    return "\n".join([pipe_table(["model", "call (batch 1)", "arm", "unpatched (ms)",
                                  "patched (ms)", "ratio", "target",
                                  "aten ops per call (unpatched → patched)"], table), "",
                      _footer(receipt)]) + "\n"


def _ms(seconds: float | None) -> str:
    return "—" if seconds is None else f"{1e3 * seconds:.2f}"


def _compiled(dynamo: dict[str, int]) -> str:
    return " / ".join(str(dynamo[key]) for key in DYNAMO_COUNTS)


def markdown_compile(receipt: dict[str, Any]) -> str:
    table = [[r["model"], r["call"], f"`{r['arm']}`", _ms(r["unpatched_s"]), _ms(r["patched_s"]),
              "—" if r["ratio"] is None else f"{r['ratio']:.3f}×", _verdict(r),
              _compiled(r["unpatched_dynamo"]), _compiled(r["patched_dynamo"]),
              "hit ✗" if r["unpatched_limit_hit"] or r["patched_limit_hit"] else "not hit ✓",
              "unpatched ✓" if r["same_tokens"] else "differ ✗"]
             for r in receipt["rows"]]
    backend = receipt["rows"][0]["backend"] if receipt["rows"] else "?"
    return "\n".join([pipe_table(["model", "call (batch 1, compiled)", "arm", "unpatched (ms)",
                                  "patched (ms)", "ratio", "target",
                                  "unpatched: graphs / frames / breaks",
                                  "patched: graphs / frames / breaks", "recompile limit",
                                  "tokens"], table),
                      "", f"`torch.compile(backend=\"{backend}\")` on each arm's own copy of the "
                      "forward; Dynamo's counts over all of an arm's generations, from a fresh "
                      "Dynamo with automatic-dynamic profiles off (counted as a first run).",
                      _footer(receipt)]) + "\n"


KINDS = {"long": ("bench_hosts", measure, markdown),
         "short": ("bench_hosts_short", measure_short, markdown_short),
         "compile": ("bench_hosts_compile", measure_compile, markdown_compile)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--rows", choices=("all", *KINDS), default="all")
    parser.add_argument("--backend", default="inductor",
                        help="torch.compile backend of the compile rows (default: inductor)")
    parser.add_argument("--tiny", action="store_true",
                        help="tiny random models of the same architectures on a few tokens")
    parser.add_argument("--out", type=Path, default=Path("results"))
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    torch.manual_seed(SEED)
    sizes = SIZES["tiny" if args.tiny else "full"]
    for kind, (name, run, render) in KINDS.items():
        if args.rows not in ("all", kind):
            continue
        start_load, env = os.getloadavg()[0], environment("cpu")    # the code as it starts
        rows = run(sizes, args.repeats, args.backend)
        receipt = {"schema_version": 2, "repeats": args.repeats, "tau": TAU, "seed": SEED,
                   "sizes": "tiny" if args.tiny else "full", "rows": rows,
                   "cpu_count": os.cpu_count(),
                   "load_average_1min": {"start": start_load, "end": os.getloadavg()[0]},
                   "environment": env}
        write_json_atomic(args.out / f"{name}.json", receipt)
        table = render(receipt)
        (args.out / f"{name}.md").write_text(table)
        print(table)


if __name__ == "__main__":
    main()
