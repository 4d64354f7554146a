"""oretrofit.tabpfn.Retrofitted over tabpfn's estimators: arm, τ and ε are parameters a search
tunes; it predicts as make_regressor / make_classifier with the same settings."""

from __future__ import annotations

import numpy as np
import pytest
from sklearn.base import clone, is_classifier, is_regressor
from sklearn.model_selection import GridSearchCV

from hosts import TAUS, assert_grid_search_tunes_tau, assert_refusals
from oretrofit.tabpfn import Retrofitted
from oretrofit.tabpfn import make_classifier, make_regressor

from . import FAST


@pytest.fixture
def regressor(small_ckpt):
    from tabpfn import TabPFNRegressor
    return TabPFNRegressor(model_path=str(small_ckpt), **FAST)


def test_parameters_repr_and_type(regressor, classifier_ckpt):
    from tabpfn import TabPFNClassifier
    wrapped = Retrofitted(regressor, tau=1e-8)
    assert {"arm", "tau", "eps", "estimator__n_estimators"} <= set(wrapped.get_params())
    assert repr(wrapped).startswith("Retrofitted(estimator=TabPFNRegressor(") \
        and len(repr(wrapped)) < 300
    assert is_regressor(wrapped) and not is_classifier(wrapped)
    assert not hasattr(wrapped, "predict_proba")
    classifier = Retrofitted(TabPFNClassifier(model_path=str(classifier_ckpt), **FAST))
    assert is_classifier(classifier) and not is_regressor(classifier)
    assert hasattr(classifier, "predict_proba")


def test_fit_retrofits_a_copy_and_predicts_as_make_regressor(regressor, small_ckpt, table):
    x_train, y_train, x_test = table
    wrapped = Retrofitted(regressor, arm="oa", tau=0.5).fit(x_train, y_train)
    made, _ = make_regressor(small_ckpt, "oa", 0.5, **FAST)
    np.testing.assert_array_equal(wrapped.predict(x_test),
                                  made.fit(x_train, y_train).predict(x_test))
    assert (wrapped.retrofit_.plan.arm, wrapped.retrofit_.plan.tau) == ("oa", 0.5)
    assert regressor.model_path == str(small_ckpt) and not hasattr(regressor, "models_")
    base = Retrofitted(regressor, arm="base").fit(x_train, y_train)
    assert base.retrofit_ is None
    np.testing.assert_array_equal(base.predict(x_test), clone(regressor).fit(
        x_train, y_train).predict(x_test))


def test_grid_search_tunes_tau(regressor, table):
    x_train, y_train, _ = table
    search = GridSearchCV(Retrofitted(regressor), {"tau": TAUS}, cv=2)
    assert_grid_search_tunes_tau(search, x_train, y_train)


def test_classifier(classifier_ckpt, classes):
    from tabpfn import TabPFNClassifier
    x_train, y_train, x_test = classes
    wrapped = Retrofitted(TabPFNClassifier(model_path=str(classifier_ckpt), **FAST), tau=0.5)
    made, _ = make_classifier(classifier_ckpt, "full-o", 0.5, **FAST)
    np.testing.assert_array_equal(wrapped.fit(x_train, y_train).predict_proba(x_test),
                                  made.fit(x_train, y_train).predict_proba(x_test))
    np.testing.assert_array_equal(wrapped.classes_, np.unique(y_train))


def test_refusals(regressor, table):
    assert_refusals(Retrofitted, regressor, *table[:2],
                    "tabpfn's TabPFNRegressor / TabPFNClassifier")
