"""The shipped training recipe as one call: stages of longer tasks at lower peak rates.

Stage k of a curriculum run (k = 0 … n−1) takes 1/n of the budget (of ``budget_s``, or of
``budget_steps`` when set), draws tasks of at most ``max_rows_k`` rows, peaks at
``lr · lr_scale_k`` and seeds its tasks with ``seed + k``; from stage 1 on it starts from the
previous stage's weights with a fresh optimiser (``train(..., init_from=...)``). The first n−1
stages live in ``OUT/stage1`` … and the last in ``OUT`` itself, so ``OUT`` is a run folder like
any other (export, card and evaluation read it; its state records every stage).
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

from .._files.provenance import portable
from .train import STATE_NAME, TrainConfig, train

__all__ = ["CURRICULUM", "Stage", "stage_configs", "stage_folders", "train_curriculum"]

# progress and notices, not results: shown by the CLI (oretrofit.cli.output.show_progress)
_log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Stage:
    """One stage of a curriculum: its task length and its peak rate relative to the first stage's."""

    max_rows: int
    lr_scale: float


# v9b's recipe, and v13c's (shipped): 128, 256 then 512 rows at 1, 0.7 and 0.5 times the peak rate
CURRICULUM = (Stage(128, 1.0), Stage(256, 0.7), Stage(512, 0.5))


def stage_folders(out: Path, n_stages: int) -> list[Path]:
    """``OUT/stage1`` … ``OUT/stage{n-1}``, then ``OUT`` for the last stage."""
    return [Path(out) / f"stage{k + 1}" for k in range(n_stages - 1)] + [Path(out)]


def stage_configs(cfg: TrainConfig, stages: tuple[Stage, ...] = CURRICULUM) -> list[TrainConfig]:
    """Each stage's TrainConfig: ``cfg`` with its share of the budget, rate, seed and task length."""
    n = len(stages)
    if cfg.budget_steps is not None and cfg.budget_steps < n:
        raise ValueError(f"budget_steps {cfg.budget_steps} is split over {n} stages; give at least {n}")
    return [dataclasses.replace(cfg, seed=cfg.seed + k, lr=cfg.lr * stage.lr_scale, budget_s=cfg.budget_s / n,
                                budget_steps=cfg.budget_steps // n if cfg.budget_steps else None,
                                prior=dataclasses.replace(cfg.prior, max_rows=stage.max_rows))
            for k, stage in enumerate(stages)]


def train_curriculum(out: Path, cfg: TrainConfig, *, stages: tuple[Stage, ...] = CURRICULUM,
                     resume: bool = False, progress: bool = True) -> dict[str, Any]:
    """Train every stage in turn (see the module docstring); return the last stage's summary with
    ``steps`` and ``elapsed_s`` summed over the stages and ``stages``, each stage's
    ``{"run", "steps", "elapsed_s"}``.

    With ``resume``, a stage whose folder holds a state continues from it (a finished one takes no
    further step) and the stages after it run as usual, so an interrupted run picks up where it stopped.
    """
    folders = stage_folders(out, len(stages))
    done: list[dict[str, Any]] = []
    for k, (folder, stage_cfg) in enumerate(zip(folders, stage_configs(cfg, stages))):
        if progress:
            _log.info(f"stage {k + 1}/{len(stages)}: {folder}  max_rows {stage_cfg.prior.max_rows}  "
                      f"peak lr {stage_cfg.lr:.3g}  seed {stage_cfg.seed}")
        if resume and (folder / STATE_NAME).exists():
            summary = train(folder, stage_cfg, resume=True, progress=progress)
        else:
            summary = train(folder, stage_cfg, init_from=folders[k - 1] if k else None, progress=progress)
        done.append({"run": portable(Path(folder)), "steps": summary["steps"], "elapsed_s": summary["elapsed_s"]})
    return {**summary, "steps": sum(d["steps"] for d in done), "elapsed_s": sum(d["elapsed_s"] for d in done),
            "stages": done}
