"""Ragged batched prediction: many datasets of different sizes in few TabPFN forwards, the
padding made inert by the presence gates of a retrofitted host.

Contract. For datasets ``d = 0..D-1``, each ``(X_train_d, y_train_d, X_test_d)``::

    predict_batched(est, X_train_list, y_train_list, X_test_list)[d]
        == copy(est).fit(X_train_d, y_train_d).predict(X_test_d)

up to float summation order (the tests hold it to 1e-5 relative). The steps:

1. *fit and predict, once*: per dataset, one shallow copy of the estimator, fitted and
   predicting by tabpfn itself (``fit_mode="fit_preprocessors"``), on a thread of its own
   (:mod:`.rendezvous`; ``n_jobs`` at work at once). Its model is a :func:`.padding.shadow`
   of the retrofitted one whose forward posts the model inputs ``x (R_k, B_k, C_k)``,
   ``y (N_k, B_k)`` of each call ``k`` (``B_k`` ensemble members) and waits for the answer,
   so each dataset's preprocessing runs once and its ``predict`` decodes the answer (borders,
   target transforms, ensemble averaging, class order) as it would its own forward's.
2. *padded forwards*: once every dataset waits (or is done), the posted calls are sorted by
   size and cut into groups (:mod:`.forward_plan`: a measured cost model, or ``max_padding``;
   within the memory budget); each group's inputs are stacked on the batch dimension and
   zero-padded, rows as ``[train 0..N_k | pad to N | test 0..M_k | pad to M]`` and columns to
   ``C``, with no attention mask anywhere. The padding is inert because its carriers are
   zero at every boundary where the architecture creates tokens (:mod:`.padding`: v3 and v3.5
   at their cell tokens, row tokens and ICL target embedding; v2, v2.5 and v2.6 at the first
   block's input), and a zero carrier has presence 0. Each dataset's cells are standardised
   and grouped by the model's own step on that dataset alone.

Nothing is set or hooked on the shared model (the forwards run on shadows of it), so another
thread using the same model meanwhile sees nothing of a batched call.

Which arm suffices. v3 and v3.5: ``oa`` pads rows only: the zero-padded cells and rows stay
zero through the bias-free, ungated MLPs and norms; datasets of different model widths then
get forwards of their own. Padded columns also need ``te.col``: the column target embedding
is added to every cell of a train row, so a padded cell keeps a zero carrier only under
OInject's gate (``full-o``). v2, v2.5 and v2.6: ``oa`` always (no addition behind the
boundary; the post-norms have no affine part and the MLPs no bias, so a zero token stays
zero). ``base`` never.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import copy
import dataclasses
import functools
import math
import numbers
import os
import re
import threading
from typing import Any, Callable, Iterator, Sequence

import torch
from torch import Tensor, nn

from ..._surgery.host import RetrofitError
from ..._surgery.registry import Retrofit
from . import forward_plan, reload
from .checkpoints import build_model, load_checkpoint
from .estimators import in_memory_specs, vendor_class
from .padding import (BlockInput, CellAndRowTokens, Layout, RecordedCall, boundaries_of,
                      shadow)
from .rendezvous import Aborted, Rendezvous
from .rng_forks import serialized_rng_forks

__all__ = ["predict_batched", "predict_proba_batched", "default_jobs"]


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


def _recorded(dataset: int, x: Any, y: Any, **kwargs: Any) -> RecordedCall:
    """One model call of dataset ``dataset``'s ``predict``, refused where it does not batch."""
    if isinstance(x, (dict, type(None))) or isinstance(y, (dict, type(None))) \
            or kwargs.get("kv_cache") is not None or kwargs.get("return_kv_cache") \
            or not kwargs.get("only_return_standard_out", True):
        raise RuntimeError("predict_batched: tabpfn called the model in a way it does not "
                           "batch (dict inputs, a KV cache or the embeddings)")
    y2 = y.reshape(y.shape[0], -1) if y.dim() == 1 or y.dim() == 3 else y
    device = x.device.type
    autocast = (torch.is_autocast_enabled(device), torch.get_autocast_dtype(device))
    return RecordedCall(dataset, x, y2, kwargs, autocast)


def _sites_needed(model: nn.Module, bounds: CellAndRowTokens | BlockInput) -> bool:
    """Refuse a retrofit that leaves a site open through which padded rows would leak; True
    when the column sites are patched too (datasets of different widths may share a
    forward)."""
    retrofit = Retrofit.of(model)
    patched = set() if retrofit is None else {row["site"] for row in retrofit.report()
                                              if row["state"] == "patched"}
    from .host import HOST
    names = [s.name for s in HOST.sites(model)]

    def missing(patterns: tuple[str, ...]) -> list[str]:
        return [n for n in names if any(re.fullmatch(p, n) for p in patterns)
                and n not in patched]

    open_sites = missing(bounds.sites)
    if open_sites:
        arms = ("'full-o' (make_regressor/make_classifier(..., 'full-o')), or 'oa' for datasets "
                "of one width" if bounds.width_sites else "'oa' or 'full-o' "
                "(make_regressor/make_classifier(..., 'oa'))")
        raise RetrofitError(
            f"predict_batched: padding needs the sites {', '.join(open_sites[:6])}"
            f"{' …' if len(open_sites) > 6 else ''} patched; retrofit with arm {arms}")
    return not missing(bounds.width_sites)


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


@contextlib.contextmanager
def _dataset(index: int, what: str) -> Iterator[None]:
    """Re-raise any failure of one dataset's ``what`` naming the dataset."""
    try:
        yield
    except Aborted:
        raise
    except RetrofitError as exc:
        if str(exc).startswith("predict_batched"):
            raise
        raise RetrofitError(f"predict_batched: dataset {index}: {exc}") from exc
    except Exception as exc:
        raise RetrofitError(f"predict_batched: dataset {index}: tabpfn's {what} refuses it "
                            f"({type(exc).__name__}: {exc}); fix or drop X_train_list[{index}], "
                            f"y_train_list[{index}], X_test_list[{index}]") from exc


def _estimator_model(estimator: Any) -> nn.Module:
    model_path = getattr(estimator, "model_path", None)
    if isinstance(model_path, (str, os.PathLike)):      # a plain checkpoint: its sites refused
        fitted = getattr(estimator, "models_", None)
        return fitted[0] if fitted else (reload.patched_model(model_path, claim=True)
                                         or build_model(load_checkpoint(model_path))[0])
    model = getattr(model_path, "model", None)
    if not isinstance(model, nn.Module):
        raise RetrofitError("predict_batched takes an estimator from oretrofit.tabpfn."
                            "make_regressor/make_classifier (its model_path a patched "
                            f"artifact); got {type(estimator).__name__} with model_path "
                            f"{model_path!r:.200}")
    return model


def _with_model(estimator: Any, model: nn.Module) -> Any:
    """tabpfn's in-memory model spec of ``estimator``'s model_path running ``model`` instead."""
    specs = estimator.model_path
    if isinstance(specs, (str, os.PathLike)):
        task = "classifier" if isinstance(estimator, vendor_class("classifier")) else "regressor"
        return in_memory_specs(specs, model, task)
    if dataclasses.is_dataclass(specs):
        return dataclasses.replace(specs, model=model)
    if hasattr(specs, "_replace"):                                  # a NamedTuple
        return specs._replace(model=model)
    copied = copy.copy(specs)
    copied.model = model
    return copied


_MOVES = threading.Lock()         # held by the thread moving a shared model's parameters


@functools.cache
def _moving_one_at_a_time(cls: type) -> type:
    """``cls`` whose ``to`` / ``type`` / ``float`` … hold :data:`_MOVES` throughout.

    tabpfn moves its model to the device and inference dtype in every ``predict``; here each
    dataset's predict runs on a thread of its own, on a shadow that shares the model's
    parameters, so the moves reach the one shared model. ``Module._apply`` replaces a
    parameter's storage in place (``param.data = converted``); a second thread converting the
    same parameter meanwhile reads storage the first has just freed (torch releases the GIL
    inside the conversion) and writes back what it read: garbage weights, or a crash. One move
    at a time, the first converts and the others find the model converted. (A subclass, not an
    attribute of the shadow, so a copy tabpfn makes of the shadow moves itself.)
    """
    def _apply(self: nn.Module, *args: Any, **kwargs: Any) -> nn.Module:
        with _MOVES:
            return cls._apply(self, *args, **kwargs)

    return type(cls.__name__, (cls,), {"_apply": _apply, "__module__": cls.__module__,
                                       "__qualname__": cls.__qualname__})


def _fit_and_predict(estimator: Any, model: nn.Module, method: str, index: int, x_train: Any,
                     y_train: Any, x_test: Any, kwargs: dict[str, Any],
                     forward: Callable[..., Tensor]) -> Any:
    """Dataset ``index``'s fit and predict on a copy of ``estimator`` whose model (a shadow
    of ``model``) answers its forwards with ``forward``."""
    proxy = shadow(model, forward=functools.wraps(model.forward)(forward))  # tabpfn reads
    proxy.__class__ = _moving_one_at_a_time(type(proxy))                  # its signature
    worker = copy.copy(estimator)
    worker.model_path = _with_model(estimator, proxy)
    worker.fit_mode = "fit_preprocessors"          # the forward runs at predict, no KV cache
    with _dataset(index, "fit"):
        worker.fit(x_train, y_train)
    models = getattr(worker, "models_", [proxy])
    if len(models) != 1 or models[0] is not proxy:
        raise RetrofitError("predict_batched: the fitted estimator does not run the "
                            "retrofitted model of its model_path (several models?)")
    if len(getattr(worker, "devices_", ())) > 1:
        raise RetrofitError("predict_batched runs one forward on one device; pass one "
                            "device (device='cpu' or 'cuda:0')")
    with _dataset(index, "predict"):
        return getattr(worker, method)(x_test, **kwargs)


class _Forwards:
    """The padded forwards of one ``predict_batched`` call over the calls of each round."""

    def __init__(self, model: nn.Module, bounds: CellAndRowTokens | BlockInput,
                 options: "_Options") -> None:
        self.model, self.bounds, self.options = model, bounds, options
        self.pad_width = _sites_needed(model, bounds)

    def run(self, group: list[RecordedCall]) -> list[Tensor]:
        """One padded forward over ``group`` (a call alone: the model's own forward, as
        tabpfn made it, on a private shadow); each call's output."""
        with torch.inference_mode():
            try:
                if len(group) > 1:
                    return _batched_forward(self.model, Layout.of(group), self.bounds)
                call = group[0]
                enabled, dtype = call.autocast
                with torch.autocast(call.x.device.type, dtype=dtype, enabled=enabled):
                    return [self.bounds.private(self.model)(call.x, call.y, **call.kwargs)]
            except torch.OutOfMemoryError as exc:
                raise RetrofitError(f"predict_batched: the padded batch of {len(group)} model "
                                    "calls ran out of memory; pass memory_budget= (bytes) "
                                    "below the device's free memory") from exc

    def answers(self, calls: list[RecordedCall]) -> list[Tensor]:
        """The output of every call, from the forwards :func:`forward_plan.groups` chooses;
        on the CPU with ``n_jobs > 1`` the forwards run side by side."""
        device = calls[0].x.device
        budget = self.options.memory_budget
        cut = forward_plan.groups(
            self.model, self.bounds, calls,
            budget=_available_memory(device) if budget is None else budget,
            pad_width=self.pad_width, max_padding=self.options.max_padding,
            costs=lambda: forward_plan.measured_costs(self.model, calls[0], self.run))
        members = [[calls[k] for k in group] for group in cut]
        if device.type == "cpu" and self.options.n_jobs > 1 and len(cut) > 1:
            with concurrent.futures.ThreadPoolExecutor(self.options.n_jobs) as pool:
                outputs = list(pool.map(self.run, members))
        else:
            outputs = [self.run(group) for group in members]
        answers: list[Tensor] = [torch.empty(0)] * len(calls)
        for group, output in zip(cut, outputs):
            for k, out in zip(group, output):
                answers[k] = out
        return answers


def _run(estimator: Any, method: str, X_train_list: Sequence[Any], y_train_list: Sequence[Any],
         X_test_list: Sequence[Any], kwargs: dict[str, Any], options: "_Options") -> list[Any]:
    lengths = (len(X_train_list), len(y_train_list), len(X_test_list))
    if len(set(lengths)) != 1 or lengths[0] == 0:
        raise RetrofitError("predict_batched: X_train_list, y_train_list and X_test_list must "
                            f"be non-empty and of one length; got {lengths[0]}, {lengths[1]} "
                            f"and {lengths[2]} datasets")
    model = _estimator_model(estimator)
    forwards = _Forwards(model, boundaries_of(model), options)
    data = list(zip(X_train_list, y_train_list, X_test_list))
    results: list[Any] = []
    for first in range(0, len(data), _WINDOW):
        results += _run_window(estimator, model, method, forwards, first,
                               data[first:first + _WINDOW], kwargs, options.n_jobs)
    return results


_WINDOW = 512          # datasets in flight at once (a thread and its inputs each)


def _run_window(estimator: Any, model: nn.Module, method: str, forwards: _Forwards, first: int,
                data: list[tuple[Any, Any, Any]], kwargs: dict[str, Any], n_jobs: int
                ) -> list[Any]:
    """Datasets ``first, first + 1, …`` each on a thread, their forwards batched by round."""
    rendezvous = Rendezvous(len(data), n_jobs)
    # datasets seeding torch's global generator on threads side by side take turns
    with serialized_rng_forks():
        for k, dataset in enumerate(data):
            rendezvous.start(k, functools.partial(
                _fit_and_predict, estimator, model, method, first + k, *dataset, kwargs,
                rendezvous.forward(first + k, _recorded)))
        try:
            for posted in rendezvous.rounds():
                rendezvous.answer(posted, forwards.answers([p.call for p in posted]))
        except BaseException:
            rendezvous.abort()
            raise
    if rendezvous.errors:
        raise rendezvous.errors[min(rendezvous.errors)]
    return rendezvous.results


@dataclasses.dataclass(frozen=True)
class _Options:
    """The checked keyword arguments of one ``predict_batched`` call."""

    memory_budget: int | float | None
    max_padding: float | None
    n_jobs: int

    @classmethod
    def checked(cls, estimator: Any, memory_budget: Any, max_padding: Any, n_jobs: Any
                ) -> "_Options":
        """Refuse a wrong type or value by name (a bool is not a number), with the fix."""
        def number(value: Any) -> bool:
            return isinstance(value, numbers.Real) and not isinstance(value, bool) \
                and not math.isnan(value)

        if memory_budget is not None and not (number(memory_budget) and 0 < memory_budget
                                              < math.inf):
            raise RetrofitError(f"predict_batched: memory_budget must be a positive number of "
                                f"bytes (e.g. 8 * 2**30) or None for the device's free memory;"
                                f" got {memory_budget!r}")
        if max_padding is not None and not (number(max_padding) and max_padding >= 1):
            raise RetrofitError(f"predict_batched: max_padding must be None (forwards chosen "
                                "by the measured cost model) or a number >= 1 (padded over "
                                f"real cells; math.inf: as few forwards as fit); got "
                                f"{max_padding!r}")
        if n_jobs is None:
            n_jobs = default_jobs(estimator)
        elif not (isinstance(n_jobs, numbers.Integral) and not isinstance(n_jobs, bool)
                  and n_jobs >= 1):
            raise RetrofitError(f"predict_batched: n_jobs must be a whole number >= 1 (datasets "
                                f"fitted and decoded at once) or None for the cores torch does "
                                f"not use; got {n_jobs!r}")
        return cls(memory_budget, None if max_padding is None else float(max_padding),
                   int(n_jobs))


def default_jobs(estimator: Any) -> int:
    """The cores torch does not need: on the CPU those beyond its intra-op threads, on an
    accelerator all but one (the one that drives it)."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") \
        else os.cpu_count() or 1
    device = str(getattr(estimator, "device", "cpu"))
    accelerator = device.startswith("cuda") or (device == "auto" and torch.cuda.is_available())
    return max(1, cores - (1 if accelerator else torch.get_num_threads()))


def predict_batched(estimator: Any, X_train_list: Sequence[Any], y_train_list: Sequence[Any],
                    X_test_list: Sequence[Any], *, memory_budget: int | float | None = None,
                    max_padding: float | None = None, n_jobs: int | None = None,
                    **predict_kwargs: Any) -> list[Any]:
    """``estimator.predict`` of every dataset after fitting it on that dataset, with the
    datasets' model forwards batched into padded forwards (see the module docstring for the
    contract and the padding).

    Args:
        estimator: a ``TabPFNRegressor`` or ``TabPFNClassifier`` from
            :func:`oretrofit.tabpfn.make_regressor` / ``make_classifier`` (``full-o``; ``oa``
            pads rows only, so datasets of different model widths then never share a
            forward); fitted or not, it is left unchanged.
        X_train_list, y_train_list, X_test_list: one entry per dataset; rows, features, target
            scale and classes may all differ.
        memory_budget: bytes one padded forward may use (default: the device's free memory);
            calls that do not fit together are cut into more forwards.
        max_padding: None (default): the forwards that a cost model measured on this machine
            (per-forward fixed cost, per-cell cost) finds cheapest, never more than the
            per-dataset loop's by that model. A number ``>= 1``: the datasets sorted by width
            and rows and cut into forwards whose padded cells stay within ``max_padding``
            times their real cells (``math.inf``: as few forwards as fit).
        n_jobs: datasets fitted, preprocessed and decoded at once (threads; default: the
            cores torch does not use, at least 1); on the CPU the forwards of one round run
            side by side on as many threads.
        predict_kwargs: passed to every ``predict`` (e.g. ``output_type``, ``quantiles``).
    Returns:
        One ``predict`` result per dataset, in input order.
    Raises:
        RetrofitError: lists of different lengths; a dataset tabpfn refuses (named, with its
            index); a retrofit that leaves padding visible; a dataset that alone needs more
            than ``memory_budget``; an argument of the wrong type or value.
    """
    options = _Options.checked(estimator, memory_budget, max_padding, n_jobs)
    return _run(estimator, "predict", X_train_list, y_train_list, X_test_list, predict_kwargs,
                options)


def predict_proba_batched(estimator: Any, X_train_list: Sequence[Any],
                          y_train_list: Sequence[Any], X_test_list: Sequence[Any], *,
                          memory_budget: int | float | None = None,
                          max_padding: float | None = None, n_jobs: int | None = None,
                          **predict_kwargs: Any) -> list[Any]:
    """:func:`predict_batched` with the classifier's ``predict_proba``."""
    if not hasattr(estimator, "predict_proba"):
        raise RetrofitError("predict_proba_batched needs a classifier (make_classifier); use "
                            "predict_batched for a regressor")
    options = _Options.checked(estimator, memory_budget, max_padding, n_jobs)
    return _run(estimator, "predict_proba", X_train_list, y_train_list, X_test_list,
                predict_kwargs, options)
