"""Many datasets through one retrofitted TabICL estimator, their model forwards batched.

``predict_proba_batched(estimator, Xs, ys, X_tests)`` equals, dataset by dataset,
``copy(estimator).fit(X, y).predict_proba(X_test)``, with every model forward of every dataset
computed in padded forwards (:func:`oretrofit.hosts.tabicl.padding.padded_forward`, no mask)
instead of one per call. Three passes over the datasets, on shallow copies of the estimator
(which share its retrofitted model; the estimator itself is left unfitted by this):

1. fit, and predict on a shadow of the model that records each ``_inference_forward`` call
   (the ensemble members of one call are its lanes) and answers it with zeros;
2. the recorded calls, grouped by what must be shared in one forward (the forward's options
   and, for a classifier, the number of classes), each group in one padded forward;
3. predict again on a shadow that answers each call with its output from pass 2, so the
   vendor's own post-processing (ensemble averaging, class un-shuffling, quantiles) runs
   unchanged.

A column embedder that is not feature-grouped is told the ensemble's feature shuffles, to
embed the first lane once (with the first lane's targets) and permute the embedded columns for
the others; pass 2 embeds, lane by lane, the first lane's columns in that order, with the first
lane's targets (:func:`_as_embedded`; the model reads the tables only there).
"""

from __future__ import annotations

import copy
import dataclasses
import inspect
from typing import Any

import numpy as np
import torch
from torch import Tensor, nn

from ..._surgery.shadow import shadow
from .padding import padded_forward

__all__ = ["predict_batched", "predict_proba_batched"]


@dataclasses.dataclass
class _Call:
    """One recorded ``_inference_forward``: its inputs, the options it shares with its group,
    and (after pass 2) its output."""

    x: Tensor
    y: Tensor
    column_y: Tensor
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


def _batched(estimator: Any, xs: list[Any], ys: list[Any], x_tests: list[Any], method: str,
             kwargs: dict[str, Any]) -> list[Any]:
    if not len(xs) == len(ys) == len(x_tests):
        raise ValueError(f"predict_batched takes as many train tables, targets and test tables; "
                         f"got {len(xs)}, {len(ys)} and {len(x_tests)}")
    if getattr(estimator, "kv_cache", False):
        raise ValueError("predict_batched runs the model's plain forward, not its KV cache: "
                         "make the estimator with kv_cache=False")
    fitted = [copy.copy(estimator).fit(x, y) for x, y in zip(xs, ys)]
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
        x, y = given.pop("X"), given.pop("y_train")
        column_y, x = _as_embedded(model.col_embedder, x, y, given.pop("feature_shuffles"))
        classes = len(torch.unique(y[0])) if model.max_classes > 0 else 0
        options = {k: v for k, v in given.items() if k != "inference_config"}
        calls.append(_Call(x, y, column_y, given, (classes, tuple(sorted(options.items())))))
        width = classes if classes else model.num_quantiles
        return x.new_zeros(x.shape[0], x.shape[1] - y.shape[1], width)

    return shadow(model, _inference_forward=record)


def _as_embedded(embedder: nn.Module, x: Tensor, y: Tensor, shuffles: list | None
                 ) -> tuple[Tensor, Tensor]:
    """The targets the column embedder reads and the tables it embeds, lane by lane. Told the
    feature shuffles, a column embedder that is not feature-grouped embeds the first lane once,
    with the first lane's targets, and gives lane ``i`` its columns in the vendor's order
    (``map_feature_shuffle(shuffles[0], shuffles[i])``); the same tables embedded lane by lane
    give the same embeddings."""
    if shuffles is None or embedder.feature_group:
        return y, x
    tables = [x[0][:, embedder.map_feature_shuffle(shuffles[0], own)] for own in shuffles]
    return y[:1].expand_as(y), torch.stack(tables)


def _forward_groups(calls: list[_Call], model: nn.Module) -> None:
    """Each group of calls in one padded forward; the outputs kept on the calls."""
    groups: dict[tuple, list[_Call]] = {}
    for call in calls:
        groups.setdefault(call.group, []).append(call)
    for members in groups.values():
        with torch.no_grad():
            outputs = padded_forward(model, [c.x for c in members], [c.y for c in members],
                                     [c.column_y for c in members], **members[0].options)
        for call, output in zip(members, outputs):
            call.output = output


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
