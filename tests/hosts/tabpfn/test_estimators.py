"""Both estimators, regressor and classifier: base is tabpfn's own, τ → 0 is base, τ = 1 is not."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from oretrofit.tabpfn import make_classifier, make_regressor

from . import FAST

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
    reference = getattr(tabpfn, vendor)(model_path=str(checkpoint), **FAST)
    estimator, result = maker(checkpoint, "base", **FAST)
    assert result is None
    np.testing.assert_array_equal(run(estimator), run(reference))


@pytest.mark.parametrize("arm", ["oa", "full-o"])
def test_tau_limits(task, arm):
    maker, _, checkpoint, run = task
    fp64 = {"inference_precision": torch.float64, **FAST}
    base = run(maker(checkpoint, "base", **fp64)[0])
    scale = np.abs(base).max()
    near, result = maker(checkpoint, arm, 1e-12, eps=1e-12, **fp64)
    assert np.abs(run(near) - base).max() <= 1e-6 * scale
    far, _ = maker(checkpoint, arm, 1.0, **fp64)
    assert np.abs(run(far) - base).max() > 1e-3 * scale
    assert ("dec" in {row["site"] for row in result.report()}) == (maker is make_classifier)
