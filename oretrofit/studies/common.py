"""What every study shares: its options, the run driver, and number formatting."""

from __future__ import annotations

import hashlib
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from itertools import product
from typing import Any, Callable, Iterable, Protocol

import torch
from torch import nn

from .._files.atomic import write_text_atomic
from .._files.lock import receipt_lock
from .._files.written import claim
from .data import SEEDS, TASKS as REGISTRY, Split
from .models import FTHost, HostSpec, build_host
from .receipts import PlannedRun, Receipt, run_plan
from .training import TrainConfig, fit

__all__ = ["StudyOptions", "StudyResult", "Study", "run_study", "matrix_plan", "train_host",
           "state_digest", "quantiles", "mean", "fmt", "QUANTILES"]

QUANTILES = (0.0, 0.01, 0.5, 0.99, 1.0)


@dataclass(frozen=True)
class StudyOptions:
    """Which part of a study's matrix to run and with what budget.

    ``quick`` is the CI-size matrix: one data set, one seed, 3 epochs, through the same code path.
    """

    datasets: tuple[str, ...] | None = None
    seeds: tuple[int, ...] = SEEDS
    epochs: int = 100
    batch_size: int = 256
    quick: bool = False

    def resolved(self, default_tasks: tuple[str, ...]) -> "StudyOptions":
        """Fill the study's default tasks; ``quick`` keeps the first task and seed, 3 epochs."""
        datasets = self.datasets or default_tasks
        if self.quick:
            return StudyOptions(datasets[:1], self.seeds[:1], min(self.epochs, 3), self.batch_size,
                                True)
        return StudyOptions(tuple(datasets), tuple(self.seeds), self.epochs, self.batch_size, False)

    def train(self) -> TrainConfig:
        return TrainConfig(epochs=self.epochs, batch_size=self.batch_size)

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class Study(Protocol):
    """A study module: its name, default tasks, matrix and Markdown report."""

    NAME: str
    TASKS: tuple[str, ...]

    def plan(self, options: StudyOptions) -> list[PlannedRun]: ...

    def report(self, runs: dict[str, dict], plan: list[str]) -> str: ...


@dataclass
class StudyResult:
    """Where a study's receipt and table went, the table itself and how much of the plan is done."""

    receipt_path: Path
    table_path: Path
    markdown: str
    complete: bool
    runs_done: int
    runs_planned: int
    wall_s: float = field(default=0.0)


def run_study(study: Study, options: StudyOptions, out: str | Path, quiet: bool = False,
              execute: bool = True, merge_from: Iterable[str | Path] = ()) -> StudyResult:
    """Run (or resume) ``study`` into ``out/NAME.json`` and ``out/NAME.md`` (``-quick`` suffix
    for the CI matrix); returns the paths and the Markdown table.

    ``merge_from`` receipts (parallel workers' folders) are absorbed first; ``execute=False``
    then only regenerates the table. One process at a time writes a receipt: the run holds
    ``out/.NAME.json.lock`` (:func:`oretrofit._files.lock.receipt_lock`), so a second run of the study
    into ``out`` is refused naming the receipt and the first run.
    """
    options = options.resolved(study.TASKS)
    stem = study.NAME + ("-quick" if options.quick else "")
    out = Path(out)
    path = out / f"{stem}.json"
    if not execute and not path.exists():
        raise ValueError(f"no receipt at {path} to report from; run the study first")
    with receipt_lock(path):
        claim(out, [path.name, f"{stem}.md"])      # never a file of these names oretrofit did not write
        return _run_locked(study, options, out, stem, quiet, execute, merge_from)


def _run_locked(study: Study, options: StudyOptions, out: Path, stem: str, quiet: bool,
                execute: bool, merge_from: Iterable[str | Path]) -> StudyResult:
    receipt = Receipt(out / f"{stem}.json", study.NAME, options.as_dict(), new_session=execute)
    for other in merge_from:
        receipt.absorb(other)
    plan = study.plan(options)
    start = time.perf_counter()
    if execute:
        run_plan(receipt, plan, quiet=quiet)
    ids = [r.run_id for r in plan]
    done = sum(i in receipt.runs for i in ids)
    scope, counts = _coverage(study, options, receipt.runs)
    markdown = study.report(receipt.runs, ids) + "\n\n" + scope
    receipt.save(options=options.as_dict(), planned=ids, table_markdown=markdown, coverage=counts,
                 complete=done == len(ids))
    table_path = out / f"{stem}.md"
    write_text_atomic(table_path, markdown + "\n")
    return StudyResult(receipt.path, table_path, markdown, done == len(ids), done, len(ids),
                       time.perf_counter() - start)


def _coverage(study: Study, options: StudyOptions,
              runs: dict[str, dict]) -> tuple[str, dict[str, list[int]]]:
    """Which runs of the study's full matrix (default tasks and seeds) are in the receipt, the
    wall/CPU time they took, and the CPU the full matrix needs at each task's mean CPU per run."""
    full = StudyOptions(epochs=options.epochs, batch_size=options.batch_size, quick=options.quick)
    counts: dict[str, list[int]] = {}
    cpu_by_task: dict[str, list[float]] = {}
    for run in study.plan(full.resolved(study.TASKS)):
        task = run.run_id.split("/")[0]
        task_count = counts.setdefault(task, [0, 0])
        task_count[1] += 1
        if run.run_id in runs:
            task_count[0] += 1
            if "cpu_s" in runs[run.run_id]:
                cpu_by_task.setdefault(task, []).append(runs[run.run_id]["cpu_s"])
    done, total = sum(c[0] for c in counts.values()), sum(c[1] for c in counts.values())
    wall = sum(r["wall_s"] for r in runs.values())
    cpu = sum(r.get("cpu_s", 0.0) for r in runs.values())
    per_task = ", ".join(f"{task} {d}/{t}" for task, (d, t) in counts.items())
    text = (f"Coverage: {done} of {total} runs of the {'CI' if options.quick else 'full'} matrix "
            f"({per_task}). These runs took {wall:.0f} s wall and {cpu:.0f} s process CPU here "
            "(one thread per process).")
    measured = [t for t in counts if t in cpu_by_task]
    if measured:
        need = sum(mean(cpu_by_task[t]) * counts[t][1] for t in measured)
        unmeasured = [t for t in counts if t not in cpu_by_task]
        text += (f" At each task's mean CPU per run, the full matrix needs about {need:.0f} s of "
                 "one core" + (f" plus the unmeasured {', '.join(unmeasured)}" if unmeasured
                               else "") + ".")
    return text, counts


def state_digest(model: nn.Module) -> str:
    """SHA-256 of every parameter's values, in registration order (names excluded, so arms whose
    modules are wrapped differently compare by state alone): equal digests = identical states."""
    digest = hashlib.sha256()
    for tensor in model.parameters():
        digest.update(str(tuple(tensor.shape)).encode())
        digest.update(tensor.detach().cpu().contiguous().numpy().tobytes())
    return digest.hexdigest()


def quantiles(values: torch.Tensor) -> dict[str, float]:
    """The QUANTILES of a flat tensor, keyed ``q0``, ``q0.01`` …; empty gives {}."""
    flat = values.detach().double().flatten()
    if flat.numel() == 0:
        return {}
    qs = torch.quantile(flat, torch.tensor(QUANTILES, dtype=torch.float64))
    return {f"q{q:g}": float(v) for q, v in zip(QUANTILES, qs)}


def mean(values: Iterable[float]) -> float | None:
    values = list(values)
    return sum(values) / len(values) if values else None


def fmt(value: float | None, spec: str = ".4f") -> str:
    """A number for a table: ``.9111`` style for 0 < |x| < 1 with ``.4f``, ``–`` when missing."""
    if value is None:
        return "–"
    text = format(value, spec)
    if spec.endswith("f") and text.lstrip("+-").startswith("0.") and "e" not in text:
        text = text.replace("0.", ".", 1)
    return text


def matrix_plan(options: StudyOptions, axes: list[tuple[str, str, tuple]],
                extra: Callable[..., dict], execute: Callable[..., dict]) -> list[PlannedRun]:
    """The task × seed × axes matrix as planned runs, id ``task/seed11/<prefix><value>/…``.

    ``axes`` holds ``(config key, id prefix, values)``; each run's configuration is task, data
    source, seed, the axis values, ``extra(**cell)`` and the training budget, and its work is
    ``execute(options, **cell)`` with ``cell = {"task", "seed", axis keys}``.
    """
    runs = []
    for task, seed in product(options.datasets, options.seeds):
        for values in product(*(axis[2] for axis in axes)):
            cell = {"task": task, "seed": seed, **{key: v for (key, _, _), v in zip(axes, values)}}
            config = {**cell, "source": REGISTRY[task].source, **extra(**cell),
                      "train": options.train().as_dict()}
            run_id = "/".join([task, f"seed{seed}",
                               *(f"{prefix}{v}" for (_, prefix, _), v in zip(axes, values))])
            runs.append(PlannedRun(run_id, config, lambda c=cell: execute(options, **c)))
    return runs


def train_host(spec: HostSpec, split: Split, options: StudyOptions, n_zero: int = 0,
               zero_columns: int = 0) -> tuple[FTHost, dict]:
    """Build an FT host with :func:`build_host` (arms of one spec structure share their initial
    state; ``zero_columns`` matches it to the k = 0 host) and train it with ``n_zero`` inserted
    zero tokens."""
    model = build_host(spec, split.n_features, split.n_outputs, split.seed, zero_columns)
    init = state_digest(model)
    training = fit(model, split, options.train(), forward=lambda x: model(x, n_zero=n_zero))
    return model, {"initial_state_sha256": init, "sizes": split.sizes(), "training": training}
