"""A small random-init TabPFN v3 host, written once per session in tabpfn's checkpoint format."""

from __future__ import annotations

from pathlib import Path
from typing import Callable

import pytest
import torch

from oretrofit.tabpfn_v3 import build_model, load_checkpoint, write_random_checkpoint


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
