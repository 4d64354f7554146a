"""Host work of one Triton OAttention call, with the kernel launches stubbed (no GPU needed).

    python benchmarks/bench_triton_host.py [--quick] [--against CHECKOUT]
        [--out results/bench_triton_host.json]

Everything :func:`oretrofit._kernels.triton.o_attention_triton` and its backward do around the
kernels (input checks, key logits, allocations, the launch arguments, the presence gradients'
head sums) is timed on the CPU: each kernel's ``run`` (what ``kernel[grid](...)`` calls) is
replaced by a function that returns at once. Rows, bf16, (B, H→Hkv, N, d) = (1, 8→2, 256, 64),
presences ``(B, N)``:

* ``forward``: a call on inputs that require no grad (inference), no mask;
* ``forward, decode``: one query against a key count that changes every call (a growing KV cache:
  no two consecutive calls share a shape);
* ``forward, padding mask``: a ``(B, 1, 1, Nk)`` boolean mask;
* ``forward (grad)``: every input requiring grad (the autograd node is recorded);
* ``backward``: the recorded node's backward (every gradient, the presences' included).

Each row is the median over interleaved rounds of the thread's CPU time per call (a batch of
calls per round), beside ``bare launch``: the stub called with a prebuilt argument list, so the
ratio says how many bare launches one call's host work costs. Targets: the forward rows without
grad ≤ 15 µs, backward ≤ 25 µs. ``--against CHECKOUT`` also times another checkout of the
project (e.g. the commit before a change) in a child process, its rounds interleaved with this
one's, so the two columns share the machine's load.
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

# The compiled kernels' launcher is what is timed (the interpreter would run the kernels).
os.environ.pop("TRITON_INTERPRET", None)

import torch  # noqa: E402

from oretrofit._kernels import triton as launcher  # noqa: E402
from oretrofit._kernels import triton_kernels  # noqa: E402

SHAPE = (1, 8, 2, 256, 64)                                                  # B, H, Hkv, N, d
# forward (grad) has none: torch's autograd.Function.apply alone costs several µs there
TARGETS_US = {"forward": 15.0, "forward, decode": 15.0, "forward, padding mask": 15.0,
              "backward": 25.0}


def _stub(*args, **kwargs) -> None:
    """A launch that does nothing."""


def stub_launches() -> None:
    for kernel in (triton_kernels._forward_kernel, triton_kernels._backward_dq_kernel,
                   triton_kernels._backward_dkdv_kernel):
        kernel.run = _stub


def cases() -> dict:
    """Row name -> a function making one call."""
    b, h, h_kv, n, d = SHAPE
    g = torch.Generator().manual_seed(0)
    q = torch.randn(b, h, n, d, generator=g).bfloat16()
    k, v = (torch.randn(b, h_kv, n, d, generator=g).bfloat16() for _ in range(2))
    p_q, p_k = torch.rand(b, n, generator=g), torch.rand(b, n, generator=g)
    scale = d ** -0.5
    lengths = [torch.randn(b, h_kv, m, d).bfloat16() for m in range(n - 63, n + 1)]
    decode = [(q[:, :, :1].contiguous(), kv, kv, p_q[:, :1], p_k[:, :kv.shape[2]])
              for kv in lengths]
    visible = torch.rand(b, 1, 1, n, generator=g) > 0.1
    grads = [t.clone().requires_grad_() for t in (q, k, v, p_q, p_k)]
    out = launcher.o_attention_triton(*grads, None, None, 0.0, scale)
    node, d_out = out.grad_fn, torch.randn_like(out)
    step = iter(range(1 << 62))
    bare_args, bare_flags = (*(q,) * 9, *range(50)), {f"FLAG{i}": True for i in range(11)}

    def forward(*inputs, mask=None):
        return launcher.o_attention_triton(*inputs, mask, None, 0.0, scale)

    return {
        "forward": lambda: forward(q, k, v, p_q, p_k),
        "forward, decode": lambda: forward(*decode[next(step) % len(decode)]),
        "forward, padding mask": lambda: forward(q, k, v, p_q, p_k, mask=visible),
        "forward (grad)": lambda: launcher.o_attention_triton(*grads, None, None, 0.0, scale),
        "backward": lambda: node.apply(d_out),
        "bare launch": lambda: triton_kernels._forward_kernel.run(
            *bare_args, grid=(1, 1), warmup=False, **bare_flags),
    }


def one_round(calls: dict, repeats: int) -> dict[str, float]:
    """µs of thread CPU time per call of each case, one batch of ``repeats`` calls each."""
    times = {}
    for name, call in calls.items():
        call()
        start = time.thread_time_ns()
        for _ in range(repeats):
            call()
        times[name] = (time.thread_time_ns() - start) / repeats / 1e3
    return times


def child(repeats: int) -> None:
    """Serve rounds on request (``--child``): a line in, one round's JSON out."""
    calls = cases()
    for _ in sys.stdin:
        print(json.dumps(one_round(calls, repeats)), flush=True)


def summarise(rounds: list[dict[str, float]]) -> dict[str, float]:
    return {name: statistics.median(r[name] for r in rounds) for name in rounds[0]}


def markdown(rows: list[dict], env: dict, against: str | None) -> str:
    from oretrofit._files.markdown import pipe_table
    b, h, h_kv, n, d = SHAPE
    header = ["call", "µs per call", "× bare launch", "target µs", "verdict"]
    if against:
        header[1:1] = [f"µs at {against}", f"× bare at {against}"]
    table = []
    for r in rows:
        cells = [r["call"], f"{r['us']:.1f}", f"{r['ratio']:.1f}×",
                 f"≤ {r['target_us']:.0f}" if r["target_us"] else "–", r["verdict"]]
        if against:
            cells[1:1] = [f"{r['against_us']:.1f}", f"{r['against_ratio']:.1f}×"]
        table.append(cells)
    return (f"# Host work of one Triton OAttention call (launches stubbed)\n\n"
            f"`{env['command']}` at {env['git_revision']}, torch {env['packages'].get('torch')}, "
            f"triton {env['packages'].get('triton')}, {env['created_utc']}. bf16, (B, H→Hkv, N, "
            f"d) = ({b}, {h}→{h_kv}, {n}, {d}); medians of the thread's CPU time per call over "
            f"interleaved rounds; made by benchmarks/bench_triton_host.py (its docstring says "
            f"what each row times).\n\n"
            + pipe_table(header, table, ["left"] + ["right"] * (len(header) - 2) + ["left"])
            + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="2 rounds of 200 calls (smoke run)")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--repeats", type=int, default=2000, help="calls per case per round")
    parser.add_argument("--against", help="another checkout of the project, timed alongside")
    parser.add_argument("--out", default="results/bench_triton_host.json")
    parser.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.repeats = 2, 200
    if args.against and not (Path(args.against) / "oretrofit").is_dir():
        parser.error(f"--against {args.against}: no oretrofit package there; give a checkout "
                     "of the project (e.g. git worktree add /tmp/base HEAD~1)")
    stub_launches()
    if args.child:
        return child(args.repeats)
    from oretrofit._files.provenance import environment, write_json_atomic
    other = None
    if args.against:
        env = {**os.environ, "PYTHONPATH": str(Path(args.against).resolve())}
        other = subprocess.Popen([sys.executable, __file__, "--child", "--repeats",
                                  str(args.repeats)], stdin=subprocess.PIPE,
                                 stdout=subprocess.PIPE, text=True, env=env,
                                 cwd=args.against)
    calls, mine, theirs = cases(), [], []
    for _ in range(args.rounds):
        mine.append(one_round(calls, args.repeats))
        if other:
            other.stdin.write("round\n")
            other.stdin.flush()
            theirs.append(json.loads(other.stdout.readline()))
    if other:
        other.stdin.close()
        other.wait()
    ours, base = summarise(mine), summarise(theirs) if theirs else None
    rows = []
    for name, us in ours.items():
        if name == "bare launch":
            continue
        target = TARGETS_US.get(name)
        row = {"call": name, "us": us, "ratio": us / ours["bare launch"], "target_us": target,
               "verdict": "–" if target is None else "met" if us <= target else "missed"}
        if base:
            row |= {"against_us": base[name], "against_ratio": base[name] / base["bare launch"]}
        rows.append(row)
        print(json.dumps(row), flush=True)
    env = environment()
    against = None
    if args.against:
        revision = subprocess.run(["git", "-C", args.against, "rev-parse", "--short", "HEAD"],
                                  capture_output=True, text=True).stdout.strip()
        against = revision or Path(args.against).name
    out = Path(args.out)
    write_json_atomic(out, {"environment": env, "shape": SHAPE, "rounds": args.rounds,
                            "repeats": args.repeats, "bare_launch_us": ours["bare launch"],
                            "against": against, "rows": rows, "every_round": mine,
                            "every_round_against": theirs})
    out.with_suffix(".md").write_text(markdown(rows, env, against))


if __name__ == "__main__":
    main()
