"""``make_regressor`` / ``make_classifier`` on a random checkpoint of every supported model
version the installed tabpfn ships (written in tabpfn's format, read back the way tabpfn reads
it: the version from ``architecture_name`` and the file name): the retrofitted estimator at a
tiny τ predicts what the unpatched one does, with and without tabpfn's KV cache."""

from __future__ import annotations

import importlib
import importlib.util
import inspect

import numpy as np
import pytest
import torch

from tabpfn import TabPFNClassifier, TabPFNRegressor

from oretrofit import RetrofitError
from oretrofit.hosts.tabpfn import releases, versions
from oretrofit.hosts.tabpfn.checkpoints import write_random_checkpoint
from oretrofit.tabpfn import make_classifier, make_regressor

from . import FAST

SHIPPED = [v.label for v in versions.VERSIONS
           if v.sites and importlib.util.find_spec(v.module) is not None]


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("versions")
    return {(v, t): write_random_checkpoint(root / f"tabpfn-{v}-{t}-random.ckpt", "small",
                                            task=t, version=v)
            for v in SHIPPED for t in ("regressor", "classifier")}


def _predict(make, path, x_train, y_train, x_test, task, **kwargs):
    """Predictions in float32 (tabpfn's "auto" is bfloat16 autocast on a CPU with native
    bfloat16; the 1e-4 limit is float32's)."""
    estimator, _ = make(path, inference_precision=torch.float32, **FAST, **kwargs)
    estimator.fit(x_train, y_train)
    return estimator.predict_proba(x_test) if task == "classifier" else estimator.predict(x_test)


# the v3 family's KV cache is covered by the v3 estimator tests
CASES = [(v, m) for v in SHIPPED for m in ("fit_preprocessors", "fit_with_cache")
         if m == "fit_preprocessors" or v in ("v2", "v2.5", "v2.6")]


@pytest.mark.parametrize("version,fit_mode", CASES)
@pytest.mark.parametrize("task", ["regressor", "classifier"])
def test_estimator_of_every_version(ckpts, table, classes, version, task, fit_mode):
    make = make_classifier if task == "classifier" else make_regressor
    x_train, y_train, x_test = classes if task == "classifier" else table
    path = ckpts[(version, task)]
    row = next(v for v in versions.VERSIONS if v.label == version)
    forward = getattr(importlib.import_module(row.module), row.cls).forward
    if fit_mode == "fit_with_cache" and "return_kv_cache" not in inspect.signature(
            forward).parameters:
        # this release's v2.x has no KV cache: fit_with_cache fails unpatched too
        with pytest.raises(Exception):      # noqa: B017  (tabpfn's own failure, any type)
            _predict(make, path, x_train, y_train, x_test, task, arm="base", fit_mode=fit_mode)
        return
    if fit_mode == "fit_with_cache" and releases.always_quantizes_cache(
            TabPFNClassifier if task == "classifier" else TabPFNRegressor):
        with pytest.raises(RetrofitError, match="quantized"):      # 8.0.2-8.1.x
            make(path, arm="full-o", fit_mode=fit_mode)
        return
    base = _predict(make, path, x_train, y_train, x_test, task, arm="base")
    patched = _predict(make, path, x_train, y_train, x_test, task, arm="full-o", tau=1e-12,
                       eps=1e-12, fit_mode=fit_mode)
    assert np.isfinite(patched).all()
    assert np.max(np.abs(patched - base)) <= 1e-4 * max(1.0, np.max(np.abs(base)))
