"""oretrofit.mitra.Retrofitted (``oretrofit.hosts.mitra``) over autogluon's Mitra estimators:
arm, τ and ε are parameters a search tunes; it predicts as make_classifier / make_regressor with
the same settings, and survives clone and pickle."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch
from sklearn.base import clone, is_classifier, is_regressor
from sklearn.model_selection import GridSearchCV

from hosts import TAUS, assert_grid_search_tunes_tau, assert_refusals
from oretrofit import Retrofit
from oretrofit.hosts.mitra import Retrofitted, make_classifier, make_regressor

VENDOR = {"device": "cpu", "fine_tune": False, "verbose": False}


@pytest.fixture
def regressor(checkpoints):
    from autogluon.tabular.models.mitra.sklearn_interface import MitraRegressor
    return MitraRegressor(hf_model=str(checkpoints["regression"]), **VENDOR)


def _predict(estimator, x_train, y_train, x_test, output="predict"):
    """Fit, then predict, numpy's and torch's generators seeded before the fit (the vendor's
    data loaders and preprocessing draw from them)."""
    np.random.seed(0)
    torch.manual_seed(0)
    return getattr(estimator.fit(x_train, y_train), output)(x_test)


def _kind(estimator) -> tuple[bool, bool, bool]:
    return is_regressor(estimator), is_classifier(estimator), hasattr(estimator, "predict_proba")


def test_parameters_repr_and_type(regressor, checkpoints):
    from autogluon.tabular.models.mitra.sklearn_interface import MitraClassifier
    wrapped = Retrofitted(regressor, tau=1e-8)
    assert {"arm", "tau", "eps", "estimator__hf_model", "estimator__n_estimators"} <= set(
        wrapped.get_params())
    assert repr(wrapped).startswith("Retrofitted(estimator=MitraRegressor(") \
        and len(repr(wrapped)) < 300
    # autogluon 1.6.3's estimators tag no estimator type (BaseEstimator precedes their
    # RegressorMixin), and Retrofitted reports the wrapped estimator's tags
    classifier = MitraClassifier(hf_model=str(checkpoints["classification"]), **VENDOR)
    assert [_kind(regressor), _kind(classifier)] == [(False, False, False), (False, False, True)]
    assert [_kind(wrapped), _kind(Retrofitted(classifier))] == [_kind(regressor),
                                                                _kind(classifier)]


def test_fit_retrofits_a_copy_and_predicts_as_make_regressor(regressor, checkpoints, table):
    from autogluon.tabular.models.mitra.sklearn_interface import MitraRegressor
    x_train, y_train, x_test = table(20, 4, 0, seed=0)
    wrapped = Retrofitted(regressor, arm="oa", tau=0.5)
    made, _ = make_regressor(checkpoints["regression"], "oa", 0.5, **VENDOR)
    np.testing.assert_array_equal(_predict(wrapped, x_train, y_train, x_test),
                                  _predict(made, x_train, y_train, x_test))
    assert (wrapped.retrofit_.plan.arm, wrapped.retrofit_.plan.tau) == ("oa", 0.5)
    assert all((Retrofit.of(t.model).plan.arm, Retrofit.of(t.model).plan.tau) == ("oa", 0.5)
               for t in wrapped.estimator_.trainers)
    assert regressor.trainers == []                               # the wrapped one unfitted
    base = Retrofitted(regressor, arm="base")
    np.testing.assert_array_equal(_predict(base, x_train, y_train, x_test),
                                  _predict(clone(regressor), x_train, y_train, x_test))
    assert base.retrofit_ is None and type(base.estimator_) is MitraRegressor


def test_grid_search_tunes_tau(regressor, table):
    x_train, y_train, _ = table(24, 4, 0, seed=1)
    search = GridSearchCV(Retrofitted(regressor), {"tau": TAUS}, cv=2)
    np.random.seed(0)
    torch.manual_seed(0)
    assert_grid_search_tunes_tau(search, x_train, y_train)


def test_classifier_clone_and_pickle(checkpoints, table):
    from autogluon.tabular.models.mitra.sklearn_interface import MitraClassifier
    x_train, y_train, x_test = table(20, 4, 3, seed=2)
    wrapped = Retrofitted(MitraClassifier(hf_model=str(checkpoints["classification"]), **VENDOR),
                          tau=0.5)
    made, _ = make_classifier(checkpoints["classification"], "full-o", 0.5, **VENDOR)
    expected = _predict(made, x_train, y_train, x_test, "predict_proba")
    np.testing.assert_array_equal(_predict(wrapped, x_train, y_train, x_test, "predict_proba"),
                                  expected)
    assert hasattr(wrapped, "classes_") == hasattr(made, "classes_")   # autogluon 1.6.3 sets none
    cloned = clone(wrapped)
    assert (cloned.arm, cloned.tau, cloned.eps) == ("full-o", 0.5, None)
    np.testing.assert_array_equal(_predict(cloned, x_train, y_train, x_test, "predict_proba"),
                                  expected)
    blob = pickle.dumps(wrapped)                 # the vendor's predict advances its generator:
    expected = wrapped.predict_proba(x_test)     # the next prediction is the pickled one's
    loaded = pickle.loads(blob)
    assert type(loaded) is Retrofitted and Retrofit.of(loaded.estimator_.trainers[0].model)
    np.testing.assert_array_equal(loaded.predict_proba(x_test), expected)


def test_refusals(regressor, table):
    assert_refusals(Retrofitted, regressor, *table(20, 4, 0, seed=0)[:2],
                    "autogluon's MitraClassifier / MitraRegressor")
