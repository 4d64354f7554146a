"""Padding made inert, per TabPFN architecture: where each one creates tokens, and the one
forward over a zero-padded batch of recorded model calls (:mod:`.batched`) that sets the
padding's carriers to zero there, with no attention mask anywhere.

A zero carrier ``h = 0`` has presence ``p = ‖h‖²/(τ+‖h‖²) = 0``: an OAttention source of
weight exactly 0, a receiver whose output is ``p_i · … = 0``, an FFN/norm/inject branch gated by
0. So once the carriers are zero where the tokens are born, every layer behind that boundary
leaves them zero and never lets them reach a real token, provided the sites that mix tokens are
patched (``sites``; ``width_sites`` when columns are padded too). Each dataset's own
preprocessing (standardisation, feature grouping, ECDF ranks, constant-column removal) runs on
that dataset alone, before the boundary, so padding never enters a statistic.

Two families of boundaries:

* :class:`CellAndRowTokens` (v3, v3.5): tokens are born three times: the cell tokens
  (embedding of a grouped cell, entering the distribution embedder and column aggregation),
  the row tokens (the column aggregator's read-out entering the ICL transformer) and the ICL
  target embedding added to the train rows' tokens. Each is zeroed for the padding, by the
  model's own methods named in the row.
* :class:`BlockInput` (v2, v2.5, v2.6): one boundary, the cell tokens entering the first
  block: ``(B, T + R, G + 1, E)`` = thinking rows, then the rows' feature-group cells and the
  target cell (last column). Every dataset's tokens are made by the model itself, one call
  each, stopped at that boundary; the batched forward's own token grid is then replaced by the
  datasets' grids stacked and zero-padded (padded feature groups before the target column, and
  the thinking rows of a padded column zero too: a learned token at a padded position).
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Iterator, NamedTuple

import torch
from torch import Tensor, nn

from ..._surgery.host import RetrofitError
from ..._surgery.shadow import shadow
from . import releases

__all__ = ["RecordedCall", "Extent", "Layout", "CellAndRowTokens", "BlockInput", "BOUNDARIES",
           "boundaries_of", "shadow"]


@dataclasses.dataclass
class RecordedCall:
    """One recorded model forward of one dataset: ``x (R, B, C)``, ``y (N, B)``."""

    dataset: int
    x: Tensor
    y: Tensor
    kwargs: dict[str, Any]
    autocast: tuple[bool, torch.dtype]

    @property
    def n_train(self) -> int:
        return self.y.shape[0]

    @property
    def n_test(self) -> int:
        return self.x.shape[0] - self.y.shape[0]


class Extent(NamedTuple):
    """The size of a padded batch: ``lanes`` batch lanes of ``rows`` rows (``N + M``) and
    ``width`` columns, at ``element_size`` bytes per value."""

    lanes: int
    rows: int
    width: int
    element_size: int


@dataclasses.dataclass
class Layout:
    """The padded batch: ``N`` train rows, then ``M`` test rows, ``C`` columns; call ``k``
    holds batch lanes ``offsets[k] : offsets[k] + B_k``."""

    calls: list[RecordedCall]
    n: int
    m: int
    c: int
    offsets: list[int]
    lanes: int

    @classmethod
    def of(cls, calls: list[RecordedCall]) -> "Layout":
        offsets, lanes = [], 0
        for call in calls:
            offsets.append(lanes)
            lanes += call.x.shape[1]
        return cls(calls, max(c.n_train for c in calls), max(c.n_test for c in calls),
                   max(c.x.shape[2] for c in calls), offsets, lanes)

    @property
    def extent(self) -> Extent:
        return Extent(self.lanes, self.n + self.m, self.c, self.calls[0].x.element_size())

    def parts(self) -> Iterator[tuple[RecordedCall, slice]]:
        for call, start in zip(self.calls, self.offsets):
            yield call, slice(start, start + call.x.shape[1])

    def rows(self, call: RecordedCall) -> tuple[slice, slice]:
        """The padded row ranges of a call's train and test rows."""
        return slice(0, call.n_train), slice(self.n, self.n + call.n_test)

    def padded_rows(self, device: torch.device) -> Tensor:
        """``(lanes, N + M)``: True where a row is padding."""
        pad = torch.ones(self.lanes, self.n + self.m, dtype=torch.bool, device=device)
        for call, lanes in self.parts():
            for rows in self.rows(call):
                pad[lanes, rows] = False
        return pad


def _method(model: nn.Module, name: str) -> Callable[..., Any]:
    """``model.name``, or a refusal naming the release mismatch (a tabpfn that renamed it)."""
    method = getattr(model, name, None)
    if not callable(method):
        raise RuntimeError(f"predict_batched: this tabpfn's {type(model).__name__} has no "
                           f"{name}, where its tokens are made; the installed release is not "
                           "one predict_batched knows: pip install "
                           f"'tabpfn=={releases.TESTED_RELEASES[-1]}'")
    return method


@dataclasses.dataclass(frozen=True)
class CellAndRowTokens:
    """v3 / v3.5: where the model creates tokens, by attribute name on the model.

    preprocess:  method ``(rows (R, B, C), y, num_train, scaler_cache, *task) -> (cells (B, R,
                 C, G), column target embedding (B, N, E) | None, *rest)``; run on each
                 forward call's own rows, so standardisation and feature grouping see no
                 padding.
    cells:       the cell embedding module; a padded cell reaches it as NaN and its token is
                 set to zero (so row and column chunking need no bookkeeping).
    row_tokens:  method whose output ``[0]`` ``(B, R, …)`` holds the row tokens (CLS
                 read-outs) entering the ICL transformer; padded rows are zeroed in place (a
                 stored carrier, e.g. the ``te.icl`` gate's, is that same tensor).
    row_targets: method ``y (B, N) -> (B, N, D)``: the ICL target embedding added to the train
                 rows' tokens; padded train rows get zero.
    ungrouped:   a preprocessing method that returns the cells *before* feature grouping
                 (v3.5's row-chunked path): grouping would then roll values across padded
                 columns, so chunked inference is switched off and the method refused
                 outside ``preprocess`` (which calls it on one call's own rows).
    sites:       patterns of the sites that must be patched for any padding (attention over
                 padded sources or receivers); ``width_sites``: also for padded columns.
    """

    preprocess: str
    cells: str
    row_tokens: str
    row_targets: str
    sites: tuple[str, ...]
    width_sites: tuple[str, ...]
    ungrouped: str | None = None

    def footprint(self, model: nn.Module, extent: Extent) -> int:
        """A coarse upper estimate (bytes) of a batched forward's activations: the grouped
        cells and their tokens ``lanes·R·C·(G + 2E)`` and the row tokens with the ICL MLP
        ``lanes·R·D·(3 + ff)``, ``D = E·cls``, at the inputs' element size, twice over for
        temporaries."""
        cells = getattr(model, self.cells)
        e, d, ff = int(model.emsize), int(model.icl_emsize), int(model.ff_factor)
        g = int(getattr(cells, "in_features", 0) or cells.input_width)
        rows = extent.lanes * extent.rows
        return 2 * extent.element_size * rows * (extent.width * (g + 2 * e) + d * (3 + ff))

    def forward(self, model: nn.Module, layout: Layout, x: Tensor, y: Tensor,
                kwargs: dict[str, Any]) -> Tensor:
        """``model(x, y, **kwargs)`` with the padding's tokens zeroed where they are born."""
        if self.ungrouped is not None:
            options = kwargs.get("performance_options") or model.get_default_performance_options()
            kwargs = dict(kwargs, performance_options=dataclasses.replace(
                options, use_chunkwise_inference=False))
        return self._inert(model, layout)(x, y, **kwargs)

    def private(self, model: nn.Module) -> nn.Module:
        """A :func:`shadow` of ``model`` for one forward of this thread, the cell embedding
        shadowed too (so hooks put on it for this forward stay on the shadow)."""
        return shadow(model, {self.cells: shadow(getattr(model, self.cells))})

    def _inert(self, model: nn.Module, layout: Layout) -> nn.Module:
        """A :meth:`private` shadow of ``model`` whose token-making methods zero the padding's
        tokens (``model`` itself is left as it is)."""
        proxy = self.private(model)
        preprocess = _method(proxy, self.preprocess)                # bound to the proxy
        row_tokens = _method(proxy, self.row_tokens)
        row_targets = _method(proxy, self.row_targets)
        ungrouped = None if self.ungrouped is None else _method(proxy, self.ungrouped)
        inside = []                                   # non-empty while one call is preprocessed

        def preprocess_each(rows: Tensor, y: Tensor, num_train: int, scaler_cache: Any,
                            *task: Any) -> tuple:
            if scaler_cache is not None or num_train != layout.n \
                    or rows.shape[0] != layout.n + layout.m:
                raise RuntimeError("predict_batched: the batched forward took a path it does "
                                   "not pad (a KV cache, or rows it did not stack)")
            cells = targets = rest = None
            for call, lanes in layout.parts():
                train, test = layout.rows(call)
                width = call.x.shape[2]
                own = torch.cat([rows[train, lanes, :width], rows[test, lanes, :width]])
                inside.append(call)
                try:
                    out = preprocess(own, y[train, lanes], call.n_train, None, *task)
                finally:
                    inside.pop()
                if cells is None:                               # NaN marks a padded cell
                    cells = out[0].new_full((layout.lanes, layout.n + layout.m, layout.c,
                                             out[0].shape[-1]), float("nan"))
                    rest = out[2:]
                cells[lanes, train, :width] = out[0][:, :call.n_train]
                cells[lanes, test, :width] = out[0][:, call.n_train:]
                if out[1] is not None:
                    if targets is None:
                        targets = out[1].new_zeros(layout.lanes, layout.n, out[1].shape[-1])
                    targets[lanes, train] = out[1]
            return (cells, targets, *rest)

        def zero_marked(module: nn.Module, args: tuple, output: Tensor) -> Tensor:
            return output.masked_fill(args[0].isnan().any(-1, keepdim=True), 0)

        pad_rows = layout.padded_rows(layout.calls[0].x.device)

        def row_tokens_zeroed(*args: Any, **kwargs: Any) -> tuple:
            out = row_tokens(*args, **kwargs)
            tokens = out[0]
            tokens.masked_fill_(pad_rows.view(*pad_rows.shape, *[1] * (tokens.dim() - 2)), 0)
            return out

        def row_targets_zeroed(y_BN: Tensor, **kwargs: Any) -> Tensor:
            e = row_targets(y_BN, **kwargs)
            return e.masked_fill(pad_rows[:, :e.shape[1], None], 0)

        def ungrouped_inside(*args: Any, **kwargs: Any) -> Any:
            if not inside:
                raise RuntimeError("predict_batched: the batched forward took the row-chunked "
                                   "path, which would group features after padding")
            return ungrouped(*args, **kwargs)

        getattr(proxy, self.cells).register_forward_hook(zero_marked)
        for name, value in ((self.preprocess, preprocess_each),
                            (self.row_tokens, row_tokens_zeroed),
                            (self.row_targets, row_targets_zeroed),
                            (self.ungrouped, ungrouped_inside)):
            if name is not None:
                proxy.__dict__[name] = value
        return proxy


class _Captured(Exception):
    """Stops a forward at the boundary once its tokens are taken."""


@dataclasses.dataclass(frozen=True)
class BlockInput:
    """v2 / v2.5 / v2.6: the cell tokens entering the first of ``blocks``, called as
    ``block(x or [x], single_eval_pos, …)`` with ``x (B, T + R, G + 1, E)``: ``T`` thinking
    rows, train rows up to ``single_eval_pos``, then test rows; ``G`` feature groups and the
    target cell last."""

    blocks: str
    sites: tuple[str, ...]
    width_sites: tuple[str, ...] = ()

    def footprint(self, model: nn.Module, extent: Extent) -> int:
        """A coarse upper estimate (bytes): the token grid ``lanes·R·(C + 1)·E`` through the
        blocks' attention and MLP (``(4 + ff)·E`` per cell), twice over for temporaries."""
        e = int(model.emsize)
        block = getattr(model, self.blocks)[0]
        ff = int(block.mlp[0].out_features) // e
        rows = extent.lanes * extent.rows
        return 2 * extent.element_size * rows * (extent.width + 1) * e * (4 + ff)

    def forward(self, model: nn.Module, layout: Layout, x: Tensor, y: Tensor,
                kwargs: dict[str, Any]) -> Tensor:
        """``model(x, y, **kwargs)`` with the first block's input replaced by the recorded
        calls' own token grids, stacked and zero-padded."""
        grids = [self._tokens(model, call, kwargs) for call in layout.calls]
        thinking = grids[0][1] - layout.calls[0].n_train
        grid = self._stack(layout, grids, thinking)

        def replace(module: nn.Module, args: tuple, kw: dict) -> tuple[tuple, dict]:
            tokens, eval_pos = _block_input(args)
            if eval_pos != thinking + layout.n or tokens.shape[1] != grid.shape[1]:
                raise RuntimeError("predict_batched: the batched forward's first block saw "
                                   "rows it did not stack")
            new = [grid] if isinstance(args[0], list) else grid
            return (new, *args[1:]), kw

        return self._first_block_hooked(model, replace, with_kwargs=True)(x, y, **kwargs)

    @staticmethod
    def private(model: nn.Module) -> nn.Module:
        """A :func:`shadow` of ``model`` for one forward of this thread."""
        return shadow(model)

    def _first_block_hooked(self, model: nn.Module, hook: Callable[..., Any],
                            **options: Any) -> nn.Module:
        """A :func:`shadow` of ``model`` whose first block runs ``hook`` before anything else
        (``model`` and its blocks are left as they are)."""
        blocks = getattr(model, self.blocks)
        first = shadow(blocks[0])
        first.register_forward_pre_hook(hook, prepend=True, **options)
        return shadow(model, {self.blocks: shadow(blocks, {next(iter(blocks._modules)): first})})

    def _tokens(self, model: nn.Module, call: RecordedCall, kwargs: dict[str, Any]
                ) -> tuple[Tensor, int]:
        """One call's token grid ``(B, T + R, G + 1, E)`` and its ``single_eval_pos``, made
        by the model on that call's inputs alone and taken at the first block."""
        taken: list[tuple[Tensor, int]] = []

        def take(module: nn.Module, args: tuple) -> None:
            tokens, eval_pos = _block_input(args)
            taken.append((tokens.clone(), eval_pos))
            raise _Captured

        try:
            self._first_block_hooked(model, take)(call.x, call.y, **dict(
                kwargs, categorical_inds=call.kwargs.get("categorical_inds")))
        except _Captured:
            pass
        if len(taken) != 1:
            raise RuntimeError("predict_batched: the model's forward never reached its first "
                               "block")
        return taken[0]

    @staticmethod
    def _stack(layout: Layout, grids: list[tuple[Tensor, int]], thinking: int) -> Tensor:
        """``(lanes, T + N + M, C' + 1, E)`` zeros with each call's grid in its lanes: thinking
        rows, train rows from ``T``, test rows from ``T + N``; feature groups from column 0,
        the target cell in the last column; ``C'`` the widest call's feature groups."""
        groups = max(tokens.shape[2] for tokens, _ in grids) - 1
        like = grids[0][0]
        out = like.new_zeros(layout.lanes, thinking + layout.n + layout.m, groups + 1,
                             like.shape[-1])
        for (call, lanes), (tokens, eval_pos) in zip(layout.parts(), grids):
            if eval_pos - call.n_train != thinking:
                raise RuntimeError("predict_batched: the calls' thinking rows differ")
            own = tokens.shape[2] - 1
            train, test = slice(0, eval_pos), slice(thinking + layout.n,
                                                    thinking + layout.n + call.n_test)
            for target, source in ((slice(0, own), slice(0, own)), (-1, -1)):
                out[lanes, train, target] = tokens[:, :eval_pos, source]
                out[lanes, test, target] = tokens[:, eval_pos:, source]
        return out


def _block_input(args: tuple) -> tuple[Tensor, int]:
    """The ``(tokens, single_eval_pos)`` of a block call ``block(x or [x], pos, …)``."""
    tokens = args[0][0] if isinstance(args[0], list) else args[0]
    return tokens, int(args[1])


_V3_SITES = dict(sites=(r"fde\.\d+\.induce[12]", r"icl\.\d+\.attn", r"dec"),
                 width_sites=(r"col\.\d+\.attn", r"col\.cls", r"te\.col"))
_V3_TOKENS = dict(preprocess="_preprocess_and_group", cells="x_embed",
                  row_tokens="_stages_0_to_2", row_targets="_embed_icl_y")
_V2_BLOCKS = BlockInput("blocks", sites=(r"blk\.\d+\.row", r"blk\.\d+\.col"))

BOUNDARIES: dict[str, CellAndRowTokens | BlockInput] = {
    "tabpfn.architectures.tabpfn_v3.TabPFNV3": CellAndRowTokens(**_V3_TOKENS, **_V3_SITES),
    "tabpfn.architectures.tabpfn_v3_5.TabPFNV3p5": CellAndRowTokens(
        **_V3_TOKENS, **_V3_SITES, ungrouped="_preprocess_no_group"),
    "tabpfn.architectures.tabpfn_v2.TabPFNV2": _V2_BLOCKS,
    "tabpfn.architectures.tabpfn_v2_5.TabPFNV2p5": _V2_BLOCKS,
    "tabpfn.architectures.tabpfn_v2_6.TabPFNV2p6": _V2_BLOCKS,
}
"""Per architecture (``module.qualname`` of the unpatched class): its token boundaries."""


def boundaries_of(model: nn.Module) -> CellAndRowTokens | BlockInput:
    """The boundary row of ``model``'s (unpatched) architecture."""
    for cls in type(model).__mro__:
        row = BOUNDARIES.get(f"{cls.__module__}.{cls.__qualname__}")
        if row is not None:
            return row
    raise RetrofitError(f"predict_batched has no token boundaries for {type(model).__name__}; "
                        f"it knows {', '.join(sorted(BOUNDARIES))}")
