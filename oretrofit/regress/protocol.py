"""The deterministic split and row caps used for every (dataset, seed) cell.

The paper (B.4) fixes seeds and caps of 512 train / 256 test rows but not the split; this is
ours, recorded in every receipt:

    perm  = numpy.random.default_rng(seed).permutation(n)       # PCG64, stable across platforms
    n_pool_test = ceil(test_fraction · n)                       # test_fraction = 0.25
    test  = perm[:n_pool_test][:max_test]                       # first 256 of the test pool
    train = perm[n_pool_test:][:max_train]                      # first 512 of the train pool

Every arm and τ of one (dataset, seed) sees exactly the same rows.
"""

from __future__ import annotations

import hashlib
import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

__all__ = ["SplitProtocol", "Split", "PAPER_PROTOCOL", "rmse_r2"]

PROTOCOL_NAME = "permute-quarter-cap-v1"


@dataclass(frozen=True)
class Split:
    """Row indices of one (dataset, seed) split, in permuted order."""

    train: np.ndarray  # (n_train,) int64
    test: np.ndarray   # (n_test,) int64

    def digest(self) -> str:
        """SHA-256 of both index arrays (little-endian int64), recorded with each cell."""
        h = hashlib.sha256()
        for part in (self.train, self.test):
            h.update(np.ascontiguousarray(part, dtype="<i8").tobytes())
            h.update(b"|")
        return h.hexdigest()


@dataclass(frozen=True)
class SplitProtocol:
    """Shuffle with the seed, hold out a quarter, cap train and test rows."""

    test_fraction: float = 0.25
    max_train: int = 512
    max_test: int = 256

    def __post_init__(self) -> None:
        if not 0.0 < self.test_fraction < 1.0:
            raise ValueError(f"test_fraction must lie in (0, 1), got {self.test_fraction}")
        if self.max_train < 1 or self.max_test < 1:
            raise ValueError(f"row caps must be >= 1, got max_train={self.max_train}, "
                             f"max_test={self.max_test}")

    def split(self, n_rows: int, seed: int) -> Split:
        """The train/test indices for ``n_rows`` rows under ``seed`` (see module docstring)."""
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise ValueError(f"a split seed is an integer >= 0, got {seed!r}")
        n_pool_test = math.ceil(self.test_fraction * n_rows)
        if n_rows < 2 or n_pool_test >= n_rows:
            raise ValueError(f"a dataset needs at least 2 rows with a non-empty train pool; got "
                             f"{n_rows} rows with test_fraction={self.test_fraction}")
        perm = np.random.default_rng(seed).permutation(n_rows)
        return Split(train=perm[n_pool_test:][:self.max_train],
                     test=perm[:n_pool_test][:self.max_test])

    def check_fits(self, name: str, n_rows: int, seed: int) -> None:
        """Refuse a dataset (``name``, ``n_rows`` rows) whose split under ``seed`` leaves TabPFN
        fewer than 2 train rows (it fits on >= 2 and scores >= 1 test row)."""
        try:
            split = self.split(n_rows, seed)
        except ValueError as exc:
            raise ValueError(f"dataset {name}: {exc}") from None
        if len(split.train) < 2:
            raise ValueError(f"dataset {name} has {n_rows} rows; the split leaves "
                             f"{len(split.train)} train row(s) and TabPFN needs at least 2: use a "
                             "table with at least 4 rows (or a smaller --test-fraction)")

    def describe(self) -> dict[str, Any]:
        """The rule and its parameters, as stored in every receipt."""
        return {"name": PROTOCOL_NAME, **asdict(self),
                "rule": "perm = numpy.random.default_rng(seed).permutation(n); "
                        "k = ceil(test_fraction*n); test = perm[:k][:max_test]; "
                        "train = perm[k:][:max_train]"}


PAPER_PROTOCOL = SplitProtocol()


def rmse_r2(y_true: np.ndarray, y_pred: np.ndarray) -> tuple[float, float]:
    """Test-split RMSE = sqrt(mean((ŷ − y)²)) and R² = 1 − Σ(ŷ − y)² / Σ(y − ȳ)² (NaN when y is
    constant), in the units of ``y``."""
    y_true = np.asarray(y_true, dtype=np.float64).reshape(-1)
    residual = np.asarray(y_pred, dtype=np.float64).reshape(-1) - y_true
    ss_tot = float(np.sum((y_true - y_true.mean()) ** 2))
    r2 = 1.0 - float(np.sum(residual ** 2)) / ss_tot if ss_tot > 0 else float("nan")
    return float(np.sqrt(np.mean(residual ** 2))), r2
