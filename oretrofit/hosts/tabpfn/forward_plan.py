"""Which forwards ``predict_batched`` runs: the recorded model calls sorted by width and rows
and cut into contiguous groups, each group one padded forward.

* Default: the cut that minimises a cost model measured on the machine. A forward over a
  padded batch costs ``fixed + per_cell · cells``, ``cells = lanes · rows · (width + 1)``
  (:class:`ForwardCosts`, :func:`measured_costs`); a group of one call is that call's own
  forward (no padding), so the chosen cut never costs more than the per-dataset loop's
  forwards by the model.
* ``max_padding``: the user's override: greedy, each group's padded cells at most
  ``max_padding`` times its real ones (``math.inf``: one forward per admissible group).

Either way no group outgrows the memory budget (a call that alone does is refused, naming its
dataset), and no group mixes widths when the retrofit leaves the column sites open
(``pad_width`` False).
"""

from __future__ import annotations

import dataclasses
import statistics
import time
import weakref
from typing import Callable, Sequence

import torch
from torch import nn

from ..._surgery.host import RetrofitError
from .padding import BlockInput, CellAndRowTokens, Extent, Layout, RecordedCall

__all__ = ["ForwardCosts", "measured_costs", "groups", "cells"]

_MAX_GROUP = 256                # calls per forward the cost model's search considers


@dataclasses.dataclass(frozen=True)
class ForwardCosts:
    """Seconds of one forward: ``fixed_s`` plus ``per_cell_s`` per padded cell."""

    fixed_s: float
    per_cell_s: float

    def of(self, extent: Extent) -> float:
        return self.fixed_s + self.per_cell_s * _cells(extent)


def _cells(extent: Extent) -> int:
    return extent.lanes * extent.rows * (extent.width + 1)


def cells(calls: Sequence[RecordedCall]) -> tuple[int, int]:
    """(padded, real) cells of stacking ``calls``: ``lanes·(N+M)·C``, ``Σ B_k·R_k·C_k``."""
    layout = Layout.of(list(calls))
    return (layout.lanes * (layout.n + layout.m) * layout.c,
            sum(c.x.shape[0] * c.x.shape[1] * c.x.shape[2] for c in calls))


_MEASURED: weakref.WeakKeyDictionary[nn.Module, dict[tuple, ForwardCosts]] = \
    weakref.WeakKeyDictionary()


def _synthetic(like: RecordedCall, n_train: int, n_test: int, width: int) -> RecordedCall:
    """A call shaped ``like`` (lanes, dtype, device, targets, options) of other sizes."""
    x = torch.randn(n_train + n_test, like.x.shape[1], width, dtype=like.x.dtype,
                    device=like.x.device)
    y = like.y[torch.arange(n_train, device=like.y.device) % like.n_train]
    return RecordedCall(like.dataset, x, y, dict(like.kwargs, categorical_inds=None),
                        like.autocast)


def measured_costs(model: nn.Module, like: RecordedCall,
                   forward: Callable[[list[RecordedCall]], object], repeats: int = 2
                   ) -> ForwardCosts:
    """The :class:`ForwardCosts` of ``model`` for calls like ``like``: the median seconds of
    ``forward`` over a small (8 + 8 rows, 2 columns) and a larger (96 + 32 rows, 8 columns)
    synthetic call, measured once per model, device, dtype and lanes. A per-cell cost that
    noise makes non-positive counts every second as per-cell (no fixed cost: the cut is the
    loop's)."""
    key = (like.x.device, like.x.dtype, like.x.shape[1], like.autocast)
    known = _MEASURED.setdefault(model, {})
    if key in known:
        return known[key]
    sizes = [(8, 8, 2), (96, 32, 8)]
    seconds = []
    for size in sizes:
        call = _synthetic(like, *size)
        times = []
        for _ in range(repeats + 1):                            # the first one warms up
            start = time.perf_counter()
            forward([call])
            if call.x.device.type == "cuda":
                torch.cuda.synchronize(call.x.device)
            times.append(time.perf_counter() - start)
        seconds.append(statistics.median(times[1:]))
    small, large = (_cells(Extent(like.x.shape[1], n + m, c, 0)) for n, m, c in sizes)
    per_cell = (seconds[1] - seconds[0]) / (large - small)
    costs = (ForwardCosts(max(0.0, seconds[0] - per_cell * small), per_cell) if per_cell > 0
             else ForwardCosts(0.0, seconds[1] / large))
    known[key] = costs
    return costs


def _order(calls: list[RecordedCall]) -> list[int]:
    return sorted(range(len(calls)), key=lambda k: (calls[k].x.shape[2], calls[k].x.shape[0]))


class _Growing:
    """The extent of a group of calls as it grows by one call at a time."""

    def __init__(self) -> None:
        self.lanes = self.n = self.m = self.c = 0

    def add(self, call: RecordedCall) -> Extent:
        self.lanes += call.x.shape[1]
        self.n, self.m = max(self.n, call.n_train), max(self.m, call.n_test)
        self.c = max(self.c, call.x.shape[2])
        return Extent(self.lanes, self.n + self.m, self.c, call.x.element_size())


def groups(model: nn.Module, bounds: CellAndRowTokens | BlockInput, calls: list[RecordedCall],
           *, budget: int, pad_width: bool, max_padding: float | None,
           costs: Callable[[], ForwardCosts]) -> list[list[int]]:
    """The forwards to run, as lists of indices into ``calls`` (see the module doc);
    ``costs`` is asked only when the default cut needs it."""
    order = _order(calls)
    for k in order:
        need = bounds.footprint(model, Layout.of([calls[k]]).extent)
        if need > budget:
            raise RetrofitError(
                f"predict_batched: dataset {calls[k].dataset}: it alone needs about "
                f"{need / 2**30:.2f} GiB, more than the {budget / 2**30:.2f} GiB available "
                "(memory_budget, or the device's free memory); drop it from the call or "
                "pass fewer of its rows")
    if len(calls) == 1:
        return [[0]]

    def admits(first: RecordedCall, extent: Extent, call: RecordedCall) -> bool:
        return (pad_width or call.x.shape[2] == first.x.shape[2]) \
            and bounds.footprint(model, extent) <= budget

    if max_padding is not None:
        return _greedy(calls, order, max_padding, admits)
    return _cheapest(calls, order, costs(), admits)


def _greedy(calls: list[RecordedCall], order: list[int], max_padding: float,
            admits: Callable[[RecordedCall, Extent, RecordedCall], bool]) -> list[list[int]]:
    """Size-sorted calls joined while the group's padded cells stay within ``max_padding``
    times its real cells."""
    cut: list[list[int]] = []
    grown = _Growing()
    for k in order:
        if cut:
            extent = grown.add(calls[k])
            padded, real = cells([calls[j] for j in (*cut[-1], k)])
            if padded <= max_padding * real and admits(calls[cut[-1][0]], extent, calls[k]):
                cut[-1].append(k)
                continue
        cut.append([k])
        grown = _Growing()
        grown.add(calls[k])
    return cut


def _cheapest(calls: list[RecordedCall], order: list[int], costs: ForwardCosts,
              admits: Callable[[RecordedCall, Extent, RecordedCall], bool]
              ) -> list[list[int]]:
    """The contiguous cut of the size-sorted calls of least total cost (dynamic programming
    over where each group starts; groups of at most ``_MAX_GROUP`` calls)."""
    best = [0.0] + [float("inf")] * len(order)
    start = list(range(len(order) + 1))
    for end in range(1, len(order) + 1):
        grown = _Growing()
        last = calls[order[end - 1]]
        for first in range(end - 1, max(-1, end - 1 - _MAX_GROUP), -1):
            extent = grown.add(calls[order[first]])
            if first < end - 1 and not admits(last, extent, calls[order[first]]):
                break
            cost = best[first] + costs.of(extent)
            if cost < best[end]:
                best[end], start[end] = cost, first
    cut, end = [], len(order)
    while end > 0:
        cut.append(order[start[end]:end])
        end = start[end]
    return cut[::-1]
