"""One training loop and one set of metrics for every study.

AdamW on cross-entropy (classification) or MSE on the train-standardised target (regression),
mini-batches drawn by a generator seeded with the run's seed (so matched arms see the same
batches), and the epoch with the lowest validation loss restored before testing.
"""

from __future__ import annotations

import copy
import time
from dataclasses import asdict, dataclass
from typing import Callable

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .data import Split

__all__ = ["TrainConfig", "fit", "predict", "task_loss", "metrics", "primary_metric"]

Forward = Callable[[Tensor], Tensor]


@dataclass(frozen=True)
class TrainConfig:
    """Optimiser and budget shared by all arms of a study (B.6: 100 epochs, lr 1e-3, wd 1e-4)."""

    epochs: int = 100
    lr: float = 1e-3
    weight_decay: float = 1e-4
    batch_size: int = 64

    def as_dict(self) -> dict:
        return {**asdict(self), "optimizer": "AdamW",
                "selection": "epoch with the lowest validation loss"}


def task_loss(split: Split, out: Tensor, y: Tensor) -> Tensor:
    """Cross-entropy on logits ``(B, C)`` or MSE on the standardised target ``(B, 1)``."""
    if split.task.kind == "classification":
        return F.cross_entropy(out, y)
    return F.mse_loss(out[:, 0], y)


@torch.no_grad()
def predict(forward: Forward, x: Tensor, batch_size: int = 512) -> Tensor:
    """Model outputs for ``x`` ``(N, F)`` in evaluation batches -> ``(N, n_outputs)``."""
    return torch.cat([forward(x[i:i + batch_size]) for i in range(0, len(x), batch_size)])


def fit(model: nn.Module, split: Split, config: TrainConfig,
        forward: Forward | None = None) -> dict:
    """Train ``model`` in place on ``split``; returns epochs run, best epoch, losses and time.

    ``forward`` maps a feature batch to outputs (defaults to ``model``); a study passes e.g.
    ``lambda x: model(x, n_zero=k)``.
    """
    forward = model if forward is None else forward
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, foreach=True,
                                  weight_decay=config.weight_decay)
    batches = torch.Generator().manual_seed(split.seed)
    n = len(split.y_train)
    best = (float("inf"), -1, copy.deepcopy(model.state_dict()))
    start = time.perf_counter()
    train_loss = float("nan")
    for epoch in range(config.epochs):
        model.train()
        order = torch.randperm(n, generator=batches)
        total = 0.0
        for i in range(0, n, config.batch_size):
            rows = order[i:i + config.batch_size]
            loss = task_loss(split, forward(split.x_train[rows]), split.y_train[rows])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            optimizer.step()
            total += float(loss.detach()) * len(rows)
        train_loss = total / n
        model.eval()
        val_loss = float(task_loss(split, predict(forward, split.x_val), split.y_val))
        if val_loss < best[0]:
            best = (val_loss, epoch, copy.deepcopy(model.state_dict()))
    model.load_state_dict(best[2])
    model.eval()
    return {"epochs": config.epochs, "best_epoch": best[1] + 1, "best_val_loss": best[0],
            "last_train_loss": train_loss, "train_wall_s": time.perf_counter() - start}


def metrics(split: Split, out: Tensor, y: Tensor) -> dict[str, float]:
    """Accuracy, balanced accuracy, cross-entropy; or RMSE and MAE in original target units."""
    if split.task.kind == "classification":
        pred = out.argmax(dim=-1)
        recalls = [float((pred[y == c] == c).float().mean()) for c in torch.unique(y)]
        return {"accuracy": float((pred == y).float().mean()),
                "balanced_accuracy": sum(recalls) / len(recalls),
                "cross_entropy": float(F.cross_entropy(out, y))}
    err = (out[:, 0].double() - y.double()) * split.target_scale
    return {"rmse": float(err.square().mean().sqrt()), "mae": float(err.abs().mean())}


def primary_metric(kind: str) -> str:
    """The metric a paper table reports for a task kind."""
    return "accuracy" if kind == "classification" else "rmse"
