"""A retrofit survives everything that rebuilds tabpfn's model from model_path: fit, clone,
pickle and tabpfn's own save_fit_state / load_from_fit_state, bit for bit."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from sklearn.base import clone

from oretrofit import Retrofit
from oretrofit.hosts.tabpfn import reload
from oretrofit.tabpfn import make_classifier, make_regressor

from . import FAST

TASKS = {"regressor": (make_regressor, "small_ckpt", "table", "predict"),
         "classifier": (make_classifier, "classifier_ckpt", "classes", "predict_proba")}


@pytest.fixture(params=list(TASKS))
def task(request: pytest.FixtureRequest):
    maker, checkpoint, data, output = TASKS[request.param]
    return maker, request.getfixturevalue(checkpoint), request.getfixturevalue(data), output


@pytest.mark.parametrize("arm", ["base", "full-o"])
def test_save_fit_state_round_trips_exactly(task, arm, tmp_path):
    maker, checkpoint, (x_train, y_train, x_test), output = task
    estimator, _ = maker(checkpoint, arm, None if arm == "base" else 0.5, **FAST)
    want = getattr(estimator.fit(x_train, y_train), output)(x_test)
    estimator.save_fit_state(tmp_path / "fitted.tabpfn_fit")
    loaded = type(estimator).load_from_fit_state(tmp_path / "fitted.tabpfn_fit", device="cpu")
    np.testing.assert_array_equal(getattr(loaded, output)(x_test), want)
    assert loaded.models_[0] is not estimator.models_[0]         # fresh weights, spec re-applied
    assert (Retrofit.of(loaded.models_[0]) is None) == (arm == "base")


def test_clone_pickle_and_refit_run_the_retrofit(task):
    maker, checkpoint, (x_train, y_train, x_test), output = task
    estimator, result = maker(checkpoint, "full-o", 0.5, **FAST)
    unfitted = pickle.dumps(estimator)
    want = getattr(estimator.fit(x_train, y_train), output)(x_test)
    base = getattr(maker(checkpoint, "base", **FAST)[0].fit(x_train, y_train), output)(x_test)
    assert np.abs(want - base).max() > 1e-3                         # the retrofit is in force
    for again in (clone(estimator), pickle.loads(unfitted)):
        np.testing.assert_array_equal(getattr(again.fit(x_train, y_train), output)(x_test),
                                      want)
    np.testing.assert_array_equal(getattr(pickle.loads(pickle.dumps(estimator)), output)(x_test),
                                  want)
    assert estimator.models_[0] is result.model
    result.revert()          # the model the first fit ran, unpatched: a refit re-applies the spec
    np.testing.assert_array_equal(getattr(estimator.fit(x_train, y_train), output)(x_test), want)
    assert Retrofit.of(estimator.models_[0]) is not None


def test_a_plain_checkpoint_loads_untouched(small_ckpt):
    assert reload.embedded_spec(small_ckpt) is None and reload.patched_model(small_ckpt) is None
