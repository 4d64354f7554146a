"""Mitra checkpoints in the vendor's format, and small random models to write them from.

A Mitra checkpoint is a directory as ``Tab2D.save_pretrained`` writes it: ``config.json``
(``dim``, ``dim_output``, ``n_layers``, ``n_heads``, ``task``) and ``model.safetensors``, which
``Tab2D.from_pretrained`` reads, and so the estimators' ``hf_model`` (a directory, or a Hugging
Face repo id such as ``autogluon/mitra-classifier`` that the vendor downloads). Where weights
cannot be downloaded, :func:`write_random_checkpoint` writes a random model the estimators load
from its directory like the real one.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

__all__ = ["TINY", "random_model", "write_random_checkpoint"]

# a tiny config (the vendor's names): 2 layers of width 16, 2 heads; the classifier's output
# width is the vendor estimators' 10 classes
TINY: dict[str, Any] = {"dim": 16, "n_layers": 2, "n_heads": 2}
_OUTPUTS = {"classification": 10, "regression": 1}


def random_model(task: str = "classification", seed: int = 0, **config: Any) -> nn.Module:
    """A ``Tab2D`` for ``task`` (``classification`` or ``regression``) of :data:`TINY` with
    ``config`` overriding its entries, random weights, every one of them non-trivial: the
    vendor's LayerNorms start at weight 1, bias 0, which would leave the norm gates untested."""
    from autogluon.tabular.models.mitra._internal.models.tab2d import Tab2D
    if task not in _OUTPUTS:
        raise ValueError(f"unknown Mitra task {task!r}; choose one of {', '.join(_OUTPUTS)}")
    unknown = sorted(set(config) - set(TINY))
    if unknown:
        raise ValueError(f"unknown Mitra config entries {unknown}; the entries are "
                         f"{', '.join(TINY)}")
    torch.manual_seed(seed)
    model = Tab2D(**{**TINY, **config}, dim_output=_OUTPUTS[task], task=task.upper(),
                  use_pretrained_weights=False, path_to_weights="", device="cpu")
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "norm" in name:
                centre = 1.0 if name.endswith("weight") else 0.0
                parameter.copy_(centre + 0.2 * torch.randn(parameter.shape, generator=generator))
    return model.eval()


def write_random_checkpoint(directory: str | os.PathLike[str], task: str = "classification",
                            seed: int = 0, **config: Any) -> Path:
    """A random Mitra checkpoint (:func:`random_model`) in ``directory``, for
    ``MitraClassifier(hf_model=directory)`` (``task="regression"``: ``MitraRegressor``)."""
    random_model(task, seed, **config).save_pretrained(os.fspath(directory))
    return Path(directory)
