"""Ragged batched prediction for TabDPT: many datasets of different sizes in few model forwards,
the padding made inert by a ``full-o`` retrofit (:mod:`.padding`).

Contract. For datasets ``d = 0..D-1``, each ``(X_train_d, y_train_d, X_test_d)``::

    predict_batched(est, X_train_list, y_train_list, X_test_list)[d]
        == copy(est).fit(X_train_d, y_train_d).predict(X_test_d)

up to float summation order (the tests hold it to 1e-5). The steps:

1. *fit, then record*: per dataset, a copy of the estimator sharing its model is fitted, and
   its ``predict`` runs once with the model replaced by a recorder that keeps each call's
   inputs ``x (B, N + M, F)``, ``y (B, N)`` and answers zeros. A TabDPT model call never reads
   an earlier call's output (ensemble members, class digits and retrieval batches are fixed by
   the data and the seed), so the calls are those of the real prediction.
2. *padded forwards*: :func:`.padding.padded_forward` answers the recorded calls, one forward
   per group of calls of similar sizes (:func:`size_groups`; each batch lane with its own
   preprocessing statistics; tokens zero-padded, no mask). A padded row costs what a real one
   does, so a forward takes calls only while its padding stays within :data:`PADDING_ROWS`
   rows: an ensemble's calls (all of one size) share a forward, a dataset far larger than
   the others gets its own.
3. *replay*: each copy's ``predict`` runs again with the model answering its calls from those
   forwards, so the vendor decodes them (softmax, class digits, ensemble average, target scale)
   as it would its own forward's. A call that differs from the recorded one (an ensemble drawn
   from fresh entropy: ``seed=None`` with ``n_ensembles > 1``) is refused.
"""

from __future__ import annotations

import copy
from typing import Any, Sequence

import torch
from torch import Tensor, nn

from ..._surgery.host import RetrofitError
from ..._surgery.registry import Retrofit
from .padding import padded_forward

__all__ = ["predict_batched", "predict_proba_batched", "size_groups", "PADDING_ROWS"]

PADDING_ROWS = 64
"""How many padded rows a forward may compute beyond its real ones: about what a forward's fixed
cost is worth in rows on one CPU core. On the benchmark's ragged ensembles
(``benchmarks/bench_tabular.py``) one forward for every call ran slower than the loop, and a
budget proportional to the rows let groups of a few hundred rows pad more than a forward saves."""


class _Calls:
    """The model as a ``predict`` sees it: records its calls, or answers them in order."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.calls: list[tuple[Tensor, Tensor, bool]] = []
        self.answers: list[Tensor] | None = None
        self.served = 0

    def __getattr__(self, name: str) -> Any:            # the model's attributes the vendor reads
        return getattr(self.__dict__["model"], name)

    def __call__(self, x_src: Tensor, y_src: Tensor, is_cls: bool) -> Tensor:
        if self.answers is None:
            self.calls.append((x_src, y_src, is_cls))
            return x_src.new_zeros(x_src.shape[1] - y_src.shape[1], x_src.shape[0],
                                   self.model.n_out + self.model.regression_bin_count)
        index, self.served = self.served, self.served + 1
        x, y, task = self.calls[index] if index < len(self.calls) else (None, None, None)
        if not (task == is_cls and torch.equal(x, x_src) and torch.equal(y, y_src)):
            raise RetrofitError(
                "predict_batched: the vendor's predict called the model with other inputs the "
                "second time (an ensemble drawn from fresh entropy); pass seed=<int>")
        return self.answers[index]


def size_groups(sizes: Sequence[tuple[int, int, int]], budget: float) -> list[list[int]]:
    """The calls of ``sizes`` (per call: batch lanes ``B_k``, context rows ``N_k``, test rows
    ``M_k``) in groups, one padded forward each: in order of ``(N_k, M_k)``, a group takes the
    next call while its padded rows ``Σ B_k · (max N + max M)`` exceed its rows
    ``Σ B_k (N_k + M_k)`` by at most ``budget``. A padded row costs what a real one does (every
    token-local layer and the attention compute it), so one forward over very different sizes
    can cost more than the loop it replaces; calls of one size (an ensemble's) always share a
    forward."""
    groups: list[list[int]] = []
    lanes = rows = n_max = m_max = 0
    for index in sorted(range(len(sizes)), key=lambda i: sizes[i][1:]):
        b, n, m = sizes[index]
        grown = (lanes + b, rows + b * (n + m), max(n_max, n), max(m_max, m))
        if groups and grown[0] * (grown[2] + grown[3]) - grown[1] <= budget:
            groups[-1].append(index)
            lanes, rows, n_max, m_max = grown
        else:
            groups.append([index])
            lanes, rows, n_max, m_max = b, b * (n + m), n, m
    return groups


def _answer(model: nn.Module, recorders: list[_Calls]) -> None:
    """Every recorded call answered by the padded forwards of :func:`size_groups`; each
    recorder gets its answers ``(M, B, O)``, in call order."""
    calls = [call for recorder in recorders for call in recorder.calls]
    outs: list[Tensor] = [None] * len(calls)  # type: ignore[list-item]
    sizes = [(x.shape[0], y.shape[1], x.shape[1] - y.shape[1]) for x, y, _ in calls]
    with torch.inference_mode():                  # one estimator's copies: one task flag
        for group in size_groups(sizes, PADDING_ROWS):
            answers = padded_forward(model, [calls[i][0] for i in group],
                                     [calls[i][1] for i in group], calls[0][2])
            for i, answer in zip(group, answers):
                outs[i] = answer
    answered = iter(outs)
    for recorder in recorders:
        recorder.answers = [next(answered) for _ in recorder.calls]


def _full_o_model(estimator: Any) -> nn.Module:
    model = getattr(estimator, "model", None)
    handle = Retrofit.of(model) if isinstance(model, nn.Module) else None
    if handle is None or handle.plan.arm != "full-o":
        raise RetrofitError(
            "predict_batched needs an estimator retrofitted with the full-o arm "
            "(oretrofit.tabdpt.make_classifier / make_regressor with arm='full-o'): only there "
            "is the padding between datasets inert; use a loop of fit and predict otherwise")
    return model


def _run(estimator: Any, method: str, X_train_list: Sequence[Any], y_train_list: Sequence[Any],
         X_test_list: Sequence[Any], predict_kwargs: dict[str, Any]) -> list[Any]:
    model = _full_o_model(estimator)
    if not len(X_train_list) == len(y_train_list) == len(X_test_list):
        raise RetrofitError(f"predict_batched needs one X_train, y_train and X_test per dataset; "
                            f"got {len(X_train_list)}, {len(y_train_list)} and "
                            f"{len(X_test_list)}")
    # each copy shares the model; a retrieval index is left behind (fit builds its own)
    shared = {id(model): model, id(getattr(estimator, "faiss_knn", None)): None}
    copies = []
    for x_train, y_train in zip(X_train_list, y_train_list):
        fitted = copy.deepcopy(estimator, memo=dict(shared))
        fitted.fit(x_train, y_train)
        fitted.model = _Calls(model)
        copies.append(fitted)
    for fitted, x_test in zip(copies, X_test_list):
        getattr(fitted, method)(x_test, **predict_kwargs)
    _answer(model, [fitted.model for fitted in copies])
    return [getattr(fitted, method)(x_test, **predict_kwargs)
            for fitted, x_test in zip(copies, X_test_list)]


def predict_batched(estimator: Any, X_train_list: Sequence[Any], y_train_list: Sequence[Any],
                    X_test_list: Sequence[Any], **predict_kwargs: Any) -> list[Any]:
    """``estimator.predict`` of every dataset after fitting it on that dataset, the datasets'
    model calls answered by padded forwards (see the module docstring).

    Args:
        estimator: a ``TabDPTClassifier`` or ``TabDPTRegressor`` from
            :func:`oretrofit.tabdpt.make_classifier` / ``make_regressor`` with ``full-o``;
            fitted or not, it is left unchanged.
        X_train_list, y_train_list, X_test_list: one entry per dataset (numpy arrays, as the
            vendor's ``fit``/``predict`` take); rows, features and classes may all differ.
        predict_kwargs: passed to every ``predict`` by the vendor's names (``n_ensembles``,
            ``seed``, ``context_size``…); ``n_ensembles > 1`` needs ``seed``.
    Returns:
        One ``predict`` result per dataset, in input order.
    """
    return _run(estimator, "predict", X_train_list, y_train_list, X_test_list, predict_kwargs)


def predict_proba_batched(estimator: Any, X_train_list: Sequence[Any],
                          y_train_list: Sequence[Any], X_test_list: Sequence[Any],
                          **predict_kwargs: Any) -> list[Any]:
    """:func:`predict_batched` with the classifier's ``predict_proba``."""
    if not hasattr(estimator, "predict_proba"):
        raise RetrofitError("predict_proba_batched needs a classifier (make_classifier); use "
                            "predict_batched for a regressor")
    return _run(estimator, "predict_proba", X_train_list, y_train_list, X_test_list,
                predict_kwargs)
