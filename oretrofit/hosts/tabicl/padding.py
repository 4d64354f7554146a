"""Padding made inert in TabICL: one forward over several datasets of different sizes, their
rows stacked and zero-padded, with no attention mask.

TabICL turns a table into row tokens before any attention across rows: the column embedder
works column by column (over that column's rows) and the row transformer row by row (over that
row's cells), its CLS read-outs being the row tokens ``R (B, N + M, C·E)``; only the ICL
transformer, over rows, mixes them. :func:`padded_forward` therefore makes each dataset's row
tokens by the model itself at the dataset's own size (:func:`row_tokens`: no padding, and the
vendor's own ``feature_shuffles``), stacks them on the batch axis (train rows from row 0, test
rows from row ``N``, zero where a lane has fewer rows, label 0 there) and runs the ICL stage of
the model's forward once on the stack.

A zero row token has presence 0: an OAttention source of weight exactly 0, a receiver whose
output is 0, an FFN, norm or target-embedding (``te.icl``) branch gated by 0; so under
``full-o`` every ICL layer keeps it zero and it never reaches a real row (under ``oa`` the
ungated FFNs, norms and target embedding would give it a non-zero state).

:func:`row_tokens` leaves out the column embedder's reserved CLS columns (``reserve_cls_tokens``
columns of ``-100`` it embeds before the features): the row transformer overwrites their
embeddings with its learned CLS tokens, so they are never read, and each column is embedded on
its own, so the features' embeddings do not depend on them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from torch import Tensor, nn
from torch.nn import functional as F

from ..._surgery.host import RetrofitError
from ..._surgery.registry import Retrofit
from ..._surgery.shadow import shadow

__all__ = ["Layout", "padded_forward", "row_tokens"]


@dataclasses.dataclass
class Layout:
    """Datasets of ``B_k`` lanes, ``N_k`` train and ``M_k`` test rows stacked as batch lanes
    ``offsets[k] : offsets[k] + B_k`` of one ``(lanes, N + M, …)`` batch: train rows from row 0,
    test rows from row ``N``."""

    shapes: list[tuple[int, int, int]]        # (B_k, N_k, M_k)
    offsets: list[int]
    lanes: int
    n: int
    m: int

    @classmethod
    def of(cls, xs: list[Tensor], ys: list[Tensor]) -> "Layout":
        shapes, offsets, lanes = [], [], 0
        for x, y in zip(xs, ys, strict=True):
            if x.dim() != 3 or y.dim() != 2 or y.shape[0] != x.shape[0] \
                    or y.shape[1] > x.shape[1]:
                raise ValueError(f"padded_forward takes X (B, rows, features) and y_train (B, "
                                 f"train rows) per dataset; got {tuple(x.shape)} and "
                                 f"{tuple(y.shape)}")
            shapes.append((x.shape[0], y.shape[1], x.shape[1] - y.shape[1]))
            offsets.append(lanes)
            lanes += x.shape[0]
        return cls(shapes, offsets, lanes, max(s[1] for s in shapes),
                   max(s[2] for s in shapes))

    def parts(self) -> list[tuple[slice, int, int]]:
        """Per dataset: its lanes, ``N_k``, ``M_k``."""
        return [(slice(o, o + b), n, m) for o, (b, n, m) in zip(self.offsets, self.shapes)]

    def stack(self, tokens: list[Tensor], ys: list[Tensor]) -> tuple[Tensor, Tensor]:
        """The padded batch of the datasets' row tokens ``(B_k, N_k + M_k, D)``, zero where a
        lane has no row, and their train targets, label 0 on padded train rows."""
        x = tokens[0].new_zeros(self.lanes, self.n + self.m, tokens[0].shape[-1])
        y = ys[0].new_zeros(self.lanes, self.n)
        for (lanes, n, m), tk, yk in zip(self.parts(), tokens, ys):
            x[lanes, :n] = tk[:, :n]
            x[lanes, self.n:self.n + m] = tk[:, n:]
            y[lanes, :n] = yk
        return x, y


def row_tokens(model: nn.Module, x: Tensor, y: Tensor, **forward_kwargs: Any) -> Tensor:
    """The row tokens ``(B, N + M, C·E)`` that ``model._inference_forward(x, y,
    **forward_kwargs)`` hands its ICL stage, made by the model's own column embedder (less its
    reserved CLS columns, module docstring) and row transformer."""
    col = model.col_embedder
    reserved = col.reserve_cls_tokens
    columns = shadow(col, reserve_cls_tokens=0)
    embed = columns.forward                                              # bound to the shadow
    columns.__dict__["forward"] = lambda *args, **kwargs: F.pad(         # (B, T, C + G, E)
        embed(*args, **kwargs), (0, 0, reserved, 0))
    icl = shadow(model.icl_predictor, forward=lambda representations, **_: representations)
    return shadow(model, {"col_embedder": columns, "icl_predictor": icl})._inference_forward(
        x, y, **forward_kwargs)


def padded_forward(model: nn.Module, xs: list[Tensor], ys: list[Tensor],
                   feature_shuffles: list[list[list[int]] | None] | None = None,
                   **forward_kwargs: Any) -> list[Tensor]:
    """``model._inference_forward(X_k, y_k, feature_shuffles_k, **forward_kwargs)`` of every
    dataset ``k``, the ICL stage of all of them in one forward of their row tokens stacked and
    zero-padded: each dataset's test-row outputs ``(B_k, M_k, …)``.

    ``feature_shuffles``: per dataset, the vendor's argument (the lanes are one table with its
    columns in these orders), or None. ``model`` must be retrofitted with every site
    (``full-o``); it is left as it is (the forward runs on
    :func:`~oretrofit._surgery.shadow.shadow`\\ s of it). Classifier datasets must have the same
    number of classes (the vendor reads them off the first lane).
    """
    _check_full_o(model)
    if "feature_shuffles" in forward_kwargs:
        raise ValueError("padded_forward takes feature_shuffles per dataset (a list with one "
                         "entry, or None, per dataset)")
    layout = Layout.of(xs, ys)
    shuffles = [None] * len(xs) if feature_shuffles is None else feature_shuffles
    tokens = [row_tokens(model, x, y, feature_shuffles=s, **forward_kwargs)
              for x, y, s in zip(xs, ys, shuffles, strict=True)]
    stacked, y = layout.stack(tokens, ys)
    columns = shadow(model.col_embedder, forward=lambda *_args, **_kwargs: None)
    rows = shadow(model.row_interactor, forward=lambda *_args, **_kwargs: stacked)
    blank = stacked.new_empty(layout.lanes, layout.n + layout.m, 0)     # read by no stage
    out = shadow(model, {"col_embedder": columns, "row_interactor": rows})._inference_forward(
        blank, y, **forward_kwargs)
    return [out[lanes, :m] for lanes, _, m in layout.parts()]


def _check_full_o(model: nn.Module) -> None:
    handle = Retrofit.of(model)
    plan = None if handle is None or handle.reverted else handle.plan
    if plan is None or plan.arm != "full-o" or plan.targets or plan.exclude:
        raise RetrofitError("padding is inert only with every site of the TabICL host patched: "
                            "retrofit the model with arm 'full-o' (no targets, no exclude) first")
