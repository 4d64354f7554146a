"""Tiny random Mitra models and their checkpoints, written by the tests (no weights can be
downloaded here), model inputs of a few rows (the tables: ``tests/hosts/conftest.py``), and the
vendor's estimators in float32."""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Callable

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
