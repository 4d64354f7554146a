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
