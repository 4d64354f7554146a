"""The tabpfn release gate (``oretrofit.hosts.tabpfn.releases``) and the refusal of tabpfn 2.x to
7.x's ``PerFeatureTransformer``: each refused by name with the ``pip install`` that fixes it,
never with a bare import error or a silent fallback to another host."""

from __future__ import annotations

import re
import subprocess
import sys

import pytest
import torch

import oretrofit
from oretrofit import RetrofitError
from oretrofit.hosts.tabpfn import releases

OLDEST, NEWEST = releases.TESTED_RELEASES[0], releases.TESTED_RELEASES[-1]
FIX = rf"pip install 'tabpfn>=8\.1\.0,<={NEWEST}'"


@pytest.mark.parametrize("release", ["2.2.1", "6.4.1", "7.1.1"])
def test_an_older_release_is_refused_naming_the_architecture_and_the_fix(release):
    with pytest.raises(RetrofitError, match=rf"^tabpfn {release} is older than the TabPFN host "
                                            rf"supports \({OLDEST} to {NEWEST}\): tabpfn 2\.x to "
                                            r"7\.x build TabPFN v2 and v2\.5 as "
                                            r"PerFeatureTransformer, .*" + FIX + "$"):
        releases.check_release(release)


def test_an_untested_newer_release_and_no_tabpfn_are_refused_with_the_fix():
    fix = rf"pip install 'tabpfn>={OLDEST},<={NEWEST}' \(or pip install 'oretrofit\[tabpfn\]'\)$"
    with pytest.raises(RetrofitError, match=rf"^tabpfn 99\.0\.0 is not supported .*{fix}"):
        releases.check_release("99.0.0")
    with pytest.raises(RetrofitError, match=rf"tabpfn is not installed: {fix}"):
        releases.check_release(None)


def test_the_messages_cite_no_repository_file():
    """What a user of the installed wheel reads names the cause and the fix, not a file of the
    repository (``results/``, ``docs/``) the wheel does not ship."""
    for release in ("7.1.1", "99.0.0", None):
        with pytest.raises(RetrofitError) as refused:
            releases.check_release(release)
        assert "results/" not in str(refused.value) and "docs/" not in str(refused.value)


@pytest.mark.parametrize("module", ["tabpfn.architectures.base.transformer",   # 2.1 to 7.x
                                    "tabpfn.model.transformer"])                # 2.0
def test_a_per_feature_transformer_is_refused_by_name(module):
    """tabpfn 2.x to 7.x's model class, wherever the release defines it, is the TabPFN host's
    to refuse (not "no TabPFN model version oretrofit knows", nor left to another host)."""
    fake = type("PerFeatureTransformer", (torch.nn.Module,), {"__module__": module})
    fake.forward = lambda self, x: x
    model = fake()
    model.attention = torch.nn.MultiheadAttention(4, 1)     # what the fallback host would take
    with pytest.raises(RetrofitError, match=rf"^{module}\.PerFeatureTransformer \(TabPFN v2 PFT\) "
                                            r"is not supported: tabpfn 2\.x to 7\.x build TabPFN "
                                            r"v2 and v2\.5 as PerFeatureTransformer, .*" + FIX):
        oretrofit.retrofit(model, "oa")


def test_an_older_release_is_refused_before_tabpfn_is_imported():
    """On tabpfn 2.2.1 the public entry points raised a bare ``ModuleNotFoundError:
    tabpfn.inference_config``; the gate refuses the release when they are imported."""
    fake_release = ("import importlib.metadata as m; real = m.version; "
                    "m.version = lambda name: '2.2.1' if name == 'tabpfn' else real(name); ")
    done = subprocess.run([sys.executable, "-c", fake_release + "import oretrofit.tabpfn"],
                          capture_output=True, text=True)
    assert done.returncode == 1
    assert done.stderr.strip().splitlines()[-1].startswith(
        "oretrofit._surgery.host.RetrofitError: tabpfn 2.2.1 is older than the TabPFN host supports")


# the fields of a release's InferenceConfig in these tests: one without any of tabpfn 9's
KNOWN = frozenset({"PREPROCESS_TRANSFORMS", "SUBSAMPLE_SAMPLES"})
NINE = {"PREPROCESS_TRANSFORMS": [], "SUBSAMPLE_SAMPLES": None, "N_ESTIMATORS": 16,
        "SOFTMAX_TEMPERATURE": 0.9, "MAX_CPU_SAMPLES": 1000, "PASSTHROUGH_INF": False,
        "TRANSFORM_DATES": False, "TRANSFORM_TEXT": False, "MIN_CARDINALITY_FOR_TEXT": 30,
        "TEXT_N_COMPONENTS": 30, "SAMPLE_SUBSAMPLING_METHOD": "auto"}


def test_tabpfn_9_fields_become_estimator_arguments_or_are_dropped_at_the_releases_behaviour():
    kept, arguments = releases.translate_inference_config(NINE, KNOWN)
    assert kept == {"PREPROCESS_TRANSFORMS": [], "SUBSAMPLE_SAMPLES": None}
    assert arguments == {"n_estimators": 16, "softmax_temperature": 0.9}
    assert releases.translate_inference_config(NINE, frozenset(NINE)) == (NINE, {})
    # "auto": no count asked for, the estimator's own n_estimators stands
    assert releases.translate_inference_config({**NINE, "N_ESTIMATORS": "auto"}, KNOWN)[1] == {
        "softmax_temperature": 0.9}


@pytest.mark.parametrize(("changed", "named"), [
    ({"MAX_CPU_SAMPLES": 5000}, "MAX_CPU_SAMPLES=5000"),
    ({"PASSTHROUGH_INF": True}, "PASSTHROUGH_INF=True"),
    ({"TRANSFORM_DATES": 0}, "TRANSFORM_DATES=0"),
    ({"TRANSFORM_TEXT": True}, "MIN_CARDINALITY_FOR_TEXT=30, TEXT_N_COMPONENTS=30, "
                               "TRANSFORM_TEXT=True"),
    ({"SUBSAMPLE_SAMPLES": 100}, "SAMPLE_SUBSAMPLING_METHOD='auto'"),
    ({"A_LATER_FIELD": 1}, "A_LATER_FIELD=1"),
])
def test_a_field_the_release_cannot_express_is_refused_by_name(changed, named):
    """A field at a value the release does not reach, read because another field turns it on,
    or not in the table at all: refused, naming each such field and value, with the fix."""
    with pytest.raises(RetrofitError, match=re.escape(f"cannot express another way ({named})")
                       + rf".*pip install -U 'tabpfn>=9,<={NEWEST}'"):
        releases.translate_inference_config({**NINE, **changed}, KNOWN)
