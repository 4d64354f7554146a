"""Memory over retrofit → revert → drop cycles: a dropped model must be freed.

    OMP_NUM_THREADS=1 python benchmarks/bench_cycles.py [--cycles 100] [--pickle]
                                                        [--out results/bench_cycles.json]

Each cycle deep-copies the loaded MiniLM (all-MiniLM-L6-v2, fp32), retrofits it (``full-o``),
runs one forward, reverts it (with ``--pickle``: round-trips the retrofitted model through
``pickle`` first and drops both) and drops it. The script reads the resident set (Linux
``VmRSS``) after ``gc.collect()`` at the first cycle and every tenth, and prints its growth over
the first cycle's; a model freed when dropped keeps it flat (within an allocator's slack, tens of
MB), one kept alive grows it by the model's size (~90 MB) per cycle. The rows are printed as a
Markdown table and written to ``--out`` as JSON.
"""

from __future__ import annotations

import argparse
import copy
import gc
import json
import pickle
from pathlib import Path

import torch

from oretrofit import retrofit
from oretrofit.hosts.transformers.measures import load_minilm


def rss_mb() -> float:
    """This process's resident set in MB (``VmRSS`` of /proc/self/status)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise SystemExit("bench_cycles.py reads /proc/self/status: run it on Linux")


def cycle(base: torch.nn.Module, ids: torch.Tensor, round_trip: bool) -> None:
    model = copy.deepcopy(base)
    done = retrofit(model, "full-o")
    with torch.no_grad():
        model(input_ids=ids)
    if round_trip:
        pickle.loads(pickle.dumps(model))
    done.revert()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cycles", type=int, default=100)
    parser.add_argument("--pickle", action="store_true", help="a pickle round trip per cycle")
    parser.add_argument("--out", type=Path, default=Path("results/bench_cycles.json"))
    args = parser.parse_args()
    if args.cycles < 1:
        parser.error("--cycles must be at least 1")
    base, tokenizer = load_minilm()
    ids = tokenizer(["a retrofitted model that is dropped is freed"], return_tensors="pt")["input_ids"]
    print("| cycle | RSS (MB) | growth over cycle 1 (MB) |\n|---:|---:|---:|")
    first, rows = None, []
    for i in range(1, args.cycles + 1):
        cycle(base, ids, args.pickle)
        gc.collect()
        if i == 1 or i % 10 == 0 or i == args.cycles:
            now = rss_mb()
            first = now if first is None else first
            rows.append({"cycle": i, "rss_mb": now, "growth_mb": now - first})
            print(f"| {i} | {now:.0f} | {now - first:+.0f} |", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"cycles": args.cycles, "pickle": args.pickle, "rows": rows},
                                   indent=1) + "\n")


if __name__ == "__main__":
    main()
