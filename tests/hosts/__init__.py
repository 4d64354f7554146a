"""Tests of :mod:`oretrofit.hosts`, one folder per host. pytest puts ``tests/`` on ``sys.path``,
so other tests read the architecture list as ``from hosts.transformers import zoo``."""

TAUS = [1e-8, 0.5, 50.0]


def assert_grid_search_tunes_tau(search, x_train, y_train) -> None:
    """``search`` (a GridSearchCV over a Retrofitted, ``{"tau": TAUS}``): each τ reaches the model
    (three different scores) and the best estimator runs the best τ."""
    import numpy as np

    search.fit(x_train, y_train)
    scores = search.cv_results_["mean_test_score"]
    assert len(set(scores)) == 3
    assert search.best_params_["tau"] == TAUS[int(np.argmax(scores))]
    assert search.best_estimator_.retrofit_.plan.tau == search.best_params_["tau"]


def assert_refusals(retrofitted, estimator, x_train, y_train, wraps: str) -> None:
    """``retrofitted`` (a family's Retrofitted class) over ``estimator`` refuses τ with the base
    arm and an unknown arm, and over another family's estimator names what it wraps
    (``wraps``)."""
    import re

    import pytest
    from sklearn.linear_model import Ridge

    from oretrofit import RetrofitError

    for arm, tau, match in (("base", 1e-8, "arm 'base' patches no site, so tau"),
                            ("o", None, "unknown arm 'o'")):
        with pytest.raises(RetrofitError, match=match):
            retrofitted(estimator, arm=arm, tau=tau).fit(x_train, y_train)
    with pytest.raises(RetrofitError, match=f"wraps {re.escape(wraps)}"):
        retrofitted(Ridge()).fit(x_train, y_train)
