"""Tiny random Mitra models and their checkpoints, written by the tests (no weights can be
downloaded here), datasets of a few rows, and the vendor's estimators in float32."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
import torch
from torch import Tensor

from oretrofit.hosts.mitra import random_model, write_random_checkpoint


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A random classifier and regressor checkpoint, by task."""
    root = tmp_path_factory.mktemp("mitra")
    return {task: write_random_checkpoint(root / task, task, seed=0)
            for task in ("classification", "regression")}


@pytest.fixture(params=["classification", "regression"])
def model(request: pytest.FixtureRequest) -> torch.nn.Module:
    """A fresh tiny ``Tab2D`` (2 layers, width 16) of each task."""
    return random_model(request.param, seed=0)


@pytest.fixture
def cells() -> Callable[..., tuple[Tensor, ...]]:
    """``cells(task, b, s, q, f)``: the model's six inputs, none of them padding."""

    def make(task: str, b: int = 2, s: int = 12, q: int = 5, f: int = 4, seed: int = 1
             ) -> tuple[Tensor, ...]:
        g = torch.Generator().manual_seed(seed)
        y = (torch.randint(0, 3, (b, s), generator=g) if task == "classification"
             else torch.randn(b, s, generator=g))
        return (torch.randn(b, s, f, generator=g), y, torch.randn(b, q, f, generator=g),
                torch.zeros(b, f, dtype=torch.bool), torch.zeros(b, s, dtype=torch.bool),
                torch.zeros(b, q, dtype=torch.bool))

    return make


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


@pytest.fixture
def float32(monkeypatch: pytest.MonkeyPatch) -> None:
    """The vendor's estimators run their forward in float32 instead of their fixed bfloat16
    autocast (``precision`` is not an estimator argument), for the vendor's and ours alike:
    bfloat16 rounds two equal computations in different orders apart by more than 1e-5."""
    from autogluon.tabular.models.mitra.sklearn_interface import MitraBase
    vendor = MitraBase._create_config

    def create_config(self, *args, **kwargs):
        cfg, loader = vendor(self, *args, **kwargs)
        cfg.hyperparams["precision"] = "float32"
        return cfg, loader

    monkeypatch.setattr(MitraBase, "_create_config", create_config)
    warnings.filterwarnings("ignore", message=".*autocast.*")
