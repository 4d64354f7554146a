"""Tasks and splits for the learned-model studies (paper appendix B.2).

Rows are split 60/20/20 into train/validation/test (stratified for classification). Features are
standardised with moments fitted on train only; the Diabetes target is standardised the same way
and predictions are mapped back, so RMSE and MAE are in the original target units.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import torch
from torch import Tensor

__all__ = ["TASKS", "SEEDS", "FIVE_TASKS", "PAPER_ORDER", "Task", "Split", "load_split", "check_tasks"]

SEEDS = (11, 23, 37)
# Fixed generator seed for the synthetic tasks: the data set is the same for every split seed.
_SYNTHETIC_STATE = 0


@dataclass(frozen=True)
class Task:
    """A scikit-learn bundled data set or generator; ``kind`` is classification or regression."""

    name: str
    title: str
    kind: str
    load: Callable[[], tuple[np.ndarray, np.ndarray]]
    source: str


def _bundled(loader: str) -> Callable[[], tuple[np.ndarray, np.ndarray]]:
    def load() -> tuple[np.ndarray, np.ndarray]:
        import sklearn.datasets as ds
        return getattr(ds, loader)(return_X_y=True)
    return load


def _synthetic_classification() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import make_classification
    return make_classification(n_samples=1500, random_state=_SYNTHETIC_STATE)


def _friedman1() -> tuple[np.ndarray, np.ndarray]:
    from sklearn.datasets import make_friedman1
    return make_friedman1(n_samples=1000, noise=1.0, random_state=_SYNTHETIC_STATE)


TASKS: dict[str, Task] = {t.name: t for t in (
    Task("iris", "Iris", "classification", _bundled("load_iris"), "sklearn.datasets.load_iris"),
    Task("wine", "Wine", "classification", _bundled("load_wine"), "sklearn.datasets.load_wine"),
    Task("breast_cancer", "Breast Cancer", "classification", _bundled("load_breast_cancer"),
         "sklearn.datasets.load_breast_cancer"),
    Task("digits", "Digits", "classification", _bundled("load_digits"),
         "sklearn.datasets.load_digits"),
    Task("synthetic_classification", "Synthetic classification", "classification",
         _synthetic_classification,
         f"sklearn.datasets.make_classification(n_samples=1500, random_state={_SYNTHETIC_STATE})"),
    Task("diabetes", "Diabetes", "regression", _bundled("load_diabetes"),
         "sklearn.datasets.load_diabetes"),
    Task("friedman1", "Friedman1", "regression", _friedman1,
         f"sklearn.datasets.make_friedman1(n_samples=1000, noise=1.0, "
         f"random_state={_SYNTHETIC_STATE})"),
)}
# The five real data sets of Table 4, used by the insertion, zero-column and OTransformer studies,
# in run order (the costliest last, so an interrupted matrix has the others complete).
FIVE_TASKS = ("iris", "wine", "diabetes", "breast_cancer", "digits")
# The paper's row order for the five real data sets.
PAPER_ORDER = ("iris", "wine", "breast_cancer", "digits", "diabetes")


def check_tasks(names: list[str] | tuple[str, ...], allowed: tuple[str, ...]) -> tuple[str, ...]:
    """Validate task names against the study's list; a ValueError names the valid choices."""
    bad = [n for n in names if n not in allowed]
    if bad or not names:
        raise ValueError(f"unknown or empty datasets {bad or names}; choose from {', '.join(allowed)}")
    return tuple(names)


@dataclass
class Split:
    """Standardised tensors of one task and seed. ``y`` is long (classes) or float (standardised
    target); ``target_mean``/``target_scale`` map regression predictions back to original units."""

    task: Task
    seed: int
    x_train: Tensor
    y_train: Tensor
    x_val: Tensor
    y_val: Tensor
    x_test: Tensor
    y_test: Tensor
    n_classes: int
    target_mean: float = 0.0
    target_scale: float = 1.0

    @property
    def n_features(self) -> int:
        return self.x_train.shape[1]

    @property
    def n_outputs(self) -> int:
        return self.n_classes if self.task.kind == "classification" else 1

    def sizes(self) -> dict[str, int]:
        return {"train": len(self.y_train), "val": len(self.y_val), "test": len(self.y_test)}


def load_split(name: str, seed: int, zero_columns: int = 0) -> Split:
    """60/20/20 split of task ``name`` with train-fitted standardisation.

    ``zero_columns`` exact-zero columns are appended after preprocessing (Table 10 protocol).
    """
    from sklearn.model_selection import train_test_split
    from sklearn.preprocessing import StandardScaler

    task = TASKS[name]
    x, y = task.load()
    classify = task.kind == "classification"
    idx = np.arange(len(y))
    rest, test = train_test_split(idx, test_size=0.2, random_state=seed,
                                  stratify=y if classify else None)
    train, val = train_test_split(rest, test_size=0.25, random_state=seed,
                                  stratify=y[rest] if classify else None)
    scaler = StandardScaler().fit(x[train])

    def features(rows: np.ndarray) -> Tensor:
        z = scaler.transform(x[rows])
        z = np.concatenate([z, np.zeros((len(rows), zero_columns))], axis=1)
        return torch.tensor(z, dtype=torch.float32)

    if classify:
        def target(rows: np.ndarray) -> Tensor:
            return torch.tensor(y[rows], dtype=torch.long)
        return Split(task, seed, features(train), target(train), features(val), target(val),
                     features(test), target(test), n_classes=int(y.max()) + 1)
    y_scaler = StandardScaler().fit(y[train].reshape(-1, 1))

    def target(rows: np.ndarray) -> Tensor:
        return torch.tensor(y_scaler.transform(y[rows].reshape(-1, 1))[:, 0], dtype=torch.float32)
    return Split(task, seed, features(train), target(train), features(val), target(val),
                 features(test), target(test), n_classes=0,
                 target_mean=float(y_scaler.mean_[0]), target_scale=float(y_scaler.scale_[0]))
