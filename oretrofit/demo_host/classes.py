"""Classification tasks for the demo classifier: the regression prior's tasks, their targets cut into classes.

Each task is a task of :mod:`oretrofit.demo_host.prior` (the same feature distributions and
functions f), whose standardised target y is cut at k − 1 thresholds θ_1 < … < θ_{k−1} drawn
among the train rows' values of y, at random quantiles, and relabelled by a random permutation π
of 0 … k−1:

    c(x) = π(#{j : θ_j ≤ y(x)}),   k = 2 with chance ``binary_fraction``, else uniform in 2 … ``max_classes``,

as TabPFN's priors turn a regression task into a classification task. A threshold is a train
value of y, so every class holds at least one train row (the v3 read-out can only name a class
it has seen among the train rows); a task whose y takes fewer than k distinct train values gets
as many classes as it has values. The permutation keeps the class index from saying where the
class lies on y, as a dataset's label encoding says nothing of it.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import torch

from .prior import PriorConfig, TaskBatch, sample_batch

__all__ = ["ClassConfig", "classes_of", "sample_class_batch"]


@dataclasses.dataclass(frozen=True)
class ClassConfig:
    """How many classes a task gets."""

    max_classes: int = 10
    binary_fraction: float = 0.3       # chance a task is binary; else k is uniform in 2 … max_classes

    def __post_init__(self) -> None:
        if self.max_classes < 2:
            raise ValueError(f"max_classes must be at least 2 (a binary task), got {self.max_classes}")
        if not 0.0 <= self.binary_fraction <= 1.0:
            raise ValueError(f"binary_fraction is a probability in [0, 1], got {self.binary_fraction}")


def classes_of(y: np.ndarray, n_train: int, cfg: ClassConfig, rng: np.random.Generator) -> np.ndarray:
    """Integer classes (n_rows,) of a target ``y`` whose first ``n_train`` rows are the train rows
    (see the module docstring); every class in 0 … k−1 occurs among the train rows."""
    k = 2 if rng.random() < cfg.binary_fraction else int(rng.integers(2, cfg.max_classes + 1))
    values = np.unique(y[:n_train])                                   # sorted distinct train values
    k = min(k, len(values))
    # k − 1 distinct cut positions among values[1:], so class 0 keeps values[0]
    cuts = np.sort(rng.choice(np.arange(1, len(values)), size=k - 1, replace=False))
    rank = np.searchsorted(values[cuts], y, side="right")             # #{j : θ_j ≤ y}
    return rng.permutation(k)[rank]


def sample_class_batch(rng: np.random.Generator, batch_size: int, prior: PriorConfig, cfg: ClassConfig,
                       shape_rng: np.random.Generator | None = None) -> TaskBatch:
    """A :func:`~oretrofit.demo_host.prior.sample_batch` batch with each task's y replaced by its
    classes (float class indices, as TabPFN passes them to the model)."""
    batch = sample_batch(rng, batch_size, prior, shape_rng)
    labels = [classes_of(batch.y[:, b].numpy(), batch.n_train, cfg, rng) for b in range(batch_size)]
    return dataclasses.replace(batch, y=torch.tensor(np.stack(labels, axis=1), dtype=torch.float32))
