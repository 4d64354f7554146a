"""TabICL checkpoints in the vendor's format: ``torch.save({"config": …, "state_dict": …})``,
what ``TabICLClassifier`` / ``TabICLRegressor`` load from ``model_path``
(``TabICL(**config).load_state_dict(state_dict)``).

Real weights come from the Hugging Face Hub (the vendor downloads them); a random checkpoint of
the vendor's class (:func:`write_random_checkpoint`) serves tests and offline machines.
"""

from __future__ import annotations

import inspect
import os
from typing import Any, Literal

import torch
from torch import nn

__all__ = ["TINY_CONFIG", "random_model", "write_random_checkpoint"]

Task = Literal["classifier", "regressor"]

TINY_CONFIG: dict[str, Any] = dict(
    embed_dim=16, col_num_blocks=1, col_nhead=2, col_num_inds=4, row_num_blocks=2, row_nhead=2,
    row_num_cls=2, icl_num_blocks=2, icl_nhead=2, ff_factor=2, zero_init=False)
"""A small TabICL (thousands of parameters) with every stage and site of the released ones."""


def random_model(task: Task = "classifier", seed: int = 0, **config: Any) -> tuple[nn.Module,
                                                                                    dict]:
    """A random ``TabICL`` of ``task`` (``max_classes`` 10 or 0) and its config: the vendor's
    defaults overridden by :data:`TINY_CONFIG`, then by ``config``, less what the installed
    release does not take. A release without ``zero_init`` (before 2.2.0) always zeroes the
    blocks' output projections; ``zero_init=False`` then draws them as ``nn.Linear`` does."""
    from tabicl._model.tabicl import TabICL
    full = {"max_classes": 10 if task == "classifier" else 0, "num_quantiles": 9, **TINY_CONFIG,
            **config}
    accepted = inspect.signature(TabICL).parameters
    taken = {key: value for key, value in full.items() if key in accepted}
    with torch.random.fork_rng():
        torch.manual_seed(seed)
        model = TabICL(**taken).eval()
        if not full.get("zero_init", True) and "zero_init" not in accepted:
            for block in model.modules():
                if hasattr(block, "linear2") and hasattr(block, "attn"):
                    block.attn.out_proj.reset_parameters()
                    block.linear2.reset_parameters()
    return model, taken


def write_random_checkpoint(path: str | os.PathLike[str], task: Task = "classifier",
                            seed: int = 0, **config: Any) -> str:
    """Write :func:`random_model`'s weights at ``path`` in the vendor's checkpoint format."""
    model, full = random_model(task, seed, **config)
    torch.save({"config": full, "state_dict": model.state_dict()}, path)
    return os.fspath(path)
