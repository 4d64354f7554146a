"""Padding made inert in TabICL: where the model creates tokens, and one forward over several
datasets stacked and zero-padded (rows and features), with no attention mask anywhere.

A zero carrier ``h = 0`` has presence 0: an OAttention source of weight exactly 0, a receiver
whose output is 0, an FFN, norm or target-embedding branch gated by 0. So once the padding's
carriers are zero where its tokens are born, no layer lets them reach a real token, provided
every site is patched (``full-o``: under ``oa`` the ungated FFNs, norms and target embeddings
would give a zero token a non-zero state). TabICL creates tokens twice:

* cell tokens: ``col_embedder.in_linear`` of a (grouped) cell; a padded cell reaches it as NaN
  and its token is set to zero. Feature grouping (``feature_group="same"`` rolls each row's
  values across its columns) runs on each dataset's own columns, so padding never enters a
  group.
* row tokens: the row transformer's CLS read-outs (``row_interactor``'s output), made from
  learned CLS tokens even for a padded row; the padded rows' are set to zero.

The target embeddings added to both (``te.col``, ``te.icl``) are gated by those zero carriers.
Padded train rows get label 0, a class every label-encoded dataset has.
"""

from __future__ import annotations

import dataclasses
from typing import Any

import torch
from torch import Tensor, nn

from ..._surgery.host import RetrofitError
from ..._surgery.registry import Retrofit
from ..._surgery.shadow import shadow

__all__ = ["Layout", "padded_forward"]


@dataclasses.dataclass
class Layout:
    """Datasets ``X_k (B_k, N_k + M_k, H_k)`` with ``N_k`` train rows stacked as batch lanes
    ``offsets[k] : offsets[k] + B_k`` of one ``(lanes, N + M, H)`` batch: train rows from row 0,
    test rows from row ``N``, features from column 0."""

    shapes: list[tuple[int, int, int, int]]        # (B_k, N_k, M_k, H_k)
    offsets: list[int]
    lanes: int
    n: int
    m: int
    width: int

    @classmethod
    def of(cls, xs: list[Tensor], ys: list[Tensor]) -> "Layout":
        shapes, offsets, lanes = [], [], 0
        for x, y in zip(xs, ys, strict=True):
            if x.dim() != 3 or y.dim() != 2 or y.shape[0] != x.shape[0] \
                    or y.shape[1] > x.shape[1]:
                raise ValueError(f"padded_forward takes X (B, rows, features) and y_train (B, "
                                 f"train rows) per dataset; got {tuple(x.shape)} and "
                                 f"{tuple(y.shape)}")
            shapes.append((x.shape[0], y.shape[1], x.shape[1] - y.shape[1], x.shape[2]))
            offsets.append(lanes)
            lanes += x.shape[0]
        return cls(shapes, offsets, lanes, max(s[1] for s in shapes),
                   max(s[2] for s in shapes), max(s[3] for s in shapes))

    def parts(self) -> list[tuple[slice, int, int, int]]:
        """Per dataset: its lanes, ``N_k``, ``M_k``, ``H_k``."""
        return [(slice(o, o + b), n, m, h) for o, (b, n, m, h) in zip(self.offsets, self.shapes)]

    def stack(self, xs: list[Tensor], ys: list[Tensor]) -> tuple[Tensor, Tensor]:
        """The padded batch: NaN marks every padded cell; padded train rows get label 0."""
        x = xs[0].new_full((self.lanes, self.n + self.m, self.width), float("nan"))
        y = ys[0].new_zeros(self.lanes, self.n)
        for (lanes, n, m, h), xk, yk in zip(self.parts(), xs, ys):
            x[lanes, :n, :h] = xk[:, :n]
            x[lanes, self.n:self.n + m, :h] = xk[:, n:]
            y[lanes, :n] = yk
        return x, y

    def padded_rows(self, device: torch.device) -> Tensor:
        """``(lanes, N + M)``: True where a row is padding."""
        pad = torch.ones(self.lanes, self.n + self.m, dtype=torch.bool, device=device)
        for lanes, n, m, _ in self.parts():
            pad[lanes, :n] = False
            pad[lanes, self.n:self.n + m] = False
        return pad


def padded_forward(model: nn.Module, xs: list[Tensor], ys: list[Tensor],
                   column_targets: list[Tensor] | None = None, **forward_kwargs: Any
                   ) -> list[Tensor]:
    """``model(X_k, y_k, **forward_kwargs)`` of every dataset ``k``, computed in one forward of
    the datasets stacked and zero-padded: each dataset's test-row outputs ``(B_k, M_k, …)``.

    ``column_targets``: the train targets the column embedder reads, per dataset, where they
    are not ``ys`` (the vendor's ``feature_shuffles`` path embeds every lane with the first
    lane's targets). ``model`` must be retrofitted with every site (``full-o``); it is left as
    it is (the forward runs on a :func:`~oretrofit._surgery.shadow.shadow` of it). Classifier
    datasets must have the same number of classes (the vendor reads them off the first lane).
    """
    _check_full_o(model)
    if forward_kwargs.get("feature_shuffles") is not None:
        raise ValueError("padded_forward: feature_shuffles assume every lane is one table; "
                         "pass the lanes' columns already shuffled (and column_targets)")
    layout = Layout.of(xs, ys)
    x, y = layout.stack(xs, ys)
    col_y = None if column_targets is None else layout.stack(xs, column_targets)[1]
    out = _inert(model, layout, col_y)(x, y, **forward_kwargs)
    return [out[lanes, :m] for lanes, _, m, _ in layout.parts()]


def _check_full_o(model: nn.Module) -> None:
    handle = Retrofit.of(model)
    plan = None if handle is None or handle.reverted else handle.plan
    if plan is None or plan.arm != "full-o" or plan.targets or plan.exclude:
        raise RetrofitError("padding is inert only with every site of the TabICL host patched: "
                            "retrofit the model with arm 'full-o' (no targets, no exclude) first")


def _inert(model: nn.Module, layout: Layout, column_targets: Tensor | None) -> nn.Module:
    """A shadow of ``model`` whose token makers zero the padding's tokens (and whose column
    embedder reads ``column_targets`` when given)."""
    col, row = model.col_embedder, model.row_interactor
    cells = shadow(col.in_linear)
    cells.register_forward_hook(_zero_marked)
    pad_rows = layout.padded_rows(next(model.parameters()).device)

    def grouping_each(x: Tensor) -> Tensor:                              # (lanes, R, H)
        groups = [col.feature_grouping(x[lanes, :, :h]) for lanes, _, _, h in layout.parts()]
        out = x.new_full((layout.lanes, x.shape[1], max(g.shape[2] for g in groups),
                          groups[0].shape[-1]), float("nan"))
        for (lanes, *_), g in zip(layout.parts(), groups):
            out[lanes, :, :g.shape[2]] = g
        return out

    def zero_padded_rows(_module: nn.Module, _args: tuple, tokens: Tensor) -> Tensor:
        return tokens.masked_fill(pad_rows[..., None], 0)                # (lanes, R, C·E)

    rows = shadow(row)
    rows.register_forward_hook(zero_padded_rows)
    columns = shadow(col, {"in_linear": cells}, feature_grouping=grouping_each)
    if column_targets is not None:
        embed = columns.forward                                          # bound to the shadow
        columns.__dict__["forward"] = lambda x, y_train, **kwargs: embed(
            x, y_train=column_targets, **kwargs)
    return shadow(model, {"col_embedder": columns, "row_interactor": rows})


def _zero_marked(_module: nn.Module, args: tuple, output: Tensor) -> Tensor:
    """A cell token whose input holds NaN (a padded cell) is zero."""
    return output.masked_fill(args[0].isnan().any(-1, keepdim=True), 0)
