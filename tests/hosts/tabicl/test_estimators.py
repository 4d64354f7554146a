"""``oretrofit.tabicl.make_classifier`` / ``make_regressor``: the vendor's estimators on a
checkpoint in the vendor's format, retrofitted once and kept through every ``fit`` (the vendor
reloads its model at each), equal at τ → 0 to the vendor's unpatched estimator."""

from __future__ import annotations

import copy
import pickle
from pathlib import Path

import numpy as np
import pytest
from sklearn.base import clone
from tabicl import TabICLClassifier, TabICLRegressor

from oretrofit import Retrofit, RetrofitError
from oretrofit.tabicl import make_classifier, make_regressor

VENDOR = dict(n_estimators=2, device="cpu", allow_auto_download=False)


def _tables(seed: int = 0):
    """Two datasets of different sizes and widths, one after the other."""
    rng = np.random.default_rng(seed)
    for rows, features in ((30, 4), (24, 6)):
        yield rng.normal(size=(rows, features)), rng.integers(0, 3, rows), \
            rng.normal(size=(7, features))


@pytest.mark.parametrize("arm", ["oa", "full-o"])
def test_the_classifier_equals_the_vendors_over_two_fits(checkpoints, arm):
    ours, r = make_classifier(checkpoints["classifier"], arm, tau=1e-8, **VENDOR)
    vendor = TabICLClassifier(model_path=checkpoints["classifier"], **VENDOR)
    assert isinstance(ours, TabICLClassifier) and ours.get_params() == vendor.get_params()
    for x, y, x_test in _tables():
        got = ours.fit(x, y).predict_proba(x_test)
        assert ours.model_ is r.model and not r.reverted   # the retrofit survived the fit
        assert np.abs(got - vendor.fit(x, y).predict_proba(x_test)).max() < 1e-5
        assert (ours.predict(x_test) == vendor.predict(x_test)).all()


def test_the_regressor_equals_the_vendors_over_two_fits_with_its_kv_cache(checkpoints):
    kwargs = dict(VENDOR, kv_cache=True)
    ours, r = make_regressor(checkpoints["regressor"], tau=1e-8, **kwargs)
    vendor = TabICLRegressor(model_path=checkpoints["regressor"], **kwargs)
    assert r.plan.arm == "full-o"
    for x, y, x_test in _tables(1):
        y = y + np.linspace(0, 1, len(y))
        got = ours.fit(x, y).predict(x_test)
        assert np.abs(got - vendor.fit(x, y).predict(x_test)).max() < 1e-5


def test_base_is_the_vendors_estimator_unpatched(checkpoints):
    ours, r = make_classifier(checkpoints["classifier"], "base", **VENDOR)
    assert r is None and type(ours) is TabICLClassifier
    with pytest.raises(RetrofitError, match="arm 'base' patches no site, so tau would be"):
        make_classifier(checkpoints["classifier"], "base", tau=1e-8, **VENDOR)
    with pytest.raises(RetrofitError, match="unknown arm 'o'"):
        make_classifier(checkpoints["classifier"], "o", **VENDOR)


def test_a_pickled_estimator_is_retrofitted_again_and_a_clone_is_refused(checkpoints):
    ours, _ = make_regressor(checkpoints["regressor"], tau=1e-8, **VENDOR)
    x, y, x_test = next(_tables(2))
    expected = ours.fit(x, y.astype(float)).predict(x_test)
    back = pickle.loads(pickle.dumps(ours))
    assert not back.retrofit_.reverted and back.retrofit_.model is back.model_
    assert np.array_equal(back.predict(x_test), expected)
    with pytest.raises(RetrofitError, match="has lost its retrofit .*make_classifier"):
        clone(ours).fit(x, y)


def test_a_copy_gets_a_retrofitted_model_of_its_own(checkpoints):
    """As the vendor's copy: copies predicting on threads never share a model (the vendor sets
    its KV cache on the model at each cached predict)."""
    ours, r = make_classifier(checkpoints["classifier"], tau=1e-8, **VENDOR)
    x, y, x_test = next(_tables(3))
    copied = copy.copy(ours).fit(x, y)
    assert copied.model_ is not r.model and Retrofit.of(copied.model_) is not None
    assert not hasattr(ours, "n_features_in_")              # the original is left unfitted
    assert np.array_equal(copied.predict_proba(x_test), ours.fit(x, y).predict_proba(x_test))


def test_the_docs_example_runs_and_matches_the_vendor(capsys):
    page = (Path(__file__).resolve().parents[3] / "docs" / "tabicl.md").read_text()
    code = page.split("\n## Estimators\n", 1)[1]
    code = code.split("```python\n", 1)[1].split("```", 1)[0]
    exec(compile(code, "docs/tabicl.md", "exec"), {})
    assert capsys.readouterr().out.strip().endswith("sites=22, active) True")
