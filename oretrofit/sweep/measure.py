"""Small measurement helpers shared by the sweep's checks (and the tests)."""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["linf", "insert_zero_rows"]


def linf(a: Tensor, b: Tensor | None = None) -> float:
    """L∞ norm of ``a`` (or of ``a − b``) in fp64; 0 for an empty tensor."""
    diff = a.double().cpu() if b is None else a.double().cpu() - b.double().cpu()
    return float(diff.abs().max()) if diff.numel() else 0.0


def insert_zero_rows(h: Tensor, positions: list[int]) -> Tensor:
    """Insert exact-zero tokens along axis 1 so that they sit at ``positions`` of the result."""
    for pos in sorted(positions):
        h = torch.cat([h[:, :pos], torch.zeros_like(h[:, :1]), h[:, pos:]], dim=1)
    return h
