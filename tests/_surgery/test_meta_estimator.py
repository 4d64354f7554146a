"""The shared Retrofitted: a family plugs in with for_family (vendor_module, wraps,
retrofit_estimator), here sklearn's own linear models; the base class itself, naming no family,
refuses every estimator."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from sklearn.base import clone, is_regressor
from sklearn.linear_model import Ridge
from sklearn.model_selection import GridSearchCV

from oretrofit import RetrofitError
from oretrofit._surgery import meta_estimator

CALLS: list[tuple] = []


def _record(estimator, arm, tau, eps):
    CALLS.append((type(estimator).__name__, arm, tau, eps))
    return estimator, None


Retrofitted = meta_estimator.for_family(__name__, "sklearn", "sklearn's linear models", _record)


def _data():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(20, 3))
    return x, x @ np.array([1.0, -2.0, 0.5])


def test_a_family_gets_a_clone_and_the_settings():
    x, y = _data()
    ridge = Ridge(alpha=0.5)
    CALLS.clear()
    wrapped = Retrofitted(ridge, arm="oa", tau=0.25).fit(x, y)
    assert CALLS == [("Ridge", "oa", 0.25, None)]
    assert wrapped.estimator_ is not ridge and not hasattr(ridge, "coef_")
    np.testing.assert_array_equal(wrapped.predict(x), clone(ridge).fit(x, y).predict(x))
    assert is_regressor(wrapped) and isinstance(wrapped, meta_estimator.Retrofitted)
    assert repr(wrapped) == "Retrofitted(arm='oa', estimator=Ridge(alpha=0.5), tau=0.25)"
    np.testing.assert_array_equal(pickle.loads(pickle.dumps(wrapped)).predict(x),
                                  wrapped.predict(x))
    search = GridSearchCV(Retrofitted(ridge), {"estimator__alpha": [0.1, 10.0]}, cv=2)
    assert search.fit(x, y).best_params_ == {"estimator__alpha": 0.1}


def test_refusals():
    x, y = _data()
    with pytest.raises(RetrofitError, match="unknown arm 'o'"):
        Retrofitted(Ridge(), arm="o").fit(x, y)
    with pytest.raises(RetrofitError, match="arm 'base' patches no site, so eps would be"):
        Retrofitted(Ridge(), arm="base", eps=0.1).fit(x, y)
    with pytest.raises(RetrofitError, match="wraps ; got sklearn.linear_model._ridge.Ridge"):
        meta_estimator.Retrofitted(Ridge()).fit(x, y)
