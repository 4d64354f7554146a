"""tabpfn-time-series with its per-series TabPFN fits batched by oretrofit.

tabpfn-time-series (1.3.0) forecasts each series with a ``TabPFNRegressor`` of its own: its
worker fits one on the series' featurized history and predicts the future rows, series by
series. :class:`BatchedWorker` is a worker for the package's own ``TimeSeriesPredictor`` that
hands every series to one :func:`oretrofit.tabpfn.predict_batched` call instead: the same
fits, their model forwards padded together (the padding inert under the ``full-o`` retrofit),
and the package's own splitting into features and target, quantile read-out and output frame.

    OMP_NUM_THREADS=1 python examples/tabpfn_time_series_batched.py

runs the package's pipeline (its calendar, running-index and seasonal features) on a few
hourly series of different lengths with the ``demo`` checkpoint and prints the forecasts.
Needs ``pip install tabpfn-time-series==1.3.0`` (``make test-tabpfn-time-series`` builds an
environment with it).
"""

from __future__ import annotations

import copy
import os
from typing import Any, Callable

# tabpfn-time-series' telemetry would send usage events over the network: off unless asked for
os.environ.setdefault("TABPFN_DISABLE_TELEMETRY", "1")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from tabpfn_time_series import TabPFNTSPipeline, TimeSeriesDataFrame  # noqa: E402
from tabpfn_time_series.defaults import DEFAULT_QUANTILE_CONFIG  # noqa: E402
from tabpfn_time_series.predictor import TimeSeriesPredictor  # noqa: E402
from tabpfn_time_series.worker.parallel_workers import ParallelWorker  # noqa: E402

from oretrofit.tabpfn import DEMO_CHECKPOINT, make_regressor, predict_batched  # noqa: E402


class BatchedWorker(ParallelWorker):
    """A tabpfn-time-series worker whose series are fitted and predicted in one
    ``predict_batched(regressor, ...)`` call.

    Two passes through the package's own per-series routine: the first records each series'
    ``(train_X, train_y, test_X)``; the second answers each series with its batched
    prediction, read out by the model adapter (``inference_routine.__self__``) as its own
    ``predict`` would (the point forecast it selects, one column per quantile)."""

    def __init__(self, inference_routine: Callable[..., dict], regressor: Any) -> None:
        super().__init__(inference_routine)
        self.regressor = regressor
        self.adapter = inference_routine.__self__

    def predict(self, train_tsdf: TimeSeriesDataFrame, test_tsdf: TimeSeriesDataFrame,
                quantiles: list[float] = DEFAULT_QUANTILE_CONFIG, **kwargs: Any
                ) -> TimeSeriesDataFrame:
        items = list(train_tsdf.item_ids)
        inputs: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []

        def record(train_x: Any, train_y: Any, test_x: Any, **_: Any) -> dict:
            inputs.append((np.asarray(train_x), np.asarray(train_y), np.asarray(test_x)))
            return {"target": np.zeros(len(test_x))}

        self._each(record, items, train_tsdf, test_tsdf, quantiles=quantiles, **kwargs)
        raw = predict_batched(self.regressor, *map(list, zip(*inputs)), output_type="main",
                              quantiles=quantiles)
        answers = iter([self.adapter.postprocess_pred_output(r, quantiles) for r in raw])
        frames = self._each(lambda *_, **__: next(answers), items, train_tsdf, test_tsdf,
                            quantiles=quantiles, **kwargs)
        return TimeSeriesDataFrame(pd.concat(frames).loc[items])

    def _each(self, routine: Callable[..., dict], items: list, train_tsdf: TimeSeriesDataFrame,
              test_tsdf: TimeSeriesDataFrame, **kwargs: Any) -> list[pd.DataFrame]:
        """The package's per-series routine over ``items``, answered by ``routine``."""
        worker = copy.copy(self)
        worker.inference_routine = routine
        return [worker._prediction_routine(item, train_tsdf.loc[item], test_tsdf.loc[item],
                                           **kwargs) for item in items]


def batched_pipeline(regressor: Any, **pipeline_kwargs: Any) -> TabPFNTSPipeline:
    """tabpfn-time-series' pipeline (``pipeline_kwargs`` are its own) with its predictor's
    worker replaced by :class:`BatchedWorker` over ``regressor`` (a full-o regressor from
    :func:`oretrofit.tabpfn.make_regressor`, of the checkpoint the pipeline names)."""
    pipeline = TabPFNTSPipeline(**pipeline_kwargs)
    pipeline.predictor = TimeSeriesPredictor(
        model_adapter=pipeline.predictor.inference_routine.__self__,
        worker_class=BatchedWorker, worker_kwargs={"regressor": regressor})
    return pipeline


def hourly_series(lengths: tuple[int, ...] = (72, 96, 120), seed: int = 0) -> pd.DataFrame:
    """Series with a daily cycle, a trend and noise, one per length (item_id, timestamp,
    target), as ``predict_df`` takes them."""
    rng = np.random.default_rng(seed)
    frames = []
    for i, n in enumerate(lengths):
        t = np.arange(n)
        target = (10 * (i + 1) + 0.05 * t + 3 * np.sin(2 * np.pi * t / 24)
                  + 0.3 * rng.normal(size=n))
        frames.append(pd.DataFrame({"item_id": f"series-{i}", "target": target,
                                    "timestamp": pd.date_range("2026-01-01", periods=n,
                                                               freq="h")}))
    return pd.concat(frames, ignore_index=True)


def main() -> None:
    regressor, _ = make_regressor("demo", "full-o", 1e-8)
    pipeline = batched_pipeline(regressor, tabpfn_model_config={"model_path": DEMO_CHECKPOINT})
    forecasts = pipeline.predict_df(hourly_series(), prediction_length=12)
    print(forecasts.groupby(level="item_id").head(3))


if __name__ == "__main__":
    main()
