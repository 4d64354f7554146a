"""Tiny random TabICL models of the vendor's class (no weights can be downloaded here), run in
fp32 without autocast, as the vendor's estimators run on a CPU."""

from __future__ import annotations

from typing import Callable

import pytest
import torch
from tabicl._model.inference_config import InferenceConfig

from oretrofit.tabicl import random_model, write_random_checkpoint


@pytest.fixture(scope="session")
def checkpoints(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    """A random checkpoint of each task in the vendor's format."""
    folder = tmp_path_factory.mktemp("tabicl")
    return {task: write_random_checkpoint(folder / f"{task}.ckpt", task)
            for task in ("classifier", "regressor")}


@pytest.fixture(scope="session")
def fp32() -> InferenceConfig:
    """The vendor's inference settings with autocast off (its CPU default, ``use_amp="auto"``)."""
    config = InferenceConfig()
    config.update_from_dict({stage: {"device": torch.device("cpu"), "use_amp": False}
                             for stage in ("COL_CONFIG", "ROW_CONFIG", "ICL_CONFIG")})
    return config


@pytest.fixture
def tiny() -> Callable[..., torch.nn.Module]:
    """``tiny(task, **config)``: a new, unpatched random TabICL."""
    return lambda task="classifier", **config: random_model(task, **config)[0]


def table(task: str, lanes: int = 2, rows: int = 12, train: int = 8, features: int = 5,
          classes: int = 3, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    """``X (lanes, rows, features)`` and train targets ``(lanes, train)``; every lane of a
    classifier table holds every class (the vendor requires it)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(lanes, rows, features, generator=g)
    if task == "classifier":
        y = (torch.arange(train) % classes).float().expand(lanes, train).clone()
    else:
        y = torch.randn(lanes, train, generator=g)
    return x, y
