"""Both estimators, regressor and classifier: base is tabpfn's own, τ → 0 is base, τ = 1 is not;
pickled, they load under any admitted tabpfn release."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from oretrofit import Retrofit, RetrofitError
from oretrofit.hosts.tabpfn import releases
from oretrofit.tabpfn import make_classifier, make_regressor

TASKS = {  # task: (maker, tabpfn estimator, checkpoint fixture, data fixture, output)
    "regressor": (make_regressor, "TabPFNRegressor", "small_ckpt", "table", "predict"),
    "classifier": (make_classifier, "TabPFNClassifier", "classifier_ckpt", "classes",
                   "predict_proba"),
}


@pytest.fixture(params=list(TASKS))
def task(request: pytest.FixtureRequest):
    maker, vendor, checkpoint, data, output = TASKS[request.param]
    x_train, y_train, x_test = request.getfixturevalue(data)

    def run(estimator) -> np.ndarray:
        return getattr(estimator.fit(x_train, y_train), output)(x_test)

    return maker, vendor, request.getfixturevalue(checkpoint), run


def test_base_is_bit_identical_to_tabpfn(task):
    import tabpfn
    maker, vendor, checkpoint, run = task
    reference = getattr(tabpfn, vendor)(model_path=str(checkpoint), device="cpu", n_estimators=1,
                                        inference_precision=torch.float32, random_state=0)
    estimator, result = maker(checkpoint, "base")
    assert result is None
    np.testing.assert_array_equal(run(estimator), run(reference))


@pytest.mark.parametrize("arm", ["oa", "full-o"])
def test_tau_limits(task, arm):
    maker, _, checkpoint, run = task
    fp64 = {"inference_precision": torch.float64}
    base = run(maker(checkpoint, "base", **fp64)[0])
    scale = np.abs(base).max()
    near, result = maker(checkpoint, arm, 1e-12, eps=1e-12, **fp64)
    assert np.abs(run(near) - base).max() <= 1e-6 * scale
    far, _ = maker(checkpoint, arm, 1.0, **fp64)
    assert np.abs(run(far) - base).max() > 1e-3 * scale
    assert ("dec" in {row["site"] for row in result.report()}) == (maker is make_classifier)


def test_a_pickled_estimator_loads_under_another_admitted_release(task, monkeypatch):
    """Its retrofit re-applies the spec it pickled with under the release it is loaded under,
    which the spec then records (the release it was saved under is provenance, not a lock); a
    release outside the admitted range is refused by name."""
    maker, _, checkpoint, run = task
    estimator, handle = maker(checkpoint, "full-o", 1.0)
    expected = run(estimator)
    saved = handle.spec()["host_versions"]["tabpfn"]
    other = next(r for r in reversed(releases.TESTED_RELEASES) if r != saved)
    data = pickle.dumps(estimator)
    loaded, refused = pickle.loads(data), pickle.loads(data)
    with monkeypatch.context() as installed:
        installed.setattr(releases, "installed_version", lambda: other)
        assert Retrofit.of(loaded.models_[0]).spec()["host_versions"]["tabpfn"] == other
        installed.setattr(releases, "installed_version", lambda: "7.0.0")
        with pytest.raises(RetrofitError, match="tabpfn 7.0.0 is older than the TabPFN host "
                                                "supports .* the model is now unpatched"):
            Retrofit.of(refused.models_[0]).spec()
    np.testing.assert_array_equal(run(loaded), expected)
