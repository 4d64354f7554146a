"""Demo-host training throughput by architecture size and tasks per step: the measurement
behind the sizes and batches tried.

    OMP_NUM_THREADS=2 python benchmarks/bench_pretrain_sizes.py [--steps 10] [--warmup 2]
                                                               [--out results/bench_pretrain_sizes.json]
    OMP_NUM_THREADS=1 python benchmarks/bench_pretrain_sizes.py --candidates 32x4,32x2,32x8,32x16 \
        --max-rows 128 --out results/bench_pretrain_batch-128.json      # tasks per step alone

For each candidate (``embed_dim`` x tasks per step; default the sizes tried, 32x4,48x8,64x8) the
v3 demo architecture is built from the same ``HostConfig`` as ``oretrofit pretrain-demo`` (other
fields at their defaults), and ``oretrofit.demo_host.train.training_step`` runs with
``build_optimizer``'s optimiser on batches of the prior with ``noise_max=3`` and ``--max-rows``
(default 512, the shipped host's last stage), seeded alike for every candidate. After
``--warmup`` untimed steps, ``--steps`` timed steps give steps/s and prior tasks/s; the table
gives both and tasks/s as a ratio to the first candidate, measured in the same run. Prints a
Markdown table and writes a JSON receipt with provenance.
"""

from __future__ import annotations

import argparse
import dataclasses
import time
from pathlib import Path

from oretrofit._files.markdown import pipe_table
from oretrofit._files.provenance import environment, write_json_atomic
from oretrofit.demo_host.parallel import SOLO, Workers
from oretrofit.demo_host.prior import PriorConfig, sample_batch
from oretrofit.demo_host.train import (HostConfig, TrainConfig, build_host, build_optimizer, spline_borders,
                                       training_step)

CANDIDATES = "32x4,48x8,64x8"          # embed_dim x tasks per step
PRIOR = PriorConfig(max_rows=512, noise_max=3.0)
SEED = 0


def throughput(embed_dim: int, batch_size: int, steps: int, warmup: int,
               prior: PriorConfig = PRIOR, workers: Workers = SOLO) -> dict[str, float]:
    """Parameters, steps/s and tasks/s of ``training_step`` for one size on batches of ``prior``
    (``batch_size`` tasks on this worker; with several ``workers``, gradients averaged over them
    and batch shapes drawn from one shared stream, as ``pretrain-demo --workers`` trains)."""
    cfg = TrainConfig(batch_size=batch_size, host=HostConfig(embed_dim=embed_dim), prior=prior)
    model = build_host(cfg.host, SEED)
    opt = build_optimizer(model, cfg)
    borders = spline_borders(cfg.host.num_buckets)
    rng, shape_rng = workers.samplers(SEED)
    batches = [sample_batch(rng, batch_size, prior, shape_rng) for _ in range(warmup + steps)]
    for batch in batches[:warmup]:
        training_step(model, opt, batch, borders, cfg.grad_clip, workers)
    start = time.perf_counter()
    for batch in batches[warmup:]:
        training_step(model, opt, batch, borders, cfg.grad_clip, workers)
    seconds = (time.perf_counter() - start) / steps
    return {"embed_dim": embed_dim, "batch_size": batch_size,
            "parameters": sum(p.numel() for p in model.parameters()),
            "steps_per_s": 1.0 / seconds, "tasks_per_s": batch_size / seconds}


def parse_candidates(text: str) -> list[tuple[int, int]]:
    """``"32x4,48x8"`` -> ``[(32, 4), (48, 8)]`` (embed_dim, tasks per step); an argparse type."""
    try:
        pairs = [tuple(int(v) for v in item.split("x")) for item in text.split(",")]
    except ValueError:
        pairs = []
    if not pairs or any(len(p) != 2 or min(p) < 1 for p in pairs):
        raise argparse.ArgumentTypeError(f"{text!r}: give EMBEDxTASKS pairs, e.g. 32x4,48x8")
    return pairs


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=2)
    parser.add_argument("--candidates", type=parse_candidates, default=CANDIDATES, help="EMBEDxTASKS pairs, the first the baseline")
    parser.add_argument("--max-rows", type=int, default=PRIOR.max_rows, help="the prior's task length")
    parser.add_argument("--out", type=Path, default=Path("results/bench_pretrain_sizes.json"))
    args = parser.parse_args()
    try:
        prior = dataclasses.replace(PRIOR, max_rows=args.max_rows)
    except ValueError as exc:       # PriorConfig checks the range and names the fix
        parser.error(f"--max-rows: {exc}")
    rows = [throughput(e, b, args.steps, args.warmup, prior) for e, b in args.candidates]
    base = rows[0]["tasks_per_s"]
    table = pipe_table(
        ["embed_dim", "tasks/step", "parameters", "steps/s", "tasks/s", "tasks/s vs first"],
        [[r["embed_dim"], r["batch_size"], f"{r['parameters']:,}", f"{r['steps_per_s']:.2f}",
          f"{r['tasks_per_s']:.1f}", f"{r['tasks_per_s'] / base:.2f}×"] for r in rows])
    print(table)
    write_json_atomic(args.out, {"schema_version": 1, "kind": "oretrofit.bench.pretrain_sizes",
                                 "prior": dataclasses.asdict(prior), "seed": SEED,
                                 "steps": args.steps, "warmup": args.warmup, "rows": rows,
                                 "markdown": table, "environment": environment()})


if __name__ == "__main__":
    main()
