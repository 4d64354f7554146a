"""examples/tabpfn_time_series_batched.py, in an environment with tabpfn-time-series 1.3.0
(``make test-tabpfn-time-series``): the package's own pipeline with every series' fit and
predict in one ``predict_batched`` call forecasts what the package's own per-series loop with
the unpatched ``TabPFNRegressor`` forecasts, and the file and docs/tabpfn-time-series.md run as
shown."""

from __future__ import annotations

import copy
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = "examples/tabpfn_time_series_batched.py"
HORIZON = 12


@pytest.fixture(scope="module")
def example(script_module):
    return script_module(EXAMPLE)


def test_the_batched_pipeline_forecasts_what_the_packages_own_loop_does(example, monkeypatch):
    from tabpfn_time_series.predictor import TimeSeriesPredictor
    from tabpfn_time_series.worker.parallel_workers import CPUParallelWorker

    config = {"model_path": example.DEMO_CHECKPOINT}
    series = example.hourly_series((72, 96, 120))
    vendor = example.TabPFNTSPipeline(tabpfn_model_config=config)
    vendor.predictor = TimeSeriesPredictor(           # its loop, in this process
        model_adapter=vendor.predictor.inference_routine.__self__,
        worker_class=CPUParallelWorker, worker_kwargs={"num_workers": 1})
    expected = vendor.predict_df(series, prediction_length=HORIZON)

    calls, answers = [], []
    real = example.predict_batched

    def recorded(regressor, xs, ys, x_tests, **kwargs):
        calls.append((xs, ys, x_tests, kwargs))
        answers.extend(real(regressor, xs, ys, x_tests, **kwargs))
        return answers
    monkeypatch.setattr(example, "predict_batched", recorded)
    regressor, retrofit = example.make_regressor("demo", "full-o", 1e-8)
    found = example.batched_pipeline(regressor, tabpfn_model_config=config).predict_df(
        series, prediction_length=HORIZON)

    assert [[len(x) for x in xs] for xs, *_ in calls] == [[72, 96, 120]]   # one call, all series
    xs, ys, x_tests, kwargs = calls[0]
    assert kwargs["output_type"] == "main"
    for answer, x, y, x_test in zip(answers, xs, ys, x_tests):   # the batching: the loop's
        alone = copy.copy(regressor).fit(x, y).predict(x_test, **kwargs)
        for key in ("median", "mean", "quantiles"):
            np.testing.assert_allclose(answer[key], alone[key], rtol=1e-6, atol=1e-6)
    assert retrofit.plan.arm == "full-o" and len(retrofit.plan.entries) > 0
    assert list(found.columns) == list(expected.columns) == [
        "target", *(round(0.1 * q, 1) for q in range(1, 10))]
    assert found.index.equals(expected.index) and len(found) == 3 * HORIZON
    # the retrofit at τ = 1e-8 against the unpatched regressor: 1.7e-4 of the scale measured
    scale = np.abs(expected.to_numpy()).max()
    assert np.abs(found.to_numpy() - expected.to_numpy()).max() <= 5e-4 * scale


def test_the_example_runs_as_a_script():
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    done = subprocess.run([sys.executable, str(ROOT / EXAMPLE)], capture_output=True,
                          text=True, cwd=ROOT, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "series-2" in done.stdout and "0.9" in done.stdout


def test_the_documented_block_runs(monkeypatch):
    monkeypatch.syspath_prepend(str(ROOT))              # `examples` from the checkout's root
    (code,) = re.findall(r"```python\n(.*?)```", (ROOT / "docs/tabpfn-time-series.md").read_text(),
                         flags=re.S)
    scope: dict = {}
    exec(compile(code, "docs/tabpfn-time-series.md", "exec"), scope)
    assert len(scope["forecasts"]) == 3 * HORIZON and "target" in scope["forecasts"].columns
