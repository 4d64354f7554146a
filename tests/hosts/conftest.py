"""Fixtures the tabular hosts' tests share: train and test tables of a few rows."""

from __future__ import annotations

from typing import Callable

import numpy as np
import pytest


@pytest.fixture
def table() -> Callable[..., tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """``table(rows, features, classes, seed)``: train ``X, y`` and test ``X`` (classes 0 means
    a regression target)."""

    def make(rows: int, features: int, classes: int, seed: int, test_rows: int = 7
             ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        rng = np.random.default_rng(seed)
        x = rng.normal(size=(rows + test_rows, features))
        y = (rng.integers(0, classes, rows) if classes
             else x[:rows] @ rng.normal(size=features) + 0.1 * rng.normal(size=rows))
        return x[:rows], y, x[rows:]

    return make
