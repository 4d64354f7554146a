"""oretrofit.tabdpt.Retrofitted over tabdpt's estimators: arm, τ and ε are parameters a search
tunes; it predicts as make_classifier / make_regressor with the same settings."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.base import clone, is_classifier, is_regressor
from sklearn.model_selection import GridSearchCV

from hosts import TAUS, assert_grid_search_tunes_tau, assert_refusals
from oretrofit import Retrofit
from oretrofit.tabdpt import Retrofitted, make_classifier, make_regressor


@pytest.fixture
def regressor(checkpoint):
    from tabdpt import TabDPTRegressor
    return TabDPTRegressor(model_weight_path=str(checkpoint))


def _predict(estimator, x_train, y_train, x_test, output="predict"):
    """Fit (tabdpt's fit returns None), then predict, torch's generator seeded as in
    test_estimators."""
    torch.manual_seed(0)
    estimator.fit(x_train, y_train)
    return getattr(estimator, output)(x_test, seed=0)


def test_parameters_repr_and_type(regressor, checkpoint):
    from tabdpt import TabDPTClassifier
    wrapped = Retrofitted(regressor, tau=1e-8)
    assert {"arm", "tau", "eps", "estimator__model_weight_path"} <= set(wrapped.get_params())
    assert repr(wrapped).startswith("Retrofitted(estimator=TabDPTRegressor(") \
        and len(repr(wrapped)) < 300
    # tabdpt 1.3.1's own estimators tag no estimator type (BaseEstimator precedes their
    # RegressorMixin / ClassifierMixin), and Retrofitted reports the wrapped estimator's tags
    assert (is_regressor(wrapped), is_classifier(wrapped)) == (is_regressor(regressor),
                                                               is_classifier(regressor))
    assert not hasattr(wrapped, "predict_proba")
    vendor = TabDPTClassifier(model_weight_path=str(checkpoint))
    classifier = Retrofitted(vendor)
    assert is_classifier(classifier) == is_classifier(vendor) and hasattr(classifier,
                                                                         "predict_proba")


def test_fit_retrofits_a_copy_and_predicts_as_make_regressor(regressor, checkpoint, table):
    x_train, y_train, x_test = table(24, 5, 0, seed=0)
    wrapped = Retrofitted(regressor, arm="oa", tau=0.5)
    made, _ = make_regressor(checkpoint, "oa", 0.5)
    np.testing.assert_array_equal(_predict(wrapped, x_train, y_train, x_test),
                                  _predict(made, x_train, y_train, x_test))
    assert (wrapped.retrofit_.plan.arm, wrapped.retrofit_.plan.tau) == ("oa", 0.5)
    assert wrapped.retrofit_.model is wrapped.estimator_.model is not regressor.model
    assert Retrofit.of(regressor.model) is None                   # the wrapped one untouched
    base = Retrofitted(regressor, arm="base")
    np.testing.assert_array_equal(_predict(base, x_train, y_train, x_test),
                                  _predict(clone(regressor), x_train, y_train, x_test))
    assert base.retrofit_ is None


def test_grid_search_tunes_tau(regressor, table):
    x_train, y_train, _ = table(40, 5, 0, seed=1)
    search = GridSearchCV(Retrofitted(regressor), {"tau": TAUS}, cv=2)
    torch.manual_seed(0)
    assert_grid_search_tunes_tau(search, x_train, y_train)


def test_classifier(checkpoint, table):
    from tabdpt import TabDPTClassifier
    x_train, y_train, x_test = table(24, 5, 3, seed=2)
    wrapped = Retrofitted(TabDPTClassifier(model_weight_path=str(checkpoint)), tau=0.5)
    made, _ = make_classifier(checkpoint, "full-o", 0.5)
    np.testing.assert_array_equal(_predict(wrapped, x_train, y_train, x_test, "predict_proba"),
                                  _predict(made, x_train, y_train, x_test, "predict_proba"))
    assert hasattr(wrapped, "classes_") == hasattr(made, "classes_")   # tabdpt 1.3.1 sets none


def test_refusals(regressor, table):
    assert_refusals(Retrofitted, regressor, *table(24, 5, 0, seed=0)[:2],
                    "tabdpt's TabDPTClassifier / TabDPTRegressor")
