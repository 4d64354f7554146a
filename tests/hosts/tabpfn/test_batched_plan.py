"""The forwards predict_batched chooses (:mod:`oretrofit.hosts.tabpfn.forward_plan`): the
cost model's cut never costs more than one forward per call, merges where the fixed cost
dominates, keeps apart what padding would make dear, fits the memory budget and never mixes
widths the retrofit cannot pad; the costs are measured from two forwards."""

from __future__ import annotations

import itertools
import time

import numpy as np
import pytest
import torch

from oretrofit import RetrofitError
from oretrofit.hosts.tabpfn import forward_plan
from oretrofit.hosts.tabpfn.forward_plan import ForwardCosts
from oretrofit.hosts.tabpfn.padding import Extent, Layout, RecordedCall


class _Cells:
    """Bounds whose footprint is the padded batch's cell count (bytes, say)."""

    @staticmethod
    def footprint(model: object, extent: Extent) -> int:
        return extent.lanes * extent.rows * extent.width


def _calls(shapes: list[tuple[int, int, int]]) -> list[RecordedCall]:
    """One call per ``(train rows, test rows, width)``, two lanes each."""
    return [RecordedCall(k, torch.zeros(n + m, 2, c), torch.zeros(n, 2), {}, (False, None))
            for k, (n, m, c) in enumerate(shapes)]


def _cost(calls: list[RecordedCall], cut: list[list[int]], costs: ForwardCosts) -> float:
    return sum(costs.of(Layout.of([calls[k] for k in group]).extent) for group in cut)


def _plan(calls, costs=None, budget=10**12, pad_width=True, max_padding=None):
    return forward_plan.groups(None, _Cells(), calls, budget=budget, pad_width=pad_width,
                               max_padding=max_padding, costs=lambda: costs)


SHAPES = [(int(n), int(m), int(c)) for n, m, c in
          np.random.default_rng(0).integers([50, 10, 2], [501, 101, 31], size=(40, 3))]


@pytest.mark.parametrize("fixed, per_cell", [(0.02, 3e-6), (0.05, 3e-5), (1.0, 1e-9),
                                             (0.0, 1e-6)])
def test_the_cut_never_costs_more_than_the_loop(fixed, per_cell):
    calls, costs = _calls(SHAPES), ForwardCosts(fixed, per_cell)
    cut = _plan(calls, costs)
    assert sorted(itertools.chain(*cut)) == list(range(len(calls)))
    loop = _cost(calls, [[k] for k in range(len(calls))], costs)
    assert _cost(calls, cut, costs) <= loop * (1 + 1e-12)
    if fixed == 0:                                    # nothing to save: the loop's forwards
        assert all(len(group) == 1 for group in cut)
    if fixed == 1.0:                                  # fixed cost dominates: few forwards
        assert len(cut) <= 2


def test_equal_calls_merge_and_far_ones_stay_apart():
    costs = ForwardCosts(0.05, 1e-6)
    calls = _calls([(100, 20, 5)] * 4 + [(4000, 500, 30)])
    cut = _plan(calls, costs)
    assert sorted(map(sorted, cut)) == [[0, 1, 2, 3], [4]]


def test_memory_cuts_groups_and_one_call_too_big_is_named():
    calls = _calls([(100, 20, 5)] * 4)
    alone = Layout.of(calls[:1]).extent
    budget = 2 * _Cells.footprint(None, alone)        # two calls fit together, not three
    for cut in (_plan(calls, ForwardCosts(1.0, 0.0), budget=budget),
                _plan(calls, budget=budget, max_padding=float("inf"))):
        assert sorted(len(group) for group in cut) == [2, 2]
    with pytest.raises(RetrofitError, match="dataset 2: it alone needs"):
        _plan(_calls([(10, 2, 2), (10, 2, 2), (900, 20, 5)]), ForwardCosts(1.0, 0.0),
              budget=budget)


def test_widths_stay_apart_where_columns_cannot_be_padded():
    calls = _calls([(100, 20, 5), (100, 20, 6), (90, 20, 5), (80, 10, 6)])
    for cut in (_plan(calls, ForwardCosts(1.0, 0.0), pad_width=False),
                _plan(calls, pad_width=False, max_padding=float("inf"))):
        assert sorted(map(sorted, cut)) == [[0, 2], [1, 3]]
    assert len(_plan(calls, ForwardCosts(1.0, 0.0))) == 1


def test_costs_are_measured_from_a_small_and_a_larger_forward():
    """A forward taking ``fixed + per_cell · cells`` seconds gives back about those costs;
    a per-cell cost that noise makes non-positive makes every second per-cell."""
    like = _calls([(50, 10, 3)])[0]

    def sleeping(fixed: float, per_cell: float):
        def forward(calls: list[RecordedCall]) -> None:
            extent = Layout.of(calls).extent
            time.sleep(fixed + per_cell * extent.lanes * extent.rows * (extent.width + 1))
        return forward

    costs = forward_plan.measured_costs(torch.nn.Linear(1, 1), like, sleeping(0.02, 1e-5))
    assert costs.fixed_s == pytest.approx(0.02, rel=0.5)
    assert costs.per_cell_s == pytest.approx(1e-5, rel=0.5)

    def larger_faster(calls: list[RecordedCall]) -> None:            # noise, say
        time.sleep(0.03 if calls[0].x.shape[0] < 50 else 0.01)

    flat = forward_plan.measured_costs(torch.nn.Linear(1, 1), like, larger_faster)
    assert flat.fixed_s == 0.0
    assert flat.of(Extent(2, 128, 8, 4)) == pytest.approx(0.01, rel=0.5)
