"""Patched artifacts of either task load back as the estimator that wrote them."""

from __future__ import annotations

import numpy as np
import pytest
import torch

import oretrofit
from oretrofit import RetrofitError
from oretrofit.tabpfn import (checkpoint_sha256, load_patched_classifier, load_patched_regressor,
                              make_classifier, write_patched_artifact)

from . import FAST


def test_a_patched_classifier_artifact_loads_back(classifier_ckpt, classes, tmp_path):
    x_train, y_train, x_test = classes
    classifier, result = make_classifier(classifier_ckpt, "full-o", 0.5, **FAST)
    want = classifier.fit(x_train, y_train).predict_proba(x_test)
    spec = {**result.spec(), "source_checkpoint_sha256": checkpoint_sha256(classifier_ckpt)}
    out = write_patched_artifact(tmp_path / "tabpfn-v3-classifier-patched.ckpt",
                                 classifier_ckpt, spec)
    loaded, handle = load_patched_classifier(out, **FAST)
    assert loaded.model_path == str(out) and handle.spec()["sites"] == spec["sites"]
    assert "dec" in spec["sites"]
    np.testing.assert_array_equal(loaded.fit(x_train, y_train).predict_proba(x_test), want)
    oretrofit.save(loaded, tmp_path / "classifier.pt")                 # the fitted estimator
    again = torch.load(tmp_path / "classifier.pt", weights_only=False)
    np.testing.assert_array_equal(again.predict_proba(x_test), want)
    with pytest.raises(RetrofitError, match="classifier checkpoint, not a regressor"):
        load_patched_regressor(out)
