"""TabDPT checkpoints in the vendor's format, and small random models to write them from.

A tabdpt checkpoint is one safetensors file: the model's ``state_dict`` and, in its metadata, the
training config as JSON under ``"cfg"`` (``model.*``, ``training.dropout``, ``env.device``),
which ``TabDPTEstimator._load_model`` reads and hands to ``TabDPTModel.load``. Real weights come
from the Hugging Face Hub (``Layer6/TabDPT``); where they cannot be downloaded,
:func:`write_random_checkpoint` writes a random model the estimators load from its path
(``model_weight_path``) like the real one.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import torch
from torch import nn

__all__ = ["TINY", "checkpoint_config", "random_model", "write_checkpoint",
           "write_random_checkpoint"]

# the ``model`` section of a tiny config (tabdpt's names): 2 layers of width 16, 8 features,
# 4 classes, 2 thinking rows, the length scale active from 4 context rows on
TINY: dict[str, Any] = {
    "max_num_classes": 4, "enc_cell_dim": 8, "regression_bin_count": 16,
    "regression_bin_min": -3.0, "regression_bin_max": 3.0, "nhead": 2, "ff_dim": 32,
    "emsize": 16, "nlayers": 2, "max_num_features": 8, "min_eval_context": 4,
    "max_eval_context": 64, "y_encoder_dim": 8, "num_col_attn_layers": 2, "n_thinking_rows": 2}


def checkpoint_config(**model: Any) -> dict[str, Any]:
    """The config a checkpoint carries: :data:`TINY` with ``model`` overriding its entries."""
    unknown = sorted(set(model) - set(TINY))
    if unknown:
        raise ValueError(f"unknown TabDPT config entries {unknown}; the entries are "
                         f"{', '.join(TINY)}")
    return {"model": {**TINY, **model}, "training": {"dropout": 0.0}, "env": {"device": "cpu"}}


def random_model(config: dict[str, Any], seed: int = 0) -> nn.Module:
    """A ``TabDPTModel`` of ``config`` with random weights, every one of them non-trivial: the
    vendor zero-initialises the attention's output projection, the query gate and the FFN's
    down projection (an identity layer), and the norms start at weight 1, bias 0, which would
    leave the O-gates of those branches untested."""
    from omegaconf import OmegaConf
    torch.manual_seed(seed)
    model = _constructed(OmegaConf.create(config))
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("norm.weight") or name.endswith("norm.bias"):
                centre = 1.0 if name.endswith("weight") else 0.0
                parameter.copy_(centre + 0.2 * torch.randn(parameter.shape, generator=generator))
            elif name.endswith(("out_proj.weight", "q_gate.weight", "down.weight")):
                bound = parameter.shape[1] ** -0.5
                parameter.uniform_(-bound, bound, generator=generator)
    return model.eval()


def _constructed(cfg: Any) -> nn.Module:
    """The model ``TabDPTModel.load`` builds from ``cfg``, before it loads a state into it."""
    from tabdpt.model import TabDPTModel
    m = cfg.model
    return TabDPTModel(
        dropout=cfg.training.dropout, enc_cell_dim=m.enc_cell_dim, n_out=m.max_num_classes,
        regression_bin_count=m.regression_bin_count, regression_bin_min=m.regression_bin_min,
        regression_bin_max=m.regression_bin_max, nhead=m.nhead, nhid=m.ff_dim, ninp=m.emsize,
        nlayers=m.nlayers, num_features=m.max_num_features, base_len=m.min_eval_context,
        max_len=m.max_eval_context, y_encoder_dim=m.y_encoder_dim,
        num_col_attn_layers=m.num_col_attn_layers, n_thinking_rows=m.n_thinking_rows,
        use_flash=False)


def write_checkpoint(model: nn.Module, config: dict[str, Any],
                     path: str | os.PathLike[str]) -> Path:
    """Write ``model``'s weights and its ``config`` as a tabdpt checkpoint at ``path``."""
    from safetensors.torch import save_file
    path = Path(path)
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    save_file(state, str(path), metadata={"cfg": json.dumps(config)})
    return path


def write_random_checkpoint(path: str | os.PathLike[str], seed: int = 0, **model: Any) -> Path:
    """A random tabdpt checkpoint (:func:`random_model` of :func:`checkpoint_config`) at
    ``path``, for ``TabDPTClassifier(model_weight_path=path)`` and the like."""
    config = checkpoint_config(**model)
    return write_checkpoint(random_model(config, seed), config, path)
