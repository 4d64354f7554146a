"""Scalable softmax on the presence mass: the query scaling of TabPFN v3 and TabICL with the key
count ``n`` replaced by the sources' presence mass.

A scalable softmax multiplies the queries by a learned function of ``log n`` (``n`` the number of
keys) so that attention stays sharp as the context grows. Under OAttention a null source must
change neither the weights nor that scale, so ``n`` becomes the mass ``S_b = Σ_j p_bj`` of each
batch element (``n`` itself when every source is present, up to ``τ/‖h‖²``):

    log_mass(S) = log max(S, 1)                       (computed in fp32)
    query_aware_scaled(q) = q ⊙ base(log S) ⊙ (1 + tanh(query_mlp(q)))
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

__all__ = ["log_mass", "query_aware_scaled"]


def log_mass(mass: Tensor, dtype: torch.dtype) -> Tensor:
    """``log max(S, 1)`` of presence masses ``S`` (any shape), in fp32, cast to ``dtype``."""
    return mass.to(torch.float32).clamp(min=1).log().to(dtype)


def query_aware_scaled(q: Tensor, base: Tensor, query_mlp: Callable[[Tensor], Tensor]) -> Tensor:
    """``q ⊙ (base ⊙ (1 + tanh(query_mlp(q))))``: the query-aware scalable softmax, ``base``
    the length scale ``base_mlp(log S)`` already shaped to broadcast against ``q``."""
    return q * (base * (1 + torch.tanh(query_mlp(q))))
