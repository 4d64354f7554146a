"""Many datasets through one retrofitted TabICL estimator, their model forwards batched.

``predict_proba_batched(estimator, Xs, ys, X_tests)`` equals, dataset by dataset,
``copy(estimator).fit(X, y).predict_proba(X_test)``, with the model forwards of the datasets
computed in padded forwards (:func:`oretrofit.hosts.tabicl.padding.padded_forward`, no mask)
instead of one per call. Three passes over the datasets, on shallow copies of the estimator
(which share its retrofitted model; the estimator itself is left unfitted by this):

1. fit, and predict on a shadow of the model that records each ``_inference_forward`` call
   (the ensemble members of one call are its lanes) and answers it with zeros;
2. the recorded calls, grouped by what must be shared in one forward (the forward's options
   and, for a classifier, the number of classes) and, within a group, by size
   (:data:`MAX_PADDING`), each bucket in one padded forward;
3. predict again on a shadow that answers each call with its output from pass 2, so the
   vendor's own post-processing (ensemble averaging, class un-shuffling, quantiles) runs
   unchanged.
"""

from __future__ import annotations

import dataclasses
import inspect
import math
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from ..._surgery.shadow import shadow
from .padding import padded_forward

__all__ = ["MAX_PADDING", "predict_batched", "predict_proba_batched"]

MAX_PADDING: dict[str, float] = {"cpu": 0.0}
"""Per device type, the padded rows one forward may carry, as a fraction of its calls' own
rows (lanes × rows); a device type not listed puts each group in one forward. A CPU's time is
the work it does, so padding only adds to it (calls of one size still share a forward); an
accelerator runs one large forward faster than many small ones."""


@dataclasses.dataclass
class _Call:
    """One recorded ``_inference_forward``: its inputs, the options it shares with its group,
    and (after pass 2) its output."""

    x: Tensor
    y: Tensor
    feature_shuffles: list[list[int]] | None
    options: dict[str, Any]
    group: tuple
    output: Tensor | None = None


def predict_batched(estimator: Any, xs: list[Any], ys: list[Any], x_tests: list[Any],
                    **predict_kwargs: Any) -> list[Any]:
    """``[copy(estimator).fit(X, y).predict(X_test, **predict_kwargs) for …]`` with the model
    forwards of all datasets batched (a classifier's labels, a regressor's ``output_type``)."""
    return _batched(estimator, xs, ys, x_tests, "predict", predict_kwargs)


def predict_proba_batched(estimator: Any, xs: list[Any], ys: list[Any], x_tests: list[Any]
                          ) -> list[np.ndarray]:
    """``[copy(classifier).fit(X, y).predict_proba(X_test) for …]`` with the model forwards of
    all datasets batched."""
    return _batched(estimator, xs, ys, x_tests, "predict_proba", {})


def _sharing_model(estimator: Any) -> Any:
    """A shallow copy of ``estimator`` that keeps its retrofitted model (``copy.copy`` goes
    through the vendor's pickling state, which drops it: each dataset's fit would load and
    retrofit the checkpoint again). Safe here: the datasets' fits and predicts run one after
    another, without the KV cache the vendor keeps on the model."""
    copied = type(estimator).__new__(type(estimator))
    copied.__dict__.update(estimator.__dict__)
    return copied


def _batched(estimator: Any, xs: list[Any], ys: list[Any], x_tests: list[Any], method: str,
             kwargs: dict[str, Any]) -> list[Any]:
    if not len(xs) == len(ys) == len(x_tests):
        raise ValueError(f"predict_batched takes as many train tables, targets and test tables; "
                         f"got {len(xs)}, {len(ys)} and {len(x_tests)}")
    if getattr(estimator, "kv_cache", False):
        raise ValueError("predict_batched runs the model's plain forward, not its KV cache: "
                         "make the estimator with kv_cache=False")
    fitted = [_sharing_model(estimator).fit(x, y) for x, y in zip(xs, ys)]
    calls: list[list[_Call]] = []
    for copied, x_test in zip(fitted, x_tests):
        calls.append([])
        _predict_on(copied, _recorder(copied.model_, calls[-1]), method, x_test, kwargs)
    _forward_groups([c for dataset in calls for c in dataset], fitted[0].model_)
    return [_predict_on(copied, _replayer(copied.model_, own), method, x_test, kwargs)
            for copied, own, x_test in zip(fitted, calls, x_tests)]


def _predict_on(estimator: Any, model: nn.Module, method: str, x_test: Any,
                kwargs: dict[str, Any]) -> Any:
    """``estimator.method(x_test)`` with ``model`` (a shadow) in place of its model."""
    own = estimator.model_
    estimator.model_ = model
    try:
        return getattr(estimator, method)(x_test, **kwargs)
    finally:
        estimator.model_ = own


def _bound(model: nn.Module, args: tuple, kwargs: dict) -> dict[str, Any]:
    given = inspect.signature(model._inference_forward).bind(*args, **kwargs)
    given.apply_defaults()
    return dict(given.arguments)


def _recorder(model: nn.Module, calls: list[_Call]) -> nn.Module:
    """A shadow of ``model`` whose ``_inference_forward`` records the call and returns zeros
    of the output's shape."""

    def record(*args: Any, **kwargs: Any) -> Tensor:
        given = _bound(model, args, kwargs)
        x, y, shuffles = given.pop("X"), given.pop("y_train"), given.pop("feature_shuffles")
        classes = len(torch.unique(y[0])) if model.max_classes > 0 else 0
        options = {k: v for k, v in given.items() if k != "inference_config"}
        calls.append(_Call(x, y, shuffles, given, (classes, tuple(sorted(options.items())))))
        width = classes if classes else model.num_quantiles
        return x.new_zeros(x.shape[0], x.shape[1] - y.shape[1], width)

    return shadow(model, _inference_forward=record)


def _forward_groups(calls: list[_Call], model: nn.Module) -> None:
    """Each bucket of each group of calls in one padded forward; the outputs kept on the
    calls."""
    groups: dict[tuple, list[_Call]] = {}
    for call in calls:
        groups.setdefault(call.group, []).append(call)
    slack = MAX_PADDING.get(next(model.parameters()).device.type, math.inf)
    for members in groups.values():
        for bucket in _buckets(members, slack):
            with torch.no_grad():
                outputs = padded_forward(model, [c.x for c in bucket], [c.y for c in bucket],
                                         [c.feature_shuffles for c in bucket],
                                         **bucket[0].options)
            for call, output in zip(bucket, outputs):
                call.output = output


def _buckets(calls: list[_Call], slack: float) -> list[list[_Call]]:
    """The calls in buckets whose padded rows, ``lanes × (max N + max M)``, are at most
    ``1 + slack`` times their own, ``Σ lanes × (N_k + M_k)`` (first fit, largest first)."""

    def fits(bucket: list[_Call]) -> bool:
        lanes = sum(c.x.shape[0] for c in bucket)
        padded = lanes * (max(c.y.shape[1] for c in bucket)
                          + max(c.x.shape[1] - c.y.shape[1] for c in bucket))
        return padded <= (1 + slack) * sum(c.x.shape[0] * c.x.shape[1] for c in bucket)

    buckets: list[list[_Call]] = []
    for call in sorted(calls, key=lambda c: (c.y.shape[1], c.x.shape[1]), reverse=True):
        home = next((b for b in buckets if fits([*b, call])), None)
        if home is None:
            buckets.append([call])
        else:
            home.append(call)
    return buckets


def _replayer(model: nn.Module, calls: list[_Call]) -> nn.Module:
    """A shadow of ``model`` whose ``_inference_forward`` answers the recorded calls in order."""
    pending = iter(calls)

    def replay(*args: Any, **kwargs: Any) -> Tensor:
        given = _bound(model, args, kwargs)
        call = next(pending, None)
        if call is None or given["X"].shape != call.x.shape \
                or not torch.equal(given["y_train"], call.y):
            raise RuntimeError("predict_batched: the estimator's predict called its model "
                               "differently the second time (is it deterministic?)")
        return call.output

    return shadow(model, _inference_forward=replay)
