"""``predict_batched`` / ``predict_proba_batched``: ragged datasets through one padded forward,
equal to a loop of fit and predict."""

from __future__ import annotations

import numpy as np
import pytest
import sklearn
import torch

from oretrofit import RetrofitError
from oretrofit.hosts.mitra import (make_classifier, make_regressor, predict_batched,
                                   predict_proba_batched)

VENDOR = {"device": "cpu", "fine_tune": False, "verbose": False}


def _loop(estimator, datasets, method):
    out = []
    for x, y, x_test in datasets:
        out.append(getattr(sklearn.clone(estimator).fit(x, y), method)(x_test))
    return out


def test_predict_proba_batched_is_the_loop_over_ragged_datasets(checkpoints, table, float32):
    datasets = [table(20, 4, 3, seed=0), table(33, 6, 5, seed=1, test_rows=4),
                table(12, 2, 2, seed=2, test_rows=9)]
    classifier, _ = make_classifier(checkpoints["classification"], n_estimators=2, **VENDOR)
    np.random.seed(0)
    batched = predict_proba_batched(classifier, *zip(*datasets))
    np.random.seed(0)
    loop = _loop(classifier, datasets, "predict_proba")
    assert [b.shape for b in batched] == [(7, 3), (4, 5), (9, 2)]
    assert max(np.abs(b - t).max() for b, t in zip(batched, loop)) <= 1e-5
    assert not hasattr(classifier, "trainers") or classifier.trainers == []   # left unfitted


def test_predict_batched_is_the_loop_for_a_regressor(checkpoints, table, float32):
    datasets = [table(20, 4, 0, seed=3), table(29, 7, 0, seed=4, test_rows=3)]
    regressor, _ = make_regressor(checkpoints["regression"], **VENDOR)
    np.random.seed(0)
    batched = predict_batched(regressor, *zip(*datasets))
    np.random.seed(0)
    loop = _loop(regressor, datasets, "predict")
    assert max(np.abs(b - t).max() for b, t in zip(batched, loop)) <= 1e-5


@pytest.mark.parametrize("arm, kwargs, message", [
    ("oa", {}, "full-o arm"), ("full-o", {"fine_tune": True}, "fine_tune=False")])
def test_what_one_forward_cannot_answer_is_refused(checkpoints, table, arm, kwargs, message):
    classifier, _ = make_classifier(checkpoints["classification"], arm,
                                    **{**VENDOR, **kwargs})
    with pytest.raises(RetrofitError, match=message):
        predict_proba_batched(classifier, *zip(table(20, 4, 3, seed=0)))
