"""make_regressor: fit/predict really run the separate, patched instance."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from oretrofit import RetrofitError
from oretrofit.tabpfn_v3 import make_regressor


def _fit_predict(regressor, table) -> np.ndarray:
    x_train, y_train, x_test = table
    return regressor.fit(x_train, y_train).predict(x_test)


def _rel(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.abs(a - b).max() / np.abs(b).max())


def test_base_is_bit_identical_to_tabpfn(small_ckpt, table):
    from tabpfn import TabPFNRegressor
    vendor = TabPFNRegressor(model_path=str(small_ckpt), device="cpu", n_estimators=1,
                             inference_precision=torch.float32, random_state=0)
    regressor, result = make_regressor(small_ckpt, "base")
    assert result is None
    np.testing.assert_array_equal(_fit_predict(regressor, table), _fit_predict(vendor, table))


@pytest.mark.parametrize("arm", ["oa", "full-o"])
def test_tau_limits_through_the_regressor(small_ckpt, table, arm):
    precision = {"inference_precision": torch.float64}
    base = _fit_predict(make_regressor(small_ckpt, "base", **precision)[0], table)
    near, _ = make_regressor(small_ckpt, arm, 1e-12, eps=1e-12, **precision)
    assert _rel(_fit_predict(near, table), base) <= 1e-6
    far, _ = make_regressor(small_ckpt, arm, 1.0, **precision)
    assert _rel(_fit_predict(far, table), base) > 1e-3


def test_predictions_come_from_the_patched_instance(small_ckpt, table, monkeypatch):
    monkeypatch.setenv("TABPFN_MODEL_CACHE_SIZE", "4")      # tabpfn shares built models
    from tabpfn import TabPFNRegressor
    vendor = TabPFNRegressor(model_path=str(small_ckpt), device="cpu", n_estimators=1,
                             inference_precision=torch.float32, random_state=0)
    base = _fit_predict(vendor, table)
    regressor, result = make_regressor(small_ckpt, "full-o", 1.0)
    patched = _fit_predict(regressor, table)
    assert regressor.models_[0] is result.model and _rel(patched, base) > 1e-3
    assert type(vendor.models_[0]).__name__ == "TabPFNV3"           # shared object untouched
    np.testing.assert_array_equal(_fit_predict(vendor, table), base)
    result.revert()                                               # the fitted regressor follows
    np.testing.assert_array_equal(regressor.predict(table[2]), base)


def test_fit_with_cache_is_refused_under_o(small_ckpt):
    with pytest.raises(RetrofitError, match="fit_with_cache"):
        make_regressor(small_ckpt, "oa", fit_mode="fit_with_cache")
    with pytest.raises(RetrofitError, match="unknown arm"):
        make_regressor(small_ckpt, "attention")
