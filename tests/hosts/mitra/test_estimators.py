"""``make_classifier`` / ``make_regressor``: the vendor's estimators with every argument passed
through, retrofitted, against the vendor's unpatched estimator over consecutive fits, and the
retrofit kept through fit, clone and pickle."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import sklearn
import torch

from oretrofit import Retrofit, RetrofitError
from oretrofit.hosts.mitra import make_classifier, make_regressor

VENDOR = {"device": "cpu", "fine_tune": False, "verbose": False}


def _fits(estimator, fits, method):
    """Each fit's predictions, numpy's and torch's generators seeded before each fit (the
    vendor's data loaders and preprocessing draw from them)."""
    out = []
    for x, y, x_test in fits:
        np.random.seed(0)
        torch.manual_seed(0)
        out.append(getattr(estimator.fit(x, y), method)(x_test))
    return out


@pytest.mark.parametrize("arm", ["oa", "full-o"])
def test_classifier_is_the_vendors_over_two_fits_on_different_data(checkpoints, table, float32,
                                                                   arm):
    from autogluon.tabular.models.mitra.sklearn_interface import MitraClassifier
    fits = [table(20, 4, 3, seed=0), table(31, 6, 5, seed=1)]
    ours, handle = make_classifier(checkpoints["classification"], arm, tau=1e-8, **VENDOR)
    vendor = MitraClassifier(hf_model=str(checkpoints["classification"]), **VENDOR)
    assert isinstance(handle, Retrofit) and handle.plan.arm == arm
    mine, theirs = _fits(ours, fits, "predict_proba"), _fits(vendor, fits, "predict_proba")
    assert [p.shape for p in mine] == [(7, 3), (7, 5)]
    assert max(np.abs(m - t).max() for m, t in zip(mine, theirs)) <= 1e-5


def test_regressor_is_the_vendors_over_two_fits_on_different_data(checkpoints, table, float32):
    from autogluon.tabular.models.mitra.sklearn_interface import MitraRegressor
    fits = [table(20, 4, 0, seed=2), table(27, 3, 0, seed=3)]
    ours, _ = make_regressor(checkpoints["regression"], tau=1e-8, **VENDOR)
    vendor = MitraRegressor(hf_model=str(checkpoints["regression"]), **VENDOR)
    mine, theirs = _fits(ours, fits, "predict"), _fits(vendor, fits, "predict")
    assert max(np.abs(m - t).max() for m, t in zip(mine, theirs)) <= 1e-5


def test_every_model_a_fit_loads_is_retrofitted(checkpoints, table):
    ours, handle = make_classifier(checkpoints["classification"], n_estimators=2, **VENDOR)
    for seed in (0, 1):
        ours.fit(*table(20, 4, 3, seed=seed)[:2])
        models = [trainer.model for trainer in ours.trainers]
        assert len(models) == 2 and handle.model not in models
        assert all([(s.name, c) for s, c in Retrofit.of(m).plan.entries]
                   == [(s.name, c) for s, c in handle.plan.entries] for m in models)


def test_the_retrofit_survives_clone_and_pickle(checkpoints, table, float32):
    x, y, x_test = table(20, 4, 3, seed=0)
    ours, _ = make_classifier(checkpoints["classification"], "full-o", tau=1e-8, **VENDOR)
    np.random.seed(0)
    expected = ours.fit(x, y).predict_proba(x_test)
    cloned = sklearn.clone(ours)
    assert {k: cloned.get_params()[k] for k in ("arm", "tau", "eps")} == {
        "arm": "full-o", "tau": 1e-8, "eps": 0.0}
    np.random.seed(0)
    assert np.array_equal(cloned.fit(x, y).predict_proba(x_test), expected)
    assert Retrofit.of(cloned.trainers[0].model) is not None
    blob = pickle.dumps(ours)                    # the vendor's predict advances its generator:
    expected = ours.predict_proba(x_test)        # the next prediction is the pickled one's
    loaded = pickle.loads(blob)
    assert np.array_equal(loaded.predict_proba(x_test), expected)
    assert Retrofit.of(loaded.trainers[0].model) is not None


def test_base_is_the_vendors_estimator_unpatched(checkpoints):
    from autogluon.tabular.models.mitra.sklearn_interface import MitraClassifier
    vendor, handle = make_classifier(checkpoints["classification"], "base", **VENDOR)
    assert type(vendor) is MitraClassifier and handle is None
    assert vendor.hf_model == str(checkpoints["classification"])


def test_the_vendors_defaults_are_kept(checkpoints):
    from autogluon.tabular.models.mitra.sklearn_interface import MitraRegressor
    ours, _ = make_regressor(checkpoints["regression"], device="cpu")
    params = ours.get_params()
    vendor = MitraRegressor(hf_model=str(checkpoints["regression"]), device="cpu").get_params()
    assert {k: params[k] for k in vendor} == vendor
    assert {k: params[k] for k in ("arm", "tau", "eps")} == {"arm": "full-o", "tau": 1e-8,
                                                            "eps": 0.0}


def test_the_checkpoint_is_passed_once(checkpoints):
    with pytest.raises(RetrofitError, match="model_path is Mitra's hf_model"):
        make_classifier(checkpoints["classification"], hf_model="elsewhere")
    with pytest.raises(RetrofitError, match="unknown arm 'o'"):
        make_classifier(checkpoints["classification"], "o")


def test_a_fit_with_an_arm_that_patches_nothing_is_refused(checkpoints, table):
    ours, _ = make_classifier(checkpoints["classification"], **VENDOR)
    ours.set_params(arm="base")
    with pytest.raises(RetrofitError, match="needs arm 'oa' or 'full-o', not 'base'"):
        ours.fit(*table(20, 4, 3, seed=0)[:2])
