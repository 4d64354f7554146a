"""Calibrate a TabPFN host's per-site τ (any supported model version) on regression data
(see :func:`oretrofit.calibrate`).

The calibration data are the *train* rows of each (dataset, seed) split of the protocol: the
host is fitted on them and predicts them, so every site sees the carriers real rows produce and
no test row is ever read. The spec records the checkpoint, datasets (SHA-256), seeds, split
digests and rows it was calibrated on.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Sequence

import numpy as np
import torch
from torch import nn

from .._surgery.calibrate import calibrate
from .data import Dataset
from .protocol import PAPER_PROTOCOL, SplitProtocol

__all__ = ["calibrate_tabpfn"]


def calibrate_tabpfn(model_path: str | Path | None, datasets: Sequence[Dataset], seeds: Sequence[int],
                     *, arm: str = "full-o", delta: float = 1e-3, quantile: float = 0.01,
                     exclude: Sequence[str] | None = None,
                     protocol: SplitProtocol = PAPER_PROTOCOL, n_estimators: int = 1,
                     device: str = "cpu") -> dict[str, Any]:
    """The calibrated patch spec of ``arm`` for the TabPFN checkpoint (any supported version)
    at ``model_path``, used as a regressor.

    ``τ_site = δ/(1−δ)·Q_q(‖h‖²)`` over the carriers of every (dataset, seed) split's train rows.
    The sites only the classifier runs (v3.5's ``head.cls.*`` and ``dec``,
    :func:`oretrofit.hosts.tabpfn.versions.other_task_sites`) are excluded, and listed in the
    spec's calibration data (``other_task_sites``) next to ``task``.
    """
    from ..hosts.tabpfn.checkpoints import checkpoint_sha256, resolve_model_path
    from ..hosts.tabpfn.checkpoints import build_model, load_checkpoint
    from ..hosts.tabpfn.estimators import in_memory_specs, vendor_class
    from ..hosts.tabpfn.versions import other_task_sites

    if not datasets or not seeds:
        raise ValueError("give at least one dataset and one seed to calibrate on")
    path = resolve_model_path(model_path)
    model = build_model(load_checkpoint(path))[0]            # the instance fit/predict run
    regressor = vendor_class("regressor")(
        model_path=in_memory_specs(path, model, "regressor"), device=device,
        n_estimators=n_estimators, inference_precision=torch.float32, random_state=0)
    splits, record = [], []
    for dataset in datasets:
        for seed in seeds:
            protocol.check_fits(dataset.spec, len(dataset.y), seed)
            split = protocol.split(len(dataset.y), seed)
            if np.ptp(dataset.y[split.train]) == 0:
                raise ValueError(f"the train rows of {dataset.spec} (seed {seed}) have a constant "
                                 f"target ({dataset.y[split.train][0]:g}): TabPFN standardises "
                                 "the target, so no site sees real carriers; calibrate on a "
                                 "dataset whose target varies")
            splits.append((dataset.X[split.train], dataset.y[split.train]))
            record.append({"dataset": dataset.spec, "sha256": dataset.checksum, "seed": int(seed),
                           "split_sha256": split.digest(), "rows": int(len(split.train))})

    def run(_model: nn.Module) -> None:
        for (X, y), row in zip(splits, record):
            try:
                regressor.fit(X, y).predict(X)
            except ValueError as exc:       # tabpfn's refusal of the data (constant features …)
                raise ValueError(f"TabPFN cannot fit the train rows of {row['dataset']} (seed "
                                 f"{row['seed']}): {exc}; calibrate on a dataset it can fit") \
                    from None

    # a model serving both tasks (v3.5) runs only the regressor's head: the classifier's
    # head sites see no carrier, so they are left out (and recorded)
    other = other_task_sites(model, "regressor")
    if other:
        exclude = [*(exclude or ()), *(name for name in other if name not in (exclude or ()))]
    # the checkpoint's file name and hash (no machine-local path: specs are committed)
    data = {"checkpoint": path.name, "checkpoint_sha256": checkpoint_sha256(path),
            "task": "regressor", "other_task_sites": other,
            "protocol": protocol.describe(), "splits": record,
            "rows": int(np.sum([r["rows"] for r in record])), "n_estimators": n_estimators}
    return calibrate(model, run, delta, quantile, arm=arm, exclude=exclude, data=data)
