"""Checkpoints written by the tests themselves (no weights can be downloaded here)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import numpy as np
import pytest
import torch

from oretrofit.tabpfn import build_model, load_checkpoint, write_random_checkpoint


@pytest.fixture(scope="session")
def small_ckpt(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_random_checkpoint(tmp_path_factory.mktemp("hosts") / "tabpfn-v3-small.ckpt",
                                   "small", seed=0)


@pytest.fixture
def fresh_model(small_ckpt: Path) -> Callable[..., torch.nn.Module]:
    """``fresh_model(dtype)``: a new, unpatched instance of the small host."""

    def make(dtype: torch.dtype = torch.float64) -> torch.nn.Module:
        model, _, _ = build_model(load_checkpoint(small_ckpt))
        return model.to(dtype)

    return make


@pytest.fixture(autouse=True)
def _private_cache(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch
                   ) -> None:
    """'random'/'demo' hosts go to a per-session cache, never the user's."""
    monkeypatch.setenv("ORETROFIT_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "cache"))


@pytest.fixture(scope="session")
def table() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """A small regression table: 30 train rows, 10 test rows, 4 features."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(40, 4))
    y = x @ rng.normal(size=4) + 0.1 * rng.normal(size=40)
    return x[:30], y[:30], x[30:]


@pytest.fixture(scope="session")
def classifier_ckpt(tmp_path_factory: pytest.TempPathFactory):
    return write_random_checkpoint(tmp_path_factory.mktemp("hosts") / "tabpfn-v3-classifier.ckpt",
                                   "small", seed=0, task="classifier")


@pytest.fixture(scope="session")
def classes() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """30 train rows of 3 classes, 10 test rows, 4 features."""
    rng = np.random.default_rng(0)
    x = rng.normal(size=(40, 4))
    y = np.digitize(x @ rng.normal(size=4), [-0.5, 0.5])
    return x[:30], y[:30], x[30:]
