"""Ragged batched prediction for Mitra: many datasets through one retrofitted estimator, all
their model calls answered by one padded forward (:mod:`.padding`), no mask.

Contract. For datasets ``d = 0..D-1``, each ``(X_train_d, y_train_d, X_test_d)``::

    predict_batched(est, X_train_list, y_train_list, X_test_list)[d]
        == clone(est).fit(X_train_d, y_train_d).predict(X_test_d)

up to float summation order (the tests hold it to 1e-5 in float32). The steps:

1. *fit, then record*: per dataset, a clone of the estimator is fitted, and its ``predict``
   runs once with each ensemble member's model replaced by a shadow that keeps each call's six
   inputs (and the autocast it ran under) and answers zeros; the member's generator (the
   vendor's predict draws the support rows' order from it) is restored afterwards.
2. *one padded forward* per autocast setting: :func:`.padding.padded_forward` answers every
   recorded call at once.
3. *replay*: each clone's ``predict`` runs again with its models answering from that forward,
   so the vendor decodes them (class slicing, softmax, ensemble average, target scale) as it
   would its own forward's.

Fine-tuning gives each dataset's model its own weights, which no single forward can share:
the estimator must be made with ``fine_tune=False``.
"""

from __future__ import annotations

from typing import Any, Sequence

import sklearn
import torch
from torch import Tensor, nn

from ..._surgery.host import RetrofitError
from ..._surgery.shadow import shadow
from .padding import padded_forward

__all__ = ["predict_batched", "predict_proba_batched"]


class _Member:
    """One ensemble member of one fitted clone: its calls, recorded then answered in order."""

    def __init__(self, trainer: Any) -> None:
        self.trainer, self.model = trainer, trainer.model
        self.rng_state = trainer.rng.get_state()
        self.calls: list[tuple[Tensor, ...]] = []
        self.autocast: list[tuple] = []
        self.answers: list[Tensor] = []

    def record(self, *inputs: Tensor) -> Tensor:
        device = inputs[0].device.type
        self.calls.append(tuple(t.clone() for t in inputs))
        self.autocast.append((device, torch.is_autocast_enabled(device),
                              torch.get_autocast_dtype(device)))
        width = self.model.dim_output                 # the vendor drops a width of 1
        return inputs[0].new_zeros(inputs[2].shape[:2] + ((width,) if width > 1 else ()))

    def replay(self, *inputs: Tensor) -> Tensor:
        index, self.served = self.served, self.served + 1
        if index >= len(self.calls) or not all(
                torch.equal(a, b) for a, b in zip(inputs, self.calls[index])):
            raise RetrofitError("predict_batched: the vendor's predict called the model with "
                                "other inputs the second time; is the estimator deterministic?")
        return self.answers[index]

    def run(self, mode: str) -> None:
        """Put the recording (``record``) or answering (``replay``) shadow in the member's
        place, from the member's generator state before the first predict."""
        self.trainer.rng.set_state(self.rng_state)
        self.served = 0
        self.trainer.model = shadow(self.model, forward=getattr(self, mode))

    def restore(self) -> None:
        self.trainer.model = self.model


def _check(estimator: Any) -> None:
    if getattr(estimator, "arm", None) != "full-o" or not hasattr(estimator, "check_retrofit"):
        raise RetrofitError(
            "predict_batched needs an estimator retrofitted with the full-o arm "
            "(oretrofit.hosts.mitra.make_classifier / make_regressor with arm='full-o'): only "
            "there is the padding between datasets inert; use a loop of fit and predict "
            "otherwise")
    if estimator.fine_tune:
        raise RetrofitError("predict_batched needs fine_tune=False: fine-tuning gives each "
                            "dataset's model its own weights, which one forward cannot share")


def _answer(members: list[_Member]) -> None:
    """One padded forward per autocast setting, answering every recorded call."""
    model = members[0].model
    groups: dict[tuple, list[tuple[_Member, int]]] = {}
    for member in members:
        member.answers = [None] * len(member.calls)
        for index, setting in enumerate(member.autocast):
            groups.setdefault(setting, []).append((member, index))
    for (device, enabled, dtype), entries in groups.items():
        with torch.no_grad(), torch.autocast(device, dtype=dtype, enabled=enabled):
            outs = padded_forward(model, [m.calls[i] for m, i in entries])
        for (member, index), out in zip(entries, outs):
            member.answers[index] = out


def _run(estimator: Any, method: str, X_train_list: Sequence[Any], y_train_list: Sequence[Any],
         X_test_list: Sequence[Any]) -> list[Any]:
    _check(estimator)
    if not len(X_train_list) == len(y_train_list) == len(X_test_list):
        raise RetrofitError(f"predict_batched needs one X_train, y_train and X_test per dataset; "
                            f"got {len(X_train_list)}, {len(y_train_list)} and "
                            f"{len(X_test_list)}")
    fitted = [sklearn.clone(estimator).fit(x, y) for x, y in zip(X_train_list, y_train_list)]
    members = [[_Member(trainer) for trainer in clone.trainers] for clone in fitted]
    try:
        for clone, own, x_test in zip(fitted, members, X_test_list):
            for member in own:
                member.run("record")
            getattr(clone, method)(x_test)
        _answer([member for own in members for member in own])
        out = []
        for clone, own, x_test in zip(fitted, members, X_test_list):
            for member in own:
                member.run("replay")
            out.append(getattr(clone, method)(x_test))
        return out
    finally:
        for own in members:
            for member in own:
                member.restore()


def predict_batched(estimator: Any, X_train_list: Sequence[Any], y_train_list: Sequence[Any],
                    X_test_list: Sequence[Any]) -> list[Any]:
    """``estimator.predict`` of every dataset after fitting a clone of it on that dataset, the
    datasets' model calls answered by one padded forward (see the module docstring).

    Args:
        estimator: a classifier or regressor from :func:`oretrofit.hosts.mitra.make_classifier`
            / ``make_regressor`` with ``full-o`` and ``fine_tune=False``; left unchanged.
        X_train_list, y_train_list, X_test_list: one entry per dataset (arrays or frames, as the
            vendor's ``fit``/``predict`` take); rows, features and classes may all differ.
    Returns:
        One ``predict`` result per dataset, in input order.
    """
    return _run(estimator, "predict", X_train_list, y_train_list, X_test_list)


def predict_proba_batched(estimator: Any, X_train_list: Sequence[Any],
                          y_train_list: Sequence[Any], X_test_list: Sequence[Any]) -> list[Any]:
    """:func:`predict_batched` with the classifier's ``predict_proba``."""
    if not hasattr(estimator, "predict_proba"):
        raise RetrofitError("predict_proba_batched needs a classifier (make_classifier); use "
                            "predict_batched for a regressor")
    return _run(estimator, "predict_proba", X_train_list, y_train_list, X_test_list)
