"""oretrofit.tabicl.Retrofitted over tabicl's estimators: arm, τ and ε are parameters a search
tunes; it predicts as make_classifier / make_regressor with the same settings."""

from __future__ import annotations

import numpy as np
from sklearn.base import clone, is_classifier, is_regressor
from sklearn.model_selection import GridSearchCV
from tabicl import TabICLClassifier, TabICLRegressor

from hosts import TAUS, assert_grid_search_tunes_tau, assert_refusals
from oretrofit.tabicl import Retrofitted, make_classifier, make_regressor

VENDOR = dict(n_estimators=1, device="cpu", allow_auto_download=False)


def _table(seed: int = 0, classes: int = 0):
    rng = np.random.default_rng(seed)
    x = rng.normal(size=(40, 4))
    y = rng.integers(0, classes, 40) if classes else x @ rng.normal(size=4)
    return x[:30], y[:30], x[30:]


def test_parameters_repr_and_type(checkpoints):
    wrapped = Retrofitted(TabICLRegressor(model_path=checkpoints["regressor"], **VENDOR),
                          tau=1e-8)
    assert {"arm", "tau", "eps", "estimator__n_estimators"} <= set(wrapped.get_params())
    assert repr(wrapped).startswith("Retrofitted(estimator=TabICLRegressor(") \
        and len(repr(wrapped)) < 300
    assert is_regressor(wrapped) and not is_classifier(wrapped)
    assert not hasattr(wrapped, "predict_proba")
    classifier = Retrofitted(TabICLClassifier(model_path=checkpoints["classifier"], **VENDOR))
    assert is_classifier(classifier) and hasattr(classifier, "predict_proba")


def test_fit_retrofits_a_copy_and_predicts_as_make_regressor(checkpoints):
    x_train, y_train, x_test = _table()
    regressor = TabICLRegressor(model_path=checkpoints["regressor"], **VENDOR)
    wrapped = Retrofitted(regressor, arm="oa", tau=0.5).fit(x_train, y_train)
    made, _ = make_regressor(checkpoints["regressor"], "oa", 0.5, **VENDOR)
    np.testing.assert_array_equal(wrapped.predict(x_test),
                                  made.fit(x_train, y_train).predict(x_test))
    assert (wrapped.retrofit_.plan.arm, wrapped.retrofit_.plan.tau) == ("oa", 0.5)
    assert not hasattr(regressor, "model_")
    base = Retrofitted(regressor, arm="base").fit(x_train, y_train)
    assert base.retrofit_ is None and type(base.estimator_) is TabICLRegressor
    np.testing.assert_array_equal(base.predict(x_test), clone(regressor).fit(
        x_train, y_train).predict(x_test))


def test_grid_search_tunes_tau(checkpoints):
    x_train, y_train, _ = _table(1)
    regressor = TabICLRegressor(model_path=checkpoints["regressor"], **VENDOR)
    search = GridSearchCV(Retrofitted(regressor), {"tau": TAUS}, cv=2)
    assert_grid_search_tunes_tau(search, x_train, y_train)


def test_classifier(checkpoints):
    x_train, y_train, x_test = _table(2, classes=3)
    wrapped = Retrofitted(TabICLClassifier(model_path=checkpoints["classifier"], **VENDOR),
                          tau=0.5)
    made, _ = make_classifier(checkpoints["classifier"], "full-o", 0.5, **VENDOR)
    np.testing.assert_array_equal(wrapped.fit(x_train, y_train).predict_proba(x_test),
                                  made.fit(x_train, y_train).predict_proba(x_test))
    np.testing.assert_array_equal(wrapped.classes_, np.unique(y_train))


def test_refusals(checkpoints):
    x_train, y_train, _ = _table()
    regressor = TabICLRegressor(model_path=checkpoints["regressor"], **VENDOR)
    assert_refusals(Retrofitted, regressor, x_train, y_train,
                    "tabicl's TabICLClassifier / TabICLRegressor")
