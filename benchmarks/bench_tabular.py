"""Tabular foundation models: each family's retrofitted ``predict`` against the unpatched
estimator, and its batched prediction against the per-dataset loop, at the vendor's defaults.

    OMP_NUM_THREADS=1 python benchmarks/bench_tabular.py [--family tabpfn,tabicl,tabdpt]
                                                         [--quick] [--rounds 3] [--datasets 6]
                                                         [--device cpu]
                                                         [--out results/bench_tabular.json]

Families and hosts (``--quick``: the small hosts, for a smoke run):

* ``tabpfn``: the shipped ``demo`` checkpoints (regressor and classifier, both prior-fitted),
  ``oretrofit.tabpfn``;
* ``tabicl``: a random-weight checkpoint written by :func:`oretrofit.tabicl.write_random_checkpoint`
  in the vendor's default architecture (``TabICL()``'s arguments; ``--quick``: ``TINY_CONFIG``);
* ``tabdpt``: a random-weight checkpoint by :func:`oretrofit.tabdpt.write_random_checkpoint`
  (``SIZES`` below; not the released model's size, which is not on the registry). tabdpt lives
  in an environment of its own (``make test-tabdpt``): run ``--family tabdpt`` there with the
  same ``--out``, and its entry joins the receipt beside the others' (each family keeps the
  environment and load it was measured in).

Every estimator is the vendor's, built by the family's ``make_regressor`` / ``make_classifier``
with the vendor's defaults except ``device`` (and tabdpt's ``verbose=False``; its ``predict``
gets ``seed=0``, which ``predict_batched`` needs when ``n_ensembles > 1``); ``base`` is the
unpatched estimator, the O arm is ``full-o`` at τ = 1e-8. Two measures per family and task:

* predict: both arms fitted once on one table (``N_TRAIN`` × ``N_FEATURES``, ``N_TEST`` test
  rows); their ``predict`` (regressor) or ``predict_proba`` (classifier) in interleaved rounds
  after a warm-up; the ratio is full-o's median seconds over base's (target ≤ 1.15×);
* batched: ``--datasets`` ragged datasets (seed 0: 40–200 train rows, 10–60 test rows, 3–8
  features, 2–4 classes); ``predict_batched`` / ``predict_proba_batched`` of the full-o
  estimator against ``copy.copy(estimator).fit(X, y).predict(X_test)`` per dataset, interleaved;
  the ratio is the loop's median seconds over the batched call's (throughput, target ≥ 1.0×),
  with the largest difference of the batched predictions from the loop's (in the warm-up),
  relative to the loop's largest value.

On the CPU a run is timed in the process's CPU seconds (:func:`clock`), so the other processes
of a shared machine do not stretch one contender's rounds and not the other's; the load average
before and after each family is recorded beside them. Prints
a Markdown table, writes it beside the receipt (``.md``) and a JSON receipt with provenance.
"""

from __future__ import annotations

import argparse
import copy
import importlib
import json
import os
import statistics
import sys
import time
import warnings
from pathlib import Path
from typing import Any, Callable, NamedTuple

import numpy as np
import torch

from oretrofit._files.atomic import write_text_atomic
from oretrofit._files.markdown import pipe_table
from oretrofit._files.provenance import (cache_dir, environment, package_version, portable,
                                         sha256_file, write_json_atomic)

FAMILIES = ("tabpfn", "tabicl", "tabdpt")
TASKS = ("regressor", "classifier")
TAU, SEED = 1e-8, 0
TARGETS = {"predict": 1.15, "batched": 1.0}
"""full-o predict seconds over base's (at most); the loop's seconds over the batched call's
(at least)."""
N_TRAIN, N_TEST, N_FEATURES, N_CLASSES = 128, 64, 8, 3
QUICK_SHAPE = (48, 16, 4, 3)
SIZES = {"tabdpt": {"emsize": 128, "nhead": 4, "ff_dim": 256, "nlayers": 4,
                    "max_num_features": 16, "max_eval_context": 1024}}
"""The tabdpt bench host's entries over ``oretrofit.tabdpt.TINY``."""
Data = list[tuple[np.ndarray, np.ndarray, np.ndarray]]


class Family(NamedTuple):
    """How the benchmark builds one family's estimators and calls its batched prediction."""

    name: str
    module: str                                     # oretrofit.<family>
    checkpoint: Callable[[str, bool], Path]         # (task, quick) -> checkpoint file
    vendor_kwargs: Callable[[str], dict[str, Any]]  # device -> the arguments set here
    predict_kwargs: dict[str, Any]


def _tabpfn_checkpoint(task: str, quick: bool) -> Path:
    from oretrofit.tabpfn import resolve_model_path
    return resolve_model_path("random" if quick else "demo", task)


def _tabicl_checkpoint(task: str, quick: bool) -> Path:
    import inspect
    from tabicl._model.tabicl import TabICL
    from oretrofit.tabicl import write_random_checkpoint
    config = {} if quick else {
        name: p.default for name, p in inspect.signature(TabICL).parameters.items()
        if name not in ("max_classes", "num_quantiles")}
    path = (cache_dir() / f"tabicl-random-{task}-{'tiny' if quick else 'default'}-seed{SEED}-"
                          f"tabicl{package_version('tabicl')}.ckpt")
    path.parent.mkdir(parents=True, exist_ok=True)
    return path if path.exists() else Path(write_random_checkpoint(path, task, SEED, **config))


def _tabdpt_checkpoint(task: str, quick: bool) -> Path:
    from oretrofit.tabdpt import write_random_checkpoint
    path = (cache_dir() / f"tabdpt-random-{'tiny' if quick else 'bench'}-seed{SEED}-"
                          f"tabdpt{package_version('tabdpt')}.safetensors")
    path.parent.mkdir(parents=True, exist_ok=True)
    return path if path.exists() else write_random_checkpoint(
        path, SEED, **({} if quick else SIZES["tabdpt"]))


FAMILY = {
    "tabpfn": Family("tabpfn", "oretrofit.tabpfn", _tabpfn_checkpoint,
                     lambda device: {"device": device}, {}),
    "tabicl": Family("tabicl", "oretrofit.tabicl", _tabicl_checkpoint,
                     lambda device: {"device": device}, {}),
    "tabdpt": Family("tabdpt", "oretrofit.tabdpt", _tabdpt_checkpoint,
                     lambda device: {"device": device, "verbose": False}, {"seed": SEED}),
}


def table(shape: tuple[int, int, int, int], task: str) -> tuple[np.ndarray, np.ndarray,
                                                                 np.ndarray]:
    n, m, c, k = shape
    rng = np.random.default_rng(SEED)
    x = rng.normal(size=(n + m, c))
    y = np.sin(x[:, 0]) + x[:, 1] * x[:, -1] + 0.1 * rng.normal(size=n + m)
    if task == "classifier":
        y = np.digitize(y, np.quantile(y, np.linspace(0, 1, k + 1)[1:-1]))
    return x[:n], y[:n], x[n:]


def ragged(count: int, task: str) -> Data:
    rng = np.random.default_rng(SEED)
    out = []
    for _ in range(count):
        n, m = int(rng.integers(40, 201)), int(rng.integers(10, 61))
        c, k = int(rng.integers(3, 9)), int(rng.integers(2, 5))
        x = rng.normal(size=(n + m, c))
        y = np.tanh(x @ rng.normal(size=c)) + 0.1 * rng.normal(size=n + m)
        if task == "classifier":
            y = np.digitize(y, np.quantile(y[:n], np.linspace(0, 1, k + 1)[1:-1]))
        out.append((x[:n], y[:n], x[n:]))
    return out


def clock(device: str) -> Callable[[], float]:
    """The clock a run is timed by: on the CPU the process's CPU seconds (``time.process_time``,
    all its threads), which the other processes sharing the cores do not inflate, as they do
    wall-clock seconds; on CUDA wall-clock seconds after a synchronize."""
    return time.perf_counter if device.startswith("cuda") else time.process_time


def interleaved(runs: dict[str, Callable[[], Any]], rounds: int, device: str
                ) -> tuple[dict[str, list[float]], dict[str, Any]]:
    """Seconds (:func:`clock`) of each run over ``rounds`` interleaved rounds, and what each
    returned in its untimed warm-up."""
    first = {name: run() for name, run in runs.items()}
    seconds: dict[str, list[float]] = {name: [] for name in runs}
    now = clock(device)
    for _ in range(rounds):
        for name, run in runs.items():
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            start = now()
            run()
            if device.startswith("cuda"):
                torch.cuda.synchronize()
            seconds[name].append(now() - start)
    return seconds, first


def _max_rel_difference(found: list[Any], expected: list[Any]) -> float:
    return max(float(np.abs(np.asarray(a) - np.asarray(b)).max()
                     / max(np.abs(np.asarray(b)).max(), 1e-30)) for a, b in zip(found, expected))


def measure(family: Family, task: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    """The predict and batched rows of one family and task (module docstring)."""
    api = importlib.import_module(family.module)
    make = getattr(api, f"make_{task}")
    method = "predict" if task == "regressor" else "predict_proba"
    batched = getattr(api, f"{method}_batched")
    path = family.checkpoint(task, args.quick)
    vendor, kwargs = family.vendor_kwargs(args.device), family.predict_kwargs
    estimators = {arm: make(path, arm, None if arm == "base" else TAU, **vendor)[0]
                  for arm in ("base", "full-o")}
    x, y, x_test = table(QUICK_SHAPE if args.quick else (N_TRAIN, N_TEST, N_FEATURES,
                                                         N_CLASSES), task)
    for estimator in estimators.values():
        estimator.fit(x, y)
    predict, _ = interleaved({arm: (lambda e=e: getattr(e, method)(x_test, **kwargs))
                              for arm, e in estimators.items()}, args.rounds, args.device)
    data = ragged(2 if args.quick else args.datasets, task)
    full_o = estimators["full-o"]

    def fit_predict(x_train: np.ndarray, y_train: np.ndarray, x_test: np.ndarray) -> Any:
        estimator = copy.copy(full_o)
        estimator.fit(x_train, y_train)             # tabdpt's fit returns None
        return getattr(estimator, method)(x_test, **kwargs)

    def loop() -> list[Any]:
        return [fit_predict(*dataset) for dataset in data]

    def batch() -> list[Any]:
        return batched(full_o, *map(list, zip(*data)), **kwargs)

    seconds, first = interleaved({"loop": loop, "batched": batch}, args.rounds, args.device)
    difference = _max_rel_difference(first["batched"], first["loop"])
    common = {"task": task, "method": method, "checkpoint": portable(path),
              "checkpoint_sha256": sha256_file(path), "vendor_kwargs": vendor,
              "predict_kwargs": kwargs}
    return [{**common, "measure": "predict", "contenders": ["base", "full-o"],
             "seconds": predict, "ratio": statistics.median(predict["full-o"])
             / statistics.median(predict["base"]), "target": TARGETS["predict"]},
            {**common, "measure": "batched", "contenders": ["loop", "batched"],
             "seconds": seconds, "datasets": len(data),
             "ratio": statistics.median(seconds["loop"]) / statistics.median(seconds["batched"]),
             "target": TARGETS["batched"], "max_rel_difference": difference}]


def run_family(name: str, args: argparse.Namespace) -> dict[str, Any]:
    load_before = os.getloadavg()
    rows = [row for task in TASKS for row in measure(FAMILY[name], task, args)]
    return {"family": name, "package": name, "version": package_version(name),
            "rows": rows, "load_before": load_before, "load_after": os.getloadavg(),
            "cpus": os.cpu_count(), "environment": environment(args.device)}


def _met(row: dict[str, Any]) -> str:
    ok = (row["ratio"] <= row["target"] if row["measure"] == "predict"
          else row["ratio"] >= row["target"])
    sign = "≤" if row["measure"] == "predict" else "≥"
    return f"{row['ratio']:.2f}× ({sign} {row['target']:g}×: {'met' if ok else 'missed'})"


def markdown(receipt: dict[str, Any]) -> str:
    quick = " (--quick: small hosts)" if receipt["quick"] else ""
    shape = QUICK_SHAPE if receipt["quick"] else (N_TRAIN, N_TEST, N_FEATURES, N_CLASSES)
    lines = [f"Each family's estimators at the vendor's defaults{quick}, {receipt['device']}, "
             f"torch on {receipt['threads']} thread(s), full-o τ={TAU:g} against base "
             f"(unpatched), {receipt['rounds']} interleaved rounds after a warm-up. predict: "
             f"{shape[0]} train × {shape[2]} features, {shape[1]} test rows (classifier: "
             f"{shape[3]} classes); ratio = full-o seconds / base seconds. batched: ragged "
             "datasets (40–200 train rows, 10–60 test rows, 3–8 features, 2–4 classes); "
             "ratio = loop seconds / batched seconds. Seconds: "
             + ("wall-clock" if receipt["device"].startswith("cuda") else
                "the process's CPU seconds (time.process_time), which other processes on the "
                "shared cores do not inflate") + ".", ""]
    header = ["family", "task", "measure", "seconds (median)", "ratio (target)",
              "max rel. difference from loop", "load (1 min, before/after)"]
    table_rows = []
    for name in FAMILIES:
        entry = receipt["families"].get(name)
        if entry is None:
            continue
        load = f"{entry['load_before'][0]:.1f} / {entry['load_after'][0]:.1f} on {entry['cpus']}"
        for row in entry["rows"]:
            medians = " / ".join(f"{c} {statistics.median(row['seconds'][c]):.3f}"
                                 for c in row["contenders"])
            what = (f"{row['method']}" if row["measure"] == "predict"
                    else f"{row['method']}_batched, {row['datasets']} datasets")
            table_rows.append([f"{name} {entry['version']}", row["task"], what, medians,
                               _met(row), f"{row['max_rel_difference']:.1e}"
                               if "max_rel_difference" in row else "—", load])
    lines.append(pipe_table(header, table_rows, align=["left"] * 3 + ["right"] * 4))
    return "\n".join(lines)


def _previous(out: Path, args: argparse.Namespace) -> dict[str, Any]:
    """The other families' entries of the receipt at ``out`` when it was made with the same
    settings (a family run in its own environment joins them); none otherwise."""
    if not out.exists():
        return {}
    found = json.loads(out.read_text())
    same = (found.get("benchmark") == "bench_tabular" and
            all(found.get(k) == getattr(args, k) for k in ("quick", "rounds", "datasets",
                                                            "device")))
    return found["families"] if same else {}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--family", default=None, help="comma-separated families of "
                        f"{', '.join(FAMILIES)} (default: those whose package is installed)")
    parser.add_argument("--quick", action="store_true", help="small hosts and tables")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--datasets", type=int, default=6)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--out", type=Path, default=Path("results/bench_tabular.json"))
    args = parser.parse_args()
    families = ([f.strip() for f in args.family.split(",") if f.strip()]
                if args.family is not None else [f for f in FAMILIES if package_version(f)])
    if not families:
        parser.error(f"none of {', '.join(FAMILIES)} is installed; install one "
                     "(pip install 'oretrofit[tabpfn]', ...)")
    if set(families) - set(FAMILIES) or args.rounds < 1 or args.datasets < 1:
        parser.error(f"--family takes some of {', '.join(FAMILIES)} (got {args.family!r}); "
                     "--rounds and --datasets at least 1")
    for name in families:
        if package_version(name) is None:
            parser.error(f"--family {name} needs the {name} package; run it in an environment "
                         f"with it (tabdpt: make test-tabdpt builds one) or leave it out")
    warnings.filterwarnings("ignore", message="Running on CPU with more than")
    if args.device == "cpu":
        torch.set_num_threads(1)
    entries = _previous(args.out, args)
    for name in families:
        print(f"== {name}", file=sys.stderr)
        entries[name] = run_family(name, args)
    receipt = {"schema_version": 1, "benchmark": "bench_tabular", "quick": args.quick,
               "rounds": args.rounds, "datasets": args.datasets, "device": args.device,
               "threads": torch.get_num_threads(), "tau": TAU, "seed": SEED,
               "targets": TARGETS, "families": entries}
    receipt["markdown"] = markdown(receipt)
    write_json_atomic(args.out, receipt)
    write_text_atomic(args.out.with_suffix(".md"), receipt["markdown"] + "\n")
    print(receipt["markdown"])
    print(json.dumps({"receipt": portable(args.out)}), file=sys.stderr)


if __name__ == "__main__":
    main()
