"""make_regressor / make_classifier with spec=: the built host is patched by apply_spec, and a
spec that contradicts the other arguments, the host, its sites or its checkpoint is refused."""

from __future__ import annotations

import json

import numpy as np
import pytest
import torch
from torch import nn

import oretrofit
from oretrofit import RetrofitError
from oretrofit.tabpfn import checkpoint_sha256, make_classifier, make_regressor
from oretrofit.hosts.tabpfn.checkpoints import build_model, load_checkpoint

from . import FAST

SITE_TAU = {"icl.*": 0.3, "fde.*": 2.0, "te.*": 0.05}


def _spec(ckpt, arm: str = "full-o", **extra) -> dict:
    model, _, _ = build_model(load_checkpoint(ckpt))
    applied = oretrofit.retrofit(model, arm, 0.5, site_tau=SITE_TAU if arm == "full-o" else None)
    return {**applied.spec(), **extra}


def _fit_predict(regressor, table) -> np.ndarray:
    x_train, y_train, x_test = table
    return regressor.fit(x_train, y_train).predict(x_test)


def test_a_spec_patches_like_the_arguments_it_records(small_ckpt, table, tmp_path):
    spec = _spec(small_ckpt)
    path = tmp_path / "spec.json"
    path.write_text(json.dumps(spec))
    by_args, _ = make_regressor(small_ckpt, "full-o", 0.5, site_tau=SITE_TAU, **FAST)
    expected = _fit_predict(by_args, table)
    for given in (spec, path, str(path)):
        regressor, applied = make_regressor(small_ckpt, spec=given, **FAST)
        assert applied.plan.arm == "full-o" and applied.plan.site_tau == SITE_TAU
        np.testing.assert_array_equal(_fit_predict(regressor, table), expected)
    base = _fit_predict(make_regressor(small_ckpt, **FAST)[0], table)
    assert np.abs(expected - base).max() > 1e-3 * np.abs(base).max()      # the spec is in force
    # the spec's own arm may be named; a base spec patches nothing
    assert make_regressor(small_ckpt, "full-o", spec=spec, **FAST)[1].plan.site_tau == SITE_TAU
    assert make_regressor(small_ckpt, spec={**spec, "arm": "base", "site_tau": {},
                                            "sites": [], "site_modules": {}}, **FAST)[1] is None


@pytest.mark.parametrize("kwargs,message", [
    ({"arm": "oa"}, "arm 'oa' contradicts the spec's arm 'full-o'"),
    ({"arm": "base"}, "arm 'base' contradicts"),
    ({"tau": 1e-8}, "drop tau"),
    ({"eps": 1e-6}, "drop eps"),
    ({"site_tau": {"icl.*": 1.0}, "tau": 1.0}, "drop tau, site_tau"),
])
def test_settings_that_contradict_the_spec_are_refused(small_ckpt, kwargs, message):
    with pytest.raises(RetrofitError, match=message):
        make_regressor(small_ckpt, spec=_spec(small_ckpt), **kwargs, **FAST)


def test_a_spec_for_other_sites_or_another_host_is_refused(small_ckpt, classifier_ckpt):
    # the classifier's spec has its many-class decoder site, which a regressor lacks
    classifier_spec = _spec(classifier_ckpt, "oa")
    with pytest.raises(RetrofitError, match="site list"):
        make_regressor(small_ckpt, spec=classifier_spec, **FAST)
    torch_spec = oretrofit.retrofit(nn.TransformerEncoderLayer(8, 2, batch_first=True),
                                    "full-o").spec()
    with pytest.raises(RetrofitError, match="does not fit this model"):
        make_regressor(small_ckpt, spec=torch_spec, **FAST)
    with pytest.raises(RetrofitError, match="schema_version"):
        make_regressor(small_ckpt, spec={"arm": "full-o"}, **FAST)
    # and the classifier takes its own
    _, applied = make_classifier(classifier_ckpt, spec=classifier_spec, **FAST)
    assert applied.plan.entries[-1][0].name == "dec"


def test_a_spec_naming_another_checkpoint_is_refused(small_ckpt, tmp_path, calibration_record):
    other = "0" * 64
    model, _, _ = build_model(load_checkpoint(small_ckpt))
    for recorded in ({"source_checkpoint_sha256": other},
                     {"calibration": calibration_record(model, checkpoint_sha256=other)}):
        with pytest.raises(RetrofitError, match="make the spec from this checkpoint"):
            make_regressor(small_ckpt, spec=_spec(small_ckpt, **recorded), **FAST)
    mine = {"calibration": calibration_record(model,
                                              checkpoint_sha256=checkpoint_sha256(small_ckpt))}
    assert make_regressor(small_ckpt, spec=_spec(small_ckpt, **mine), **FAST)[1] is not None
