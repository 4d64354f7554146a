"""Both estimators, regressor and classifier: base is tabpfn's own, τ → 0 is base, τ = 1 is not;
tabpfn's own arguments, names and defaults; pickled, they load under any admitted tabpfn
release."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
import torch

from oretrofit import Retrofit, RetrofitError
from oretrofit.hosts.tabpfn import releases
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


@pytest.mark.parametrize("maker", [make_regressor, make_classifier])
def test_the_estimator_gets_tabpfns_defaults(maker):
    """Every argument left out is the vendor's signature default (model_path aside)."""
    import inspect

    import tabpfn
    vendor = tabpfn.TabPFNRegressor if maker is make_regressor else tabpfn.TabPFNClassifier
    expected = {name: p.default for name, p in inspect.signature(vendor.__init__).parameters
                .items() if name not in ("self", "model_path")}
    estimator, _ = maker("random", "full-o")
    assert type(estimator) is vendor
    assert {k: v for k, v in estimator.get_params().items() if k != "model_path"} == expected


def test_vendor_names_pass_through_and_auto_where_the_release_has_it():
    """make_regressor("demo", random_state=3, n_estimators="auto"): tabpfn's names, unchanged;
    a release without n_estimators="auto" (8.0.1) refuses it by name."""
    import inspect

    from tabpfn import TabPFNRegressor
    if "auto" not in str(inspect.signature(TabPFNRegressor.__init__)
                         .parameters["n_estimators"].annotation):
        with pytest.raises(RetrofitError, match="takes no n_estimators='auto'"):
            make_regressor("demo", random_state=3, n_estimators="auto")
        return
    from sklearn.datasets import load_diabetes
    x, y = load_diabetes(return_X_y=True)
    regressor, result = make_regressor("demo", random_state=3, n_estimators="auto")
    assert (regressor.random_state, regressor.n_estimators) == (3, "auto")
    assert result.plan.arm == "full-o"
    assert np.isfinite(regressor.fit(x[:40], y[:40]).predict(x[40:45])).all()


def test_the_callers_arguments_win_over_the_checkpoints_settings():
    """The demo's N_ESTIMATORS and SOFTMAX_TEMPERATURE are what the estimator runs when the
    caller names neither (tabpfn 8.x: as argument defaults); named, the caller's value is."""
    regressor, _ = make_regressor("demo", "base", n_estimators=2, softmax_temperature=0.5)
    assert (regressor.n_estimators, regressor.softmax_temperature) == (2, 0.5)


def test_a_vendor_estimator_at_its_defaults_runs_the_checkpoints_ensemble():
    """Retrofitted(TabPFNRegressor(model_path=demo)): arguments at tabpfn's defaults name
    nothing, so the demo's N_ESTIMATORS is the count fitted on every release (tabpfn 8.x's
    default is 8); one the caller sets stands."""
    from sklearn.datasets import load_diabetes
    from tabpfn import TabPFNRegressor

    from oretrofit.hosts.tabpfn.checkpoints import DEMO_CHECKPOINT
    from oretrofit.hosts.tabpfn.estimators import retrofit_estimator
    stored = torch.load(DEMO_CHECKPOINT, weights_only=True)["inference_config"]
    x, y = load_diabetes(return_X_y=True)
    own = TabPFNRegressor(model_path=str(DEMO_CHECKPOINT), device="cpu")
    regressor, _ = retrofit_estimator(own, "full-o", 1e-8, None)
    assert regressor.fit(x[:100], y[:100]).n_estimators_ == stored["N_ESTIMATORS"]
    own.set_params(n_estimators=2)
    assert retrofit_estimator(own, "full-o", 1e-8, None)[0].n_estimators == 2


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"seed": 3}, "seed= is not an argument of tabpfn .*pass random_state="),
    ({"n_estimator": 2}, "TabPFNRegressor takes no n_estimator; its arguments are .*n_estimators"),
])
def test_arguments_tabpfn_does_not_take_are_refused_by_name(kwargs, message):
    with pytest.raises(RetrofitError, match=message):
        make_regressor("random", "full-o", **kwargs)


def test_a_pickled_estimator_loads_under_another_admitted_release(task, monkeypatch):
    """Its retrofit re-applies the spec it pickled with under the release it is loaded under,
    which the spec then records (the release it was saved under is provenance, not a lock); a
    release outside the admitted range is refused by name."""
    maker, _, checkpoint, run = task
    estimator, handle = maker(checkpoint, "full-o", 1.0, **FAST)
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
