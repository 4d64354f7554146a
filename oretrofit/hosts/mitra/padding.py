"""Padding made inert in Mitra: where the model creates tokens, and one forward over datasets of
different sizes, zero-padded, with no mask.

Mitra's tokens are cells ``(b, s, f + 1, d)``, born at one boundary: the label token of each
row (the support row's label embedding, a query row's mask token) packed before the row's
feature tokens (``x_embedding`` of values the model has quantile-normalised over the support
rows), which is what its first layer receives. The vendor's own padding masks act only in that
preprocessing and on its flash-attn path; on the dense path a padded row or feature is a token
like any other (the embedding's bias makes it one), and changes the real cells' outputs.

:func:`padded_forward` therefore makes each call's cells by the model itself (its own
preprocessing, per call), stopped at the boundary (a pre-hook on a shadow of the first layer);
stacks the cells of every call on the batch axis, zero where a call has fewer rows or features;
and runs the model once with its first layer's input replaced by that stack. A zero cell has
presence 0: an OAttention source of weight 0 across rows and across features, a receiver whose
output is 0, and norm/FFN branches gated by 0, so under ``full-o`` every layer keeps it zero
and it never reaches a real cell.
"""

from __future__ import annotations

from typing import Callable, Sequence

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from ..._surgery.shadow import shadow

__all__ = ["padded_forward", "cells", "at_boundary"]


class _Stop(Exception):
    """Raised by the boundary hook to end a forward once its cells are made."""

    def __init__(self, made: tuple[Tensor, Tensor]) -> None:
        super().__init__("stopped at the token boundary")
        self.made = made


def at_boundary(model: nn.Module, replace: Callable[[Tensor, Tensor], tuple[Tensor, Tensor]]
                ) -> nn.Module:
    """A shadow of ``model`` whose first layer receives ``replace(support, query)`` instead of
    the cells ``(b, s, f + 1, d)`` the model made (``model`` itself is left as it is)."""
    first = shadow(model.layers[0])

    def hook(_module: nn.Module, args: tuple) -> tuple:
        return (*replace(args[0], args[1]), *args[2:])

    first.register_forward_pre_hook(hook)
    return shadow(model, children={"layers": nn.ModuleList([first, *model.layers[1:]])})


def _stop(support: Tensor, query: Tensor) -> tuple[Tensor, Tensor]:
    raise _Stop((support, query))


def cells(model: nn.Module, inputs: Sequence[Tensor]) -> tuple[Tensor, Tensor]:
    """The support and query cells ``(b, s, f + 1, d)``, ``(b, q, f + 1, d)`` the model makes of
    its six ``inputs`` (its own preprocessing, label and feature embeddings)."""
    try:
        at_boundary(model, _stop)(*(t.clone() for t in inputs))
    except _Stop as stopped:
        return stopped.made
    raise RuntimeError("Mitra: the forward never reached its first layer, where the cells are "
                       "made; this model is not one the padded forward knows")


def _padded(t: Tensor, rows: int, width: int) -> Tensor:
    return F.pad(t, (0, 0, 0, width - t.shape[2], 0, rows - t.shape[1]))


def padded_forward(model: nn.Module, calls: Sequence[Sequence[Tensor]]) -> list[Tensor]:
    """One forward of a ``Tab2D`` answering several of its calls on datasets of different sizes.

    Args:
        calls: each call's six inputs as the model takes them (``x_support (b_k, s_k, f_k)``,
            ``y_support``, ``x_query (b_k, q_k, f_k)`` and the three padding masks).
    Returns:
        per call, the model's output ``(b_k, q_k, …)``; under ``full-o`` equal to
        ``model(*calls[k])`` (the padding is inert, see the module docstring). Each call keeps
        its own preprocessing statistics.
    """
    if not calls:
        raise ValueError("padded_forward needs at least one call")
    made = [cells(model, call) for call in calls]
    s, q, width = (max(c[i].shape[j] for c in made) for i, j in ((0, 1), (1, 1), (0, 2)))
    support = torch.cat([_padded(c[0], s, width) for c in made])
    query = torch.cat([_padded(c[1], q, width) for c in made])
    b, f = len(support), width - 1
    x_support, x_query = support.new_zeros(b, s, f), support.new_zeros(b, q, f)
    blank = (x_support, calls[0][1].new_zeros(b, s), x_query,
             *(torch.zeros(b, n, dtype=torch.bool) for n in (f, s, q)))
    out = at_boundary(model, lambda _s, _q: (support, query))(*blank)
    lanes = [0]
    for call in calls:
        lanes.append(lanes[-1] + call[0].shape[0])
    return [out[first:end, : call[2].shape[1]]
            for call, first, end in zip(calls, lanes, lanes[1:])]
