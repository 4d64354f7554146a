"""Resumable JSON receipts: one file per study, rewritten atomically after every finished run.

A receipt holds the study-level options, every run's configuration and outcome, and the
environment (:func:`oretrofit._files.provenance.environment`) of each session that added runs. A run
already in the receipt with the same configuration is skipped, so an interrupted study resumes
where it stopped; a stored run whose configuration differs is an error rather than a silent mix.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from .._files.reading import read_json
from .._files.json_numbers import as_written
from .._files.provenance import environment, portable, write_json_atomic

__all__ = ["SCHEMA_VERSION", "PlannedRun", "Receipt", "run_plan"]

SCHEMA_VERSION = 1


@dataclass(frozen=True)
class PlannedRun:
    """One fit (or sweep case): a stable id, its full configuration, and the work itself."""

    run_id: str
    config: dict[str, Any]
    execute: Callable[[], dict[str, Any]]


def _read_receipt(path: Path, study: str, fix: str) -> dict[str, Any]:
    """The receipt of ``study`` at ``path``, read bounded and strictly
    (:func:`oretrofit._files.reading.read_json`); a file that is not a receipt of ``study`` (a JSON object
    with its runs and sessions) is a ValueError naming it and ending in ``fix``."""
    data = read_json(path, "the study receipt", fix)
    if not (isinstance(data, dict) and isinstance(data.get("runs"), dict)
            and isinstance(data.get("sessions"), list)):
        raise ValueError(f"the study receipt {path} is not a receipt oretrofit wrote (a JSON "
                         f"object with runs and sessions); {fix}")
    if data.get("study") != study:
        raise ValueError(f"{path} is a receipt of study {data.get('study')!r}, not {study!r}; "
                         f"{fix}")
    return data


class Receipt:
    """The JSON receipt of one study at ``path`` (loaded when it exists, for resuming)."""

    def __init__(self, path: str | Path, study: str, options: dict[str, Any],
                 new_session: bool = True) -> None:
        self.path = Path(path)
        if self.path.exists():
            self.data = _read_receipt(self.path, study, "pass another --out folder")
        else:
            self.data = {"schema_version": SCHEMA_VERSION, "study": study, "runs": {},
                         "sessions": []}
        self.session = {"environment": environment("cpu"), "options": options, "runs_added": 0,
                        "wall_s": 0.0}
        if new_session:
            self.data["options"] = options
            self.data["sessions"].append(self.session)
            self.data["environment"] = self.session["environment"]

    @property
    def runs(self) -> dict[str, dict[str, Any]]:
        return self.data["runs"]

    def done(self, run: PlannedRun) -> bool:
        """Whether ``run`` is stored with the same configuration (a mismatch raises)."""
        stored = self.runs.get(run.run_id)
        if stored is None:
            return False
        if stored["config"] != as_written(run.config):
            raise ValueError(f"run {run.run_id} in {self.path} was made with another configuration; "
                             "delete that receipt or pass another --out folder to start afresh")
        return True

    def record(self, run: PlannedRun, outcome: dict[str, Any], wall_s: float,
               cpu_s: float) -> None:
        """Store one finished run (wall and process CPU seconds) and rewrite the file."""
        self.runs[run.run_id] = {"config": run.config, "outcome": outcome, "wall_s": wall_s,
                                 "cpu_s": cpu_s, "session": len(self.data["sessions"]) - 1}
        self.session["runs_added"] += 1
        self.session["wall_s"] += wall_s
        self.save()

    def absorb(self, other: str | Path) -> int:
        """Add the runs of another receipt of this study (e.g. a parallel worker's, run with
        other seeds into another folder); returns how many runs were new here."""
        data = _read_receipt(Path(other), self.data["study"], "merge only receipts this study "
                             "wrote (its --out folders)")
        added = 0
        for run_id, run in data["runs"].items():
            mine = self.runs.get(run_id)
            if mine is None:
                self.runs[run_id] = {**run, "merged_from": portable(Path(other))}
                added += 1
            elif mine["config"] != run["config"]:
                raise ValueError(f"run {run_id} differs in configuration between {self.path} and "
                                 f"{other}; merge only receipts made with the same settings")
        self.data.setdefault("merged", []).append(
            {"path": portable(Path(other)), "runs_added": added, "sessions": data["sessions"]})
        return added

    def save(self, **fields: Any) -> None:
        self.data.update(fields)
        write_json_atomic(self.path, self.data)


def run_plan(receipt: Receipt, plan: list[PlannedRun], quiet: bool = False) -> None:
    """Execute every planned run not yet in the receipt, with a progress bar on stderr."""
    receipt.save(planned=[r.run_id for r in plan], complete=False)
    todo = [r for r in plan if not receipt.done(r)]
    console = Console(stderr=True, quiet=quiet)
    columns = (TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
               TimeElapsedColumn(), TextColumn("{task.fields[current]}"))
    with Progress(*columns, console=console, transient=False) as progress:
        bar = progress.add_task(receipt.data["study"], total=len(plan),
                                completed=len(plan) - len(todo), current="")
        for run in todo:
            progress.update(bar, current=run.run_id)
            start, cpu = time.perf_counter(), time.process_time()
            outcome = run.execute()
            receipt.record(run, outcome, time.perf_counter() - start, time.process_time() - cpu)
            progress.advance(bar)
    receipt.save(complete=all(r.run_id in receipt.runs for r in plan))
