"""``make_classifier`` / ``make_regressor``: the vendor's estimators with every argument passed
through, retrofitted, against the vendor's unpatched estimator over consecutive fits."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from oretrofit import Retrofit, RetrofitError
from oretrofit.tabdpt import make_classifier, make_regressor


def _fit_predict(estimator, fits, predict):
    """Each fit's predictions, torch's generator seeded before each fit (the vendor's PCA of
    more features than the model's width, ``torch.pca_lowrank``, draws from it)."""
    predictions = []
    for x, y, x_test in fits:
        torch.manual_seed(0)
        estimator.fit(x, y)
        predictions.append(predict(estimator, x_test))
    return predictions


@pytest.mark.parametrize("arm", ["oa", "full-o"])
def test_classifier_is_the_vendors_over_two_fits_on_different_data(checkpoint, table, arm):
    from tabdpt import TabDPTClassifier
    fits = [table(20, 5, 3, seed=0), table(31, 11, 6, seed=1)]   # 6 classes > the model's 4
    retrofitted, handle = make_classifier(checkpoint, arm, tau=1e-8)
    vendor = TabDPTClassifier(model_weight_path=str(checkpoint))
    assert isinstance(handle, Retrofit) and handle.model is retrofitted.model

    def predict(estimator, x_test):
        return estimator.predict_proba(x_test)

    ours, theirs = _fit_predict(retrofitted, fits, predict), _fit_predict(vendor, fits, predict)
    assert [o.shape for o in ours] == [(7, 3), (7, 6)]
    assert max(np.abs(o - t).max() for o, t in zip(ours, theirs)) <= 1e-5
    assert not all(np.array_equal(o, t) for o, t in zip(ours, theirs))   # the O path ran


def test_regressor_is_the_vendors_over_two_fits_on_different_data(checkpoint, table):
    from tabdpt import TabDPTRegressor
    fits = [table(18, 4, 0, seed=2), table(25, 12, 0, seed=3)]   # 12 features > the width 8
    retrofitted, _ = make_regressor(checkpoint)
    vendor = TabDPTRegressor(model_weight_path=str(checkpoint))

    def predict(estimator, x_test):
        return estimator.predict(x_test, n_ensembles=2, seed=0)

    ours, theirs = _fit_predict(retrofitted, fits, predict), _fit_predict(vendor, fits, predict)
    assert max(np.abs(o - t).max() for o, t in zip(ours, theirs)) <= 1e-5


def test_vendor_arguments_pass_through_by_name(checkpoint, table):
    """Retrieval context: one batch lane per test row, each with its own nearest context."""
    from tabdpt import TabDPTClassifier
    x, y, x_test = table(30, 5, 3, seed=4)
    kwargs = {"context_reduction": "retrieval", "normalizer": "robust", "verbose": False}
    retrofitted, _ = make_classifier(checkpoint, **kwargs)
    vendor = TabDPTClassifier(model_weight_path=str(checkpoint), **kwargs)
    assert (retrofitted.context_reduction, retrofitted.normalizer) == ("retrieval", "robust")
    ours, theirs = _fit_predict(retrofitted, [(x, y, x_test)], retrieved), _fit_predict(
        vendor, [(x, y, x_test)], retrieved)
    assert np.abs(ours[0] - theirs[0]).max() <= 1e-5


def retrieved(estimator, x_test):
    return estimator.predict_proba(x_test, context_size=9)        # 9 of 30 train rows


def test_the_retrofit_pickles_with_the_estimator(checkpoint, table):
    x, y, x_test = table(20, 5, 3, seed=5)
    estimator, _ = make_classifier(checkpoint)
    estimator.fit(x, y)
    copy = pickle.loads(pickle.dumps(estimator))
    assert Retrofit.of(copy.model) is not None
    assert np.array_equal(copy.predict_proba(x_test), estimator.predict_proba(x_test))


def test_base_is_the_vendors_estimator_unpatched(checkpoint):
    estimator, handle = make_classifier(checkpoint, "base")
    assert handle is None and Retrofit.of(estimator.model) is None


def test_bad_arguments_are_refused_with_the_fix(checkpoint):
    with pytest.raises(RetrofitError, match="unknown arm 'o'"):
        make_regressor(checkpoint, "o")
    with pytest.raises(RetrofitError, match="model_path is tabdpt's model_weight_path"):
        make_classifier(checkpoint, model_weight_path=str(checkpoint))
