"""Tiny random TabDPT models and their checkpoints, written by the tests (no weights can be
downloaded here), and model inputs of a few rows (the tables: ``tests/hosts/conftest.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest
import torch
from torch import Tensor

from oretrofit.tabdpt import checkpoint_config, random_model, write_random_checkpoint


@pytest.fixture(scope="session")
def checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_random_checkpoint(tmp_path_factory.mktemp("tabdpt") / "tiny.safetensors", seed=0)


@pytest.fixture
def model() -> torch.nn.Module:
    """A fresh tiny ``TabDPTModel`` (2 layers, 2 thinking rows, length scale active)."""
    return random_model(checkpoint_config(), seed=0)


@pytest.fixture
def batch() -> Callable[..., tuple[Tensor, Tensor]]:
    """``batch(is_cls, b, n, m, f)``: rows ``x (b, n + m, f)`` and context targets ``y (b, n)``."""

    def make(is_cls: bool, b: int = 2, n: int = 12, m: int = 5, f: int = 8, seed: int = 1
             ) -> tuple[Tensor, Tensor]:
        g = torch.Generator().manual_seed(seed)
        x = torch.randn(b, n + m, f, generator=g)
        y = (torch.randint(0, 3, (b, n), generator=g).float() if is_cls
             else torch.randn(b, n, generator=g))
        return x, y

    return make
