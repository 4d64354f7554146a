"""Padding made inert in TabDPT: where the model creates tokens, and one forward over datasets of
different sizes, zero-padded, with no attention mask.

TabDPT's tokens are rows, born at one boundary: ``enc_norm(encoder(x))`` of each row's
features, after the model has standardised the features over the context rows and clipped
outliers (``forward``'s first lines). The features are already zero-padded to the model's
``num_features`` by the vendor (``pad_x``): a zero column stays zero through that preprocessing
and meets only the encoder's weights, so padded features are inert in the host itself. Padded
*rows* are not: a zero row enters the statistics and the encoder's bias makes it a token.

:func:`padded_forward` therefore makes each call's row tokens by the model itself (each batch
lane standardised on its own), stopped at the boundary (a forward hook on ``enc_norm``); stacks
the lanes of every call on the batch axis, context rows first and test rows after, zero where a
lane has fewer rows; and runs the model once with its ``enc_norm`` output replaced by that
stack. A zero token has presence 0: an
OAttention source of weight 0 that changes neither the softmax nor the length scale (which reads
the presence mass), a receiver whose output is 0, and norm/FFN/target branches gated by 0, so
under ``full-o`` every layer keeps it zero and it never reaches a real row. Under ``oa`` it
does not stay zero (``ff_norm``'s bias gives it an FFN output).
"""

from __future__ import annotations

import contextlib
import itertools
import threading
from typing import Callable, Iterator, Sequence

import torch
from torch import Tensor, nn

__all__ = ["padded_forward", "row_tokens", "boundary"]


class _Stop(Exception):
    """Raised by the boundary hook to end a forward once its tokens are made."""

    def __init__(self, tokens: Tensor) -> None:
        super().__init__("stopped at the token boundary")
        self.tokens = tokens


@contextlib.contextmanager
def boundary(model: nn.Module, replace: Callable[[Tensor], Tensor]) -> Iterator[None]:
    """While open, ``model.enc_norm``'s output ``(L, B, D)`` (the row tokens) is
    ``replace(output)`` in the forwards of this thread only (another thread's forward of the same
    model is left as it is)."""
    thread = threading.get_ident()

    def hook(_module: nn.Module, _inputs: object, output: Tensor) -> Tensor:
        return replace(output) if threading.get_ident() == thread else output

    handle = model.enc_norm.register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


def _stop(tokens: Tensor) -> Tensor:
    raise _Stop(tokens)


def row_tokens(model: nn.Module, x: Tensor, y: Tensor, is_cls: bool) -> Tensor:
    """The row tokens ``(N + M, B, D)`` the model makes of ``x (B, N + M, F)``, ``y (B, N)``
    (its own preprocessing over the ``N`` context rows, encoder and ``enc_norm``)."""
    with boundary(model, _stop):
        try:
            model(x, y, is_cls)
        except _Stop as stopped:
            return stopped.tokens
    raise RuntimeError("TabDPT: the forward never reached enc_norm, where the row tokens are "
                       "made; this model is not one the padded forward knows")


def _padded_features(x: Tensor, width: int) -> Tensor:
    if x.shape[-1] > width:
        raise ValueError(f"a call has {x.shape[-1]} features, more than the model's "
                         f"{width}; reduce them first (the estimators' feature_reduction)")
    return torch.nn.functional.pad(x, (0, width - x.shape[-1]))


def padded_forward(model: nn.Module, xs: Sequence[Tensor], ys: Sequence[Tensor],
                   is_cls: bool) -> list[Tensor]:
    """One forward of a ``TabDPTModel`` answering several of its calls on datasets of different
    sizes.

    Args:
        xs: each call's rows ``(B_k, N_k + M_k, F_k)`` as the model takes them (``B_k`` batch
            lanes, the ``N_k`` context rows first, ``F_k ≤ num_features`` features: zero-padded
            to the model's width here).
        ys: each call's context targets ``(B_k, N_k)``.
        is_cls: the model's task flag.
    Returns:
        per call, the model's output for its test rows, ``(M_k, B_k, n_out + bins)``; under
        ``full-o`` equal to ``model(xs[k], ys[k], is_cls)`` (the padding is inert, see the
        module docstring). Each lane keeps its own preprocessing statistics.
    """
    if len(xs) != len(ys) or not xs:
        raise ValueError(f"padded_forward needs one target tensor per call, and at least one "
                         f"call; got {len(xs)} row tensors and {len(ys)} target tensors")
    width = model.num_features
    tokens = [row_tokens(model, _padded_features(x, width), y, is_cls)
              for x, y in zip(xs, ys)]                                  # (N_k + M_k, B_k, D)
    lanes = [0, *itertools.accumulate(len(x) for x in xs)]
    n = max(y.shape[1] for y in ys)
    m = max(x.shape[1] - y.shape[1] for x, y in zip(xs, ys))
    stack = tokens[0].new_zeros(n + m, lanes[-1], tokens[0].shape[-1])
    targets = ys[0].new_zeros(lanes[-1], n)
    for t, y, first, end in zip(tokens, ys, lanes, lanes[1:]):
        n_k = y.shape[1]
        stack[:n_k, first:end], stack[n: n + len(t) - n_k, first:end] = t[:n_k], t[n_k:]
        targets[first:end, :n_k] = y
    blank = stack.new_zeros(lanes[-1], n + m, width)
    with boundary(model, lambda _made: stack):
        out = model(blank, targets, is_cls)                                   # (M, lanes, O)
    return [out[: x.shape[1] - y.shape[1], first:end]
            for x, y, first, end in zip(xs, ys, lanes, lanes[1:])]
