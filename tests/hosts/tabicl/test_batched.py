"""``predict_batched`` / ``predict_proba_batched``: ragged datasets through one retrofitted
estimator, their forwards batched with no mask, equal to the loop of fits and predicts."""

from __future__ import annotations

import copy
import math

import numpy as np
import pytest
import torch

from oretrofit import RetrofitError
from oretrofit.hosts.tabicl.batched import MAX_PADDING, _buckets, _Call
from oretrofit.tabicl import (make_classifier, make_regressor, predict_batched,
                              predict_proba_batched, write_random_checkpoint)

VENDOR = dict(n_estimators=3, device="cpu", allow_auto_download=False)
# (train rows, test rows, features, classes): ragged in every dimension
SHAPES = [(30, 7, 4, 3), (18, 11, 6, 3), (25, 5, 3, 2)]


def _datasets(regression: bool):
    rng = np.random.default_rng(5)
    xs, ys, tests = [], [], []
    for rows, test, features, classes in SHAPES:
        xs.append(rng.normal(size=(rows, features)))
        ys.append(rng.normal(size=rows) if regression else np.arange(rows) % classes)
        tests.append(rng.normal(size=(test, features)))
    return xs, ys, tests


@pytest.fixture(params=[0.0, math.inf], ids=["sizes-apart", "one-forward"])
def max_padding(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> float:
    """The CPU's padding allowance: every size in a forward of its own, or all in one."""
    monkeypatch.setitem(MAX_PADDING, "cpu", request.param)
    return request.param


def _loop(estimator, xs, ys, tests, method, **kwargs):
    return [getattr(copy.copy(estimator).fit(x, y), method)(t, **kwargs)
            for x, y, t in zip(xs, ys, tests)]


@pytest.mark.parametrize("grouping", ["same", False])
def test_predict_proba_batched_equals_the_loop(tmp_path, grouping, max_padding):
    path = write_random_checkpoint(tmp_path / "c.ckpt", "classifier",
                                   col_feature_group=grouping)
    classifier, _ = make_classifier(path, tau=1e-8, **VENDOR)
    xs, ys, tests = _datasets(regression=False)
    batched = predict_proba_batched(classifier, xs, ys, tests)
    loop = _loop(classifier, xs, ys, tests, "predict_proba")
    assert [b.shape for b in batched] == [(t, c) for _, t, _, c in SHAPES]
    assert max(np.abs(b - l).max() for b, l in zip(batched, loop)) < 1e-5
    labels = predict_batched(classifier, xs, ys, tests)
    assert all((a == b).all() for a, b in zip(labels, _loop(classifier, xs, ys, tests,
                                                              "predict")))


def test_predict_batched_of_a_regressor_equals_the_loop(checkpoints, max_padding):
    regressor, _ = make_regressor(checkpoints["regressor"], tau=1e-8, **VENDOR)
    xs, ys, tests = _datasets(regression=True)
    batched = predict_batched(regressor, xs, ys, tests, output_type="median")
    loop = _loop(regressor, xs, ys, tests, "predict", output_type="median")
    assert max(np.abs(b - l).max() for b, l in zip(batched, loop)) < 1e-5


def test_calls_share_a_forward_within_the_padding_allowed():
    def call(lanes: int, train: int, test: int) -> _Call:
        return _Call(torch.zeros(lanes, train + test, 1), torch.zeros(lanes, train), None, {},
                     ())

    calls = [call(4, 10, 5), call(3, 20, 5), call(4, 10, 4), call(4, 10, 5)]
    shapes = lambda buckets: sorted(sorted((c.x.shape[0], c.y.shape[1], c.x.shape[1])
                                           for c in b) for b in buckets)
    assert shapes(_buckets(calls, 0.0)) == [[(3, 20, 25)], [(4, 10, 14)],
                                            [(4, 10, 15), (4, 10, 15)]]
    # 12 lanes × 15 rows padded against 56 + 60 + 60 own rows: within 5 %, not within 2 %
    assert shapes(_buckets(calls, 0.05)) == [[(3, 20, 25)],
                                             [(4, 10, 14), (4, 10, 15), (4, 10, 15)]]
    assert len(_buckets(calls, 0.02)) == 3 and len(_buckets(calls, math.inf)) == 1


def test_an_unpatched_or_cached_estimator_is_refused(checkpoints):
    xs, ys, tests = _datasets(regression=False)
    vendor, _ = make_classifier(checkpoints["classifier"], "base", **VENDOR)
    with pytest.raises(RetrofitError, match="arm 'full-o'"):
        predict_proba_batched(vendor, xs, ys, tests)
    cached, _ = make_classifier(checkpoints["classifier"], kv_cache=True, **VENDOR)
    with pytest.raises(ValueError, match="make the estimator with kv_cache=False"):
        predict_proba_batched(cached, xs, ys, tests)
