"""``predict_batched`` / ``predict_proba_batched``: ragged datasets in padded forwards, equal to
fitting and predicting each in a loop; calls grouped into forwards by size."""

from __future__ import annotations

import math

import numpy as np
import pytest

from oretrofit import RetrofitError
from oretrofit.hosts.tabdpt import batched
from oretrofit.tabdpt import (make_classifier, make_regressor, predict_batched,
                              predict_proba_batched)


def _loop(estimator, datasets, method, **kwargs):
    predictions = []
    for x, y, x_test in datasets:
        estimator.fit(x, y)
        predictions.append(getattr(estimator, method)(x_test, **kwargs))
    return predictions


def _batched(function, estimator, datasets, **kwargs):
    return function(estimator, *map(list, zip(*datasets)), **kwargs)


def _largest_gap(ours, theirs):
    assert [o.shape for o in ours] == [t.shape for t in theirs]
    return max(np.abs(o - t).max() for o, t in zip(ours, theirs))


def test_predict_proba_batched_is_the_loop_over_ragged_datasets(checkpoint, table, monkeypatch):
    monkeypatch.setattr(batched, "PADDING_ROWS", math.inf)      # every call in one forward
    datasets = [table(20, 5, 3, seed=0), table(9, 3, 2, seed=1, test_rows=4),
                table(26, 7, 6, seed=2)]                           # 6 classes: class digits
    estimator, _ = make_classifier(checkpoint)
    heads = []
    hook = estimator.model.head.register_forward_hook(lambda *_: heads.append(1))
    ours = _batched(predict_proba_batched, estimator, datasets)
    hook.remove()
    assert len(heads) == 1                                        # one forward to the head
    assert not hasattr(estimator, "X_train")                      # left unfitted
    assert _largest_gap(ours, _loop(estimator, datasets, "predict_proba")) <= 1e-5


def test_predict_batched_is_the_loop_for_an_ensembled_regressor(checkpoint, table):
    datasets = [table(15, 4, 0, seed=3), table(24, 6, 0, seed=4, test_rows=3)]
    estimator, _ = make_regressor(checkpoint, verbose=False)
    kwargs = {"n_ensembles": 2, "seed": 0}
    ours = _batched(predict_batched, estimator, datasets, **kwargs)
    assert _largest_gap(ours, _loop(estimator, datasets, "predict", **kwargs)) <= 1e-5


def test_retrieval_lanes_are_answered_by_the_padded_forward(checkpoint, table):
    datasets = [table(30, 5, 3, seed=5), table(18, 4, 3, seed=6, test_rows=2)]
    estimator, _ = make_classifier(checkpoint, context_reduction="retrieval")
    ours = _batched(predict_proba_batched, estimator, datasets, context_size=8)
    theirs = _loop(estimator, datasets, "predict_proba", context_size=8)
    assert _largest_gap(ours, theirs) <= 1e-5


def test_the_padding_would_show_so_other_arms_are_refused(checkpoint, table):
    datasets = [table(10, 3, 2, seed=7)]
    for arm in ("base", "oa"):
        estimator, _ = make_classifier(checkpoint, arm)
        with pytest.raises(RetrofitError, match="needs an estimator retrofitted with the full-o"):
            _batched(predict_proba_batched, estimator, datasets)


def test_an_ensemble_from_fresh_entropy_and_bad_lists_are_refused(checkpoint, table):
    datasets = [table(10, 8, 0, seed=8)]      # 8! feature orders: two draws agree ~never
    estimator, _ = make_regressor(checkpoint, verbose=False)
    with pytest.raises(RetrofitError, match="pass seed=<int>"):
        _batched(predict_batched, estimator, datasets, n_ensembles=2)
    with pytest.raises(RetrofitError, match="got 1, 1 and 0"):
        predict_batched(estimator, [datasets[0][0]], [datasets[0][1]], [])
    with pytest.raises(RetrofitError, match="needs a classifier"):
        _batched(predict_proba_batched, estimator, datasets)


def test_calls_of_one_size_share_a_forward_and_padding_stays_within_the_budget():
    """(lanes, context rows, test rows) per call: the ensemble of four calls of one size is one
    group; a call padded past the budget starts its own; an infinite budget is one forward."""
    sizes = [(1, 40, 10), (1, 200, 60), (1, 40, 10), (2, 44, 10), (1, 40, 10), (1, 40, 10)]
    assert batched.size_groups(sizes, 0) == [[0, 2, 4, 5], [3], [1]]
    assert batched.size_groups(sizes, 16) == [[0, 2, 4, 5, 3], [1]]     # 6·54 − 308 = 16
    assert batched.size_groups(sizes, 15) == [[0, 2, 4, 5], [3], [1]]
    assert batched.size_groups(sizes, math.inf) == [[0, 2, 4, 5, 3, 1]]
    assert batched.size_groups([], 64) == []


def test_datasets_far_apart_in_size_are_answered_by_forwards_of_their_own(checkpoint, table):
    datasets = [table(120, 4, 3, seed=9), table(8, 4, 3, seed=10, test_rows=3)]
    # one forward would pad 2·127 − 138 = 116 rows, past PADDING_ROWS
    estimator, _ = make_classifier(checkpoint)
    heads = []
    hook = estimator.model.head.register_forward_hook(lambda *_: heads.append(1))
    ours = _batched(predict_proba_batched, estimator, datasets)
    hook.remove()
    assert len(heads) == 2
    assert _largest_gap(ours, _loop(estimator, datasets, "predict_proba")) <= 1e-5
