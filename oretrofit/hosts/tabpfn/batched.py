"""Ragged batched prediction: many datasets of different sizes in one TabPFN forward, the
padding made inert by the presence gates of a retrofitted host.

Contract. For datasets ``d = 0..D-1``, each ``(X_train_d, y_train_d, X_test_d)``::

    predict_batched(est, X_train_list, y_train_list, X_test_list)[d]
        == copy(est).fit(X_train_d, y_train_d).predict(X_test_d)

up to float summation order (the tests hold it to 1e-5 relative). The steps:

1. *fit*: one shallow copy of the estimator per dataset, fitted by tabpfn itself
   (``fit_mode="fit_preprocessors"``): each dataset's preprocessing, per ensemble member, is
   exactly what ``fit`` builds.
2. *record*: each copy's ``predict`` runs with the model's forward replaced by a recorder that
   keeps the model inputs ``x (R_k, B_k, C_k)``, ``y (N_k, B_k)`` of every forward call ``k``
   (``B_k`` ensemble members) and answers zeros.
3. *one forward*: the recorded inputs stacked on the batch dimension and zero-padded, rows as
   ``[train 0..N_k | pad to N | test 0..M_k | pad to M]`` and columns to ``C``, with no
   attention mask anywhere. The padding is inert because its carriers are zero at every
   boundary where the architecture creates tokens (:mod:`.padding`: v3 and v3.5 at their cell
   tokens, row tokens and ICL target embedding; v2, v2.5 and v2.6 at the first block's input),
   and a zero carrier has presence 0. Each dataset's cells are standardised and grouped by the
   model's own step on that dataset alone.
4. *replay*: each copy's ``predict`` again, the forward answering that call's slice of the
   batched output, so tabpfn decodes every dataset (borders, target transforms, ensemble
   averaging, class order) as its ``predict`` does.

Which arm suffices. v3 and v3.5: ``oa`` when every dataset has the same model width (only rows
are padded): the zero-padded cells and rows stay zero through the bias-free, ungated MLPs and
norms. Padded columns also need ``te.col``: the column target embedding is added to every cell
of a train row, so a padded cell keeps a zero carrier only under OInject's gate (``full-o``).
v2, v2.5 and v2.6: ``oa`` always (no addition behind the boundary; the post-norms have no
affine part and the MLPs no bias, so a zero token stays zero). ``base`` never.
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import os
import re
from typing import Any, Iterator, Sequence

import torch
from torch import Tensor, nn

from ..._host import RetrofitError
from ..._registry import Retrofit
from .padding import (BlockInput, CellAndRowTokens, Layout, RecordedCall, boundaries_of,
                      instance_attr, n_out)

__all__ = ["predict_batched", "predict_proba_batched"]


def _batched_forward(model: nn.Module, layout: Layout,
                     bounds: CellAndRowTokens | BlockInput) -> list[Tensor]:
    """One forward over every recorded call; returns each call's ``(M_k, B_k, …)`` output."""
    first = layout.calls[0]
    x = first.x.new_zeros(layout.n + layout.m, layout.lanes, layout.c)
    y = first.y.new_zeros(layout.n, layout.lanes)
    categorical: list[Any] = []
    for call, lanes in layout.parts():
        train, test = layout.rows(call)
        width = call.x.shape[2]
        x[train, lanes, :width] = call.x[:call.n_train]
        x[test, lanes, :width] = call.x[call.n_train:]
        y[train, lanes] = call.y
        categorical += call.kwargs.get("categorical_inds") or [[]] * call.x.shape[1]
    kwargs = dict(first.kwargs, categorical_inds=categorical)
    options = kwargs.get("performance_options")
    if options is not None and hasattr(options, "enable_torch_compile"):
        kwargs["performance_options"] = dataclasses.replace(options, enable_torch_compile=False)
    enabled, dtype = first.autocast
    with torch.autocast(x.device.type, dtype=dtype, enabled=enabled):
        out = bounds.forward(model, layout, x, y, kwargs)
    return [out[:call.n_test, lanes].clone() for call, lanes in layout.parts()]


class _Forwards:
    """The model's forward replaced, for the duration of the block, by a recorder (``record``:
    keep the inputs, answer zeros) or a replayer (answer the batched outputs in call order)."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.calls: list[RecordedCall] = []
        self.outputs: list[Tensor] | None = None
        self.dataset = -1
        self._next = 0

    def _record(self, x: Any, y: Any, **kwargs: Any) -> Tensor:
        if isinstance(x, (dict, type(None))) or isinstance(y, (dict, type(None))) \
                or kwargs.get("kv_cache") is not None or kwargs.get("return_kv_cache") \
                or not kwargs.get("only_return_standard_out", True):
            raise RuntimeError("predict_batched: tabpfn called the model in a way it does not "
                               "batch (dict inputs, a KV cache or the embeddings)")
        y2 = y.reshape(y.shape[0], -1) if y.dim() == 1 or y.dim() == 3 else y
        device = x.device.type
        autocast = (torch.is_autocast_enabled(device), torch.get_autocast_dtype(device))
        self.calls.append(RecordedCall(self.dataset, x, y2, kwargs, autocast))
        return x.new_zeros(x.shape[0] - y.shape[0], x.shape[1], n_out(self.model, kwargs))

    def _replay(self, x: Any, y: Any, **kwargs: Any) -> Tensor:
        assert self.outputs is not None
        k, self._next = self._next, self._next + 1
        call = self.calls[k] if k < len(self.calls) else None
        if call is None or call.dataset != self.dataset or call.x.shape != x.shape \
                or not torch.equal(call.y, y.reshape(call.y.shape)):
            raise RuntimeError(f"predict_batched: dataset {self.dataset}'s predict called the "
                               "model differently the second time (is its preprocessing "
                               "random without a seed?)")
        return self.outputs[k]

    @contextlib.contextmanager
    def mode(self, name: str) -> Iterator[None]:
        stub = self._record if name == "record" else self._replay

        @functools.wraps(self.model.forward)                  # tabpfn reads its signature
        def wrapped(*args: Any, **kwargs: Any) -> Tensor:
            return stub(*args, **kwargs)

        with instance_attr(self.model, "forward", wrapped):
            yield


def _sites_needed(model: nn.Module, bounds: CellAndRowTokens | BlockInput, layout: Layout
                  ) -> None:
    """Refuse a retrofit that leaves a site open through which padding would leak."""
    retrofit = Retrofit.of(model)
    patched = set() if retrofit is None else {row["site"] for row in retrofit.report()}
    from .host import HOST
    patterns = bounds.sites + (bounds.width_sites if any(c.x.shape[2] != layout.c
                                                         for c in layout.calls) else ())
    needed = [s.name for s in HOST.sites(model)
              if any(re.fullmatch(p, s.name) for p in patterns)]
    missing = [name for name in needed if name not in patched]
    if missing:
        why = ("datasets of different model widths pad columns, which " if
               any(re.fullmatch(p, missing[0]) for p in bounds.width_sites) else "padding ")
        arms = ("'full-o' (make_regressor/make_classifier(..., 'full-o')), or 'oa' for datasets "
                "of one width" if bounds.width_sites else "'oa' or 'full-o' "
                "(make_regressor/make_classifier(..., 'oa'))")
        raise RetrofitError(
            f"predict_batched: {why}needs the sites {', '.join(missing[:6])}"
            f"{' …' if len(missing) > 6 else ''} patched; retrofit with arm {arms}")


def _available_memory(device: torch.device) -> int:
    """Free device memory: CUDA's free bytes; on the CPU, Linux's ``MemAvailable`` (free plus
    reclaimable cache), else the free physical pages."""
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return int(os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"))


def _cells(calls: Sequence[RecordedCall]) -> tuple[int, int]:
    """(padded, real) cell counts of stacking ``calls``: ``lanes·(N+M)·C``, ``Σ B_k·R_k·C_k``."""
    layout = Layout.of(list(calls))
    return (layout.lanes * (layout.n + layout.m) * layout.c,
            sum(c.x.shape[0] * c.x.shape[1] * c.x.shape[2] for c in calls))


def _groups(calls: list[RecordedCall], max_padding: float | None) -> list[list[int]]:
    """The forwards to run: one over every call (``max_padding`` None), else the calls sorted
    by size and cut greedily so that each group's padded cells stay within ``max_padding``
    times its real cells."""
    if max_padding is None:
        return [list(range(len(calls)))]
    if max_padding < 1:
        raise RetrofitError(f"max_padding must be None or >= 1 (padded over real cells); got "
                            f"{max_padding}")
    order = sorted(range(len(calls)), key=lambda k: (calls[k].x.shape[2], calls[k].x.shape[0]))
    groups: list[list[int]] = []
    for k in order:
        if groups:
            padded, real = _cells([calls[j] for j in (*groups[-1], k)])
            if padded <= max_padding * real:
                groups[-1].append(k)
                continue
        groups.append([k])
    return groups


def _check_memory(model: nn.Module, bounds: CellAndRowTokens | BlockInput,
                  calls: list[RecordedCall], budget: int | None) -> None:
    """Name the first dataset whose addition makes the padded batch outgrow ``budget``: the
    architecture's ``footprint``, a coarse upper estimate of the batched forward's activations
    (a guard against hopeless batches, not a measurement), against the device's free memory
    or ``memory_budget``."""
    budget = _available_memory(calls[0].x.device) if budget is None else budget
    for k in range(len(calls)):
        need = bounds.footprint(model, Layout.of(calls[:k + 1]))
        if need > budget:
            d, names = calls[k].dataset, sorted({c.dataset for c in calls[:k + 1]})
            ahead = ("it alone" if names == [d] else f"datasets 0..{d} padded together"
                     if names == list(range(d + 1)) else
                     f"datasets {', '.join(map(str, names))} padded together")
            raise RetrofitError(
                f"predict_batched: dataset {d}: {ahead} need about {need / 2**30:.2f} GiB, more "
                f"than the {budget / 2**30:.2f} GiB available; pass fewer datasets per call "
                f"(e.g. the first {d}, then the rest), or smaller ones")


@contextlib.contextmanager
def _dataset(index: int, what: str) -> Iterator[None]:
    """Re-raise any failure of one dataset's ``what`` naming the dataset."""
    try:
        yield
    except RetrofitError as exc:
        if str(exc).startswith("predict_batched"):
            raise
        raise RetrofitError(f"predict_batched: dataset {index}: {exc}") from exc
    except Exception as exc:
        raise RetrofitError(f"predict_batched: dataset {index}: tabpfn's {what} refuses it "
                            f"({type(exc).__name__}: {exc}); fix or drop X_train_list[{index}], "
                            f"y_train_list[{index}], X_test_list[{index}]") from exc


def _estimator_model(estimator: Any) -> nn.Module:
    model = getattr(getattr(estimator, "model_path", None), "model", None)
    if not isinstance(model, nn.Module):
        raise RetrofitError("predict_batched takes an estimator from oretrofit.tabpfn."
                            "make_regressor/make_classifier (its model_path the retrofitted "
                            f"model); got {type(estimator).__name__} with model_path "
                            f"{type(getattr(estimator, 'model_path', None)).__name__}")
    return model


def _run(estimator: Any, method: str, X_train_list: Sequence[Any], y_train_list: Sequence[Any],
         X_test_list: Sequence[Any], kwargs: dict[str, Any], memory_budget: int | None,
         max_padding: float | None) -> list[Any]:
    lengths = (len(X_train_list), len(y_train_list), len(X_test_list))
    if len(set(lengths)) != 1 or lengths[0] == 0:
        raise RetrofitError("predict_batched: X_train_list, y_train_list and X_test_list must "
                            f"be non-empty and of one length; got {lengths[0]}, {lengths[1]} "
                            f"and {lengths[2]} datasets")
    model = _estimator_model(estimator)
    bounds = boundaries_of(model)
    forwards, fitted = _Forwards(model), []
    for i, (x, y) in enumerate(zip(X_train_list, y_train_list)):
        worker = copy.copy(estimator)
        worker.fit_mode = "fit_preprocessors"      # the forward runs at predict, no KV cache
        with _dataset(i, "fit"):
            worker.fit(x, y)
        models = getattr(worker, "models_", [model])
        if len(models) != 1 or models[0] is not model:
            raise RetrofitError("predict_batched: the fitted estimator does not run the "
                                "retrofitted model of its model_path (several models?)")
        if len(getattr(worker, "devices_", ())) > 1:
            raise RetrofitError("predict_batched runs one forward on one device; pass one "
                                "device (device='cpu' or 'cuda:0')")
        fitted.append(worker)
    with forwards.mode("record"):
        for i, (worker, x) in enumerate(zip(fitted, X_test_list)):
            forwards.dataset = i
            with _dataset(i, "predict"):
                getattr(worker, method)(x, **kwargs)
    if forwards.calls:
        forwards.outputs = [torch.empty(0)] * len(forwards.calls)
        for group in _groups(forwards.calls, max_padding):
            calls = [forwards.calls[k] for k in group]
            layout = Layout.of(calls)
            _sites_needed(model, bounds, layout)
            _check_memory(model, bounds, calls, memory_budget)
            with torch.inference_mode():
                try:
                    outputs = _batched_forward(model, layout, bounds)
                except torch.OutOfMemoryError as exc:
                    raise RetrofitError(f"predict_batched: the padded batch of {len(fitted)} "
                                        "datasets ran out of memory; pass fewer datasets per "
                                        "call") from exc
            for k, output in zip(group, outputs):
                forwards.outputs[k] = output
    results = []
    with forwards.mode("replay"):
        for i, (worker, x) in enumerate(zip(fitted, X_test_list)):
            forwards.dataset = i
            results.append(getattr(worker, method)(x, **kwargs))
    return results


def predict_batched(estimator: Any, X_train_list: Sequence[Any], y_train_list: Sequence[Any],
                    X_test_list: Sequence[Any], *, memory_budget: int | None = None,
                    max_padding: float | None = None, **predict_kwargs: Any) -> list[Any]:
    """``estimator.predict`` of every dataset after fitting it on that dataset, with one model
    forward for all of them (see the module docstring for the contract and the padding).

    Args:
        estimator: a ``TabPFNRegressor`` or ``TabPFNClassifier`` from
            :func:`oretrofit.tabpfn.make_regressor` / ``make_classifier`` (``full-o``; ``oa``
            when every dataset has the same model width); fitted or not, it is left unchanged.
        X_train_list, y_train_list, X_test_list: one entry per dataset; rows, features, target
            scale and classes may all differ.
        memory_budget: bytes the padded forward may use (default: the device's free memory).
        max_padding: None (default): one forward over every dataset. A number ``>= 1``: the
            datasets sorted by width and rows and cut into forwards whose padded cells stay
            within ``max_padding`` times their real cells (less padding, more forwards).
        predict_kwargs: passed to every ``predict`` (e.g. ``output_type``, ``quantiles``).
    Returns:
        One ``predict`` result per dataset, in input order.
    Raises:
        RetrofitError: lists of different lengths; a dataset tabpfn refuses (named, with its
            index); a retrofit that leaves padding visible; a batch beyond ``memory_budget``.
    """
    return _run(estimator, "predict", X_train_list, y_train_list, X_test_list, predict_kwargs,
                memory_budget, max_padding)


def predict_proba_batched(estimator: Any, X_train_list: Sequence[Any],
                          y_train_list: Sequence[Any], X_test_list: Sequence[Any], *,
                          memory_budget: int | None = None, max_padding: float | None = None,
                          **predict_kwargs: Any) -> list[Any]:
    """:func:`predict_batched` with the classifier's ``predict_proba``."""
    if not hasattr(estimator, "predict_proba"):
        raise RetrofitError("predict_proba_batched needs a classifier (make_classifier); use "
                            "predict_batched for a regressor")
    return _run(estimator, "predict_proba", X_train_list, y_train_list, X_test_list,
                predict_kwargs, memory_budget, max_padding)
