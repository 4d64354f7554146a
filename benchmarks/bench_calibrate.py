"""`oretrofit calibrate --model minilm` on text: time and peak memory, and the speed-up over one
forward per site and line.

    OMP_NUM_THREADS=1 python benchmarks/bench_calibrate.py [--lines 2000] [--baseline-lines 50]
                                                           [--big-mb 100]
                                                           [--out results/bench_calibrate.json]

Text: ``--lines`` short lines of 4 to 30 words drawn (seeded) from the built-in calibration
lines' words (about 25 MiniLM tokens a line). Every run is one thread (``OMP_NUM_THREADS=1``).

* ``cli``: the command ``oretrofit calibrate --model minilm --text-file LINES`` end to end
  (imports and loading the model included), in a fresh process: wall time, CPU time (user +
  system: what one core spends on it, whatever else the machine runs) and peak resident set
  (``ru_maxrss``).
* ``one pass`` vs ``per site``: in this process, on the first ``--baseline-lines`` lines, the
  calibration as it runs (every site in one pass, lines batched by length) against each site
  patched alone over the lines one at a time (one forward per site and line, as calibration ran
  before); the ratio of their times, and whether their τ agree.
* ``big file`` / ``one big line``: the command on ``--big-mb`` MB of those lines, and on one line
  of that size: the text is read up to the token budget, so time and memory stay those of the
  budget, not of the file.

Prints a Markdown table and writes the rows and the environment as JSON (``--out``).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from oretrofit import calibrate
from oretrofit._files.provenance import environment, write_json_atomic
from oretrofit._surgery.calibrate import _exact
from oretrofit.hosts.transformers.calibrate import builtin_texts, calibrate_text
from oretrofit.hosts.transformers.measures import load_minilm

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}


def sample_lines(count: int, seed: int = 0) -> list[str]:
    """``count`` lines of 4 to 30 words drawn from the built-in lines' words."""
    words = sorted({w for line in builtin_texts() for w in line.split()})
    rng = random.Random(seed)
    return [" ".join(rng.choice(words) for _ in range(rng.randint(4, 30))) for _ in range(count)]


def run_cli(text: Path, out: Path) -> dict[str, Any]:
    """``oretrofit calibrate --model minilm --text-file text`` in a fresh process: its wall time,
    peak resident set, note and the spec's text record."""
    with tempfile.TemporaryFile("w+") as stderr:
        start = time.perf_counter()
        child = subprocess.Popen([sys.executable, "-m", "oretrofit.cli.app", "calibrate",
                                  "--model", "minilm", "--text-file", str(text), "--out",
                                  str(out)], env=ENV, stdout=subprocess.DEVNULL, stderr=stderr)
        _, status, usage = os.wait4(child.pid, 0)
        seconds = time.perf_counter() - start
        stderr.seek(0)
        errors = stderr.read()
    if os.waitstatus_to_exitcode(status) != 0:
        raise SystemExit(f"calibrate on {text} failed: {errors[-2000:]}")
    data = json.loads(out.read_text())["calibration"]["data"]
    return {"seconds": round(seconds, 2), "cpu_seconds": round(usage.ru_utime + usage.ru_stime, 2),
            "peak_rss_mb": round(usage.ru_maxrss / 1024),
            "rows": data["rows"], "tokens": data["tokens"], "batches": data["batches"],
            "budget_reached": data["budget_reached"],
            "note": next((line for line in errors.splitlines() if line.startswith("note:")), "")}


def one_pass_against_per_site(lines: list[str]) -> dict[str, Any]:
    """The calibration as it runs against each site alone over the lines one at a time, on the
    same lines in this process: times, their ratio, and whether the τ agree."""
    model, tokenizer = load_minilm()
    start = time.perf_counter()
    spec = calibrate_text(model, tokenizer, lines)
    one_pass = time.perf_counter() - start
    alone = [{"input_ids": torch.tensor([tokenizer(line, truncation=True, max_length=128)
                                         ["input_ids"]])} for line in lines]
    start, site_tau = time.perf_counter(), {}
    for name in spec["calibration"]["sites"]:
        site_tau.update(calibrate(model, alone, targets=[_exact(name)])["site_tau"])
    per_site = time.perf_counter() - start
    return {"lines": len(lines), "sites": len(site_tau), "one_pass_s": round(one_pass, 2),
            "per_site_s": round(per_site, 2), "speedup": round(per_site / one_pass, 1),
            "same_tau": site_tau == spec["site_tau"]}


def markdown(receipt: dict[str, Any]) -> str:
    compare = receipt["one_pass_vs_per_site"]
    rows = ["| run | lines | tokens | forwards | wall (s) | CPU (s) | peak RSS (MB) | budget "
            "reached |", "|---|---:|---:|---:|---:|---:|---:|---|"]
    for name, row in receipt["cli"].items():
        rows.append(f"| `calibrate --model minilm` on {name} | {row['rows']:,} | "
                    f"{row['tokens']:,} | {row['batches']:,} | {row['seconds']:.1f} | "
                    f"{row['cpu_seconds']:.1f} | {row['peak_rss_mb']:,} | "
                    f"{'yes' if row['budget_reached'] else 'no'} |")
    rows.append("")
    rows.append(f"One thread a process (OMP_NUM_THREADS=1); load average "
                f"{receipt['load_average'][0]:.1f} at the start, {receipt['load_average'][1]:.1f} "
                "at the end (wall time includes waiting for a core; CPU time does not).")
    rows.append(f"One pass vs each site alone, one line at a time, on {compare['lines']} lines "
                f"({compare['sites']} sites): {compare['one_pass_s']:.1f} s vs "
                f"{compare['per_site_s']:.1f} s, {compare['speedup']}× faster; same τ: "
                f"{'yes' if compare['same_tau'] else 'NO'}.")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--lines", type=int, default=2000)
    parser.add_argument("--baseline-lines", type=int, default=50)
    parser.add_argument("--big-mb", type=float, default=100.0)
    parser.add_argument("--out", type=Path, default=Path("results/bench_calibrate.json"))
    args = parser.parse_args()
    if not (args.lines >= 1 and 1 <= args.baseline_lines <= args.lines and args.big_mb > 0):
        parser.error("give --lines >= --baseline-lines >= 1 and --big-mb > 0")
    lines = sample_lines(args.lines)
    load = [os.getloadavg()[0]]
    size = int(args.big_mb * 1e6)
    cli = {}
    with tempfile.TemporaryDirectory() as folder:
        texts = {f"{args.lines:,} lines": Path(folder, "lines.txt"),
                 f"{args.big_mb:g} MB of lines": Path(folder, "big.txt"),
                 f"one line of {args.big_mb:g} MB": Path(folder, "one-line.txt")}
        paths = list(texts.values())
        paths[0].write_text("\n".join(lines) + "\n")
        block = "\n".join(lines) + "\n"
        with paths[1].open("w") as big, paths[2].open("w") as one:
            for _ in range(size // len(block) + 1):
                big.write(block)
                one.write(block.replace("\n", " "))
        for name, path in texts.items():
            cli[name] = run_cli(path, Path(folder, "spec.json"))
            print(f"{name}: {cli[name]}", flush=True)
    receipt = {"schema_version": 1, "benchmark": "calibrate", "model": "minilm",
               "threads": ENV["OMP_NUM_THREADS"], "cli": cli,
               "one_pass_vs_per_site": one_pass_against_per_site(lines[:args.baseline_lines]),
               "load_average": [*load, os.getloadavg()[0]], "environment": environment("cpu")}
    table = markdown(receipt)
    print(table)
    write_json_atomic(args.out, receipt)
    args.out.with_suffix(".md").write_text(table + "\n")


if __name__ == "__main__":
    main()
