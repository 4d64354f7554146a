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
   boundary where the host creates tokens (:data:`BOUNDARIES`), and a zero carrier ``h = 0``
   has presence ``p = ‖h‖²/(τ+‖h‖²) = 0``: an OAttention source of weight exactly 0, a
   receiver whose output is ``p_i · … = 0``, an FFN/norm/inject branch gated by 0. Each
   dataset's cells are standardised and grouped by the model's own step on that dataset alone.
4. *replay*: each copy's ``predict`` again, the forward answering that call's slice of the
   batched output, so tabpfn decodes every dataset (borders, target transforms, ensemble
   averaging, class order) as its ``predict`` does.

``oa`` suffices when every dataset has the same model width (only rows are padded): the
zero-padded cells and rows stay zero through the bias-free, ungated MLPs and norms. Padded
columns also need ``te.col``: the column target embedding is added to every cell of a train
row, so a padded cell keeps a zero carrier only under OInject's gate (``full-o``).
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

__all__ = ["predict_batched", "predict_proba_batched", "Boundaries", "BOUNDARIES"]


@dataclasses.dataclass(frozen=True)
class Boundaries:
    """Where one architecture creates tokens, by attribute name on the model.

    preprocess:  method ``(rows (R, B, C), y, num_train, scaler_cache) -> (cells (B, R, C, G),
                 column target embedding (B, N, E) | None, *rest)``; run on each forward call's
                 own rows, so standardisation and feature grouping see no padding.
    cells:       the cell embedding module; a padded cell reaches it as NaN and its token is
                 set to zero (so row and column chunking need no bookkeeping).
    row_tokens:  method whose output ``[0]`` ``(B, R, …)`` holds the row tokens (CLS
                 read-outs) entering the ICL transformer; padded rows are zeroed in place (a
                 stored carrier, e.g. the ``te.icl`` gate's, is that same tensor).
    row_targets: method ``y (B, N) -> (B, N, D)``: the ICL target embedding added to the train
                 rows' tokens; padded train rows get zero.
    sites:       patterns of the sites that must be patched for any padding (attention over
                 padded sources or receivers); ``width_sites``: also for padded columns.
    """

    preprocess: str
    cells: str
    row_tokens: str
    row_targets: str
    sites: tuple[str, ...]
    width_sites: tuple[str, ...]


BOUNDARIES: dict[str, Boundaries] = {
    "tabpfn.architectures.tabpfn_v3.TabPFNV3": Boundaries(
        preprocess="_preprocess_and_group", cells="x_embed", row_tokens="_stages_0_to_2",
        row_targets="_embed_icl_y",
        sites=(r"fde\.\d+\.induce[12]", r"icl\.\d+\.attn", r"dec"),
        width_sites=(r"col\.\d+\.attn", r"col\.cls", r"te\.col")),
}
"""Per architecture (``module.qualname`` of the unpatched class): its token boundaries."""


@dataclasses.dataclass
class _Call:
    """One recorded model forward of one dataset: ``x (R, B, C)``, ``y (N, B)``."""

    dataset: int
    x: Tensor
    y: Tensor
    kwargs: dict[str, Any]
    autocast: tuple[bool, torch.dtype]

    @property
    def n_train(self) -> int:
        return self.y.shape[0]

    @property
    def n_test(self) -> int:
        return self.x.shape[0] - self.y.shape[0]


@dataclasses.dataclass
class _Layout:
    """The padded batch: ``N`` train rows, then ``M`` test rows, ``C`` columns; call ``k``
    holds batch lanes ``offsets[k] : offsets[k] + B_k``."""

    calls: list[_Call]
    n: int
    m: int
    c: int
    offsets: list[int]
    lanes: int

    @classmethod
    def of(cls, calls: list[_Call]) -> "_Layout":
        offsets, lanes = [], 0
        for call in calls:
            offsets.append(lanes)
            lanes += call.x.shape[1]
        return cls(calls, max(c.n_train for c in calls), max(c.n_test for c in calls),
                   max(c.x.shape[2] for c in calls), offsets, lanes)

    def parts(self) -> Iterator[tuple[_Call, slice]]:
        for call, start in zip(self.calls, self.offsets):
            yield call, slice(start, start + call.x.shape[1])

    def rows(self, call: _Call) -> tuple[slice, slice]:
        """The padded row ranges of a call's train and test rows."""
        return slice(0, call.n_train), slice(self.n, self.n + call.n_test)

    def padded_rows(self, device: torch.device) -> Tensor:
        """``(lanes, N + M)``: True where a row is padding."""
        pad = torch.ones(self.lanes, self.n + self.m, dtype=torch.bool, device=device)
        for call, lanes in self.parts():
            for rows in self.rows(call):
                pad[lanes, rows] = False
        return pad


def _architecture(model: nn.Module) -> Boundaries:
    """The boundary table row of ``model``'s (unpatched) architecture."""
    for cls in type(model).__mro__:
        row = BOUNDARIES.get(f"{cls.__module__}.{cls.__qualname__}")
        if row is not None:
            return row
    raise RetrofitError(f"predict_batched has no token boundaries for {type(model).__name__}; "
                        f"it knows {', '.join(sorted(BOUNDARIES))}")


@contextlib.contextmanager
def _instance_attr(owner: object, name: str, value: Any) -> Iterator[None]:
    """Shadow ``owner.name`` with an instance attribute for the duration of the block."""
    had = name in owner.__dict__
    old = owner.__dict__.get(name)
    owner.__dict__[name] = value
    try:
        yield
    finally:
        if had:
            owner.__dict__[name] = old
        else:
            owner.__dict__.pop(name, None)


@contextlib.contextmanager
def _inert_padding(model: nn.Module, layout: _Layout, bounds: Boundaries) -> Iterator[None]:
    """Install the four boundary patches of :class:`Boundaries` on ``model`` for one forward."""
    preprocess = getattr(model, bounds.preprocess)            # bound, before shadowing
    row_tokens, row_targets = getattr(model, bounds.row_tokens), getattr(model, bounds.row_targets)

    def preprocess_each(rows: Tensor, y: Tensor, num_train: int, scaler_cache: Any) -> tuple:
        if scaler_cache is not None or num_train != layout.n \
                or rows.shape[0] != layout.n + layout.m:
            raise RuntimeError("predict_batched: the batched forward took a path it does not "
                               "pad (a KV cache, or rows it did not stack)")
        cells = targets = rest = None
        for call, lanes in layout.parts():
            train, test = layout.rows(call)
            width = call.x.shape[2]
            own = torch.cat([rows[train, lanes, :width], rows[test, lanes, :width]])
            out = preprocess(own, y[train, lanes], call.n_train, None)
            if cells is None:                               # NaN marks a padded cell
                cells = out[0].new_full((layout.lanes, layout.n + layout.m, layout.c,
                                         out[0].shape[-1]), float("nan"))
                rest = out[2:]
            cells[lanes, train, :width] = out[0][:, :call.n_train]
            cells[lanes, test, :width] = out[0][:, call.n_train:]
            if out[1] is not None:
                if targets is None:
                    targets = out[1].new_zeros(layout.lanes, layout.n, out[1].shape[-1])
                targets[lanes, train] = out[1]
        return (cells, targets, *rest)

    def zero_marked(module: nn.Module, args: tuple, output: Tensor) -> Tensor:
        return output.masked_fill(args[0].isnan().any(-1, keepdim=True), 0)

    pad_rows = layout.padded_rows(layout.calls[0].x.device)

    def row_tokens_zeroed(*args: Any, **kwargs: Any) -> tuple:
        out = row_tokens(*args, **kwargs)
        tokens = out[0]
        tokens.masked_fill_(pad_rows.view(*pad_rows.shape, *[1] * (tokens.dim() - 2)), 0)
        return out

    def row_targets_zeroed(y_BN: Tensor) -> Tensor:
        e = row_targets(y_BN)
        return e.masked_fill(pad_rows[:, :e.shape[1], None], 0)

    handle = getattr(model, bounds.cells).register_forward_hook(zero_marked)
    try:
        with _instance_attr(model, bounds.preprocess, preprocess_each), \
                _instance_attr(model, bounds.row_tokens, row_tokens_zeroed), \
                _instance_attr(model, bounds.row_targets, row_targets_zeroed):
            yield
    finally:
        handle.remove()


def _batched_forward(model: nn.Module, layout: _Layout, bounds: Boundaries) -> list[Tensor]:
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
    with _inert_padding(model, layout, bounds), \
            torch.autocast(x.device.type, dtype=dtype, enabled=enabled):
        out = model(x, y, **kwargs)
    return [out[:call.n_test, lanes].clone() for call, lanes in layout.parts()]


class _Forwards:
    """The model's forward replaced, for the duration of the block, by a recorder (``record``:
    keep the inputs, answer zeros) or a replayer (answer the batched outputs in call order)."""

    def __init__(self, model: nn.Module) -> None:
        self.model = model
        self.calls: list[_Call] = []
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
        self.calls.append(_Call(self.dataset, x, y2, kwargs, autocast))
        return x.new_zeros(x.shape[0] - y.shape[0], x.shape[1], self.model.n_out)

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

        with _instance_attr(self.model, "forward", wrapped):
            yield


def _sites_needed(model: nn.Module, bounds: Boundaries, layout: _Layout) -> None:
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
        raise RetrofitError(
            f"predict_batched: {why}needs the sites {', '.join(missing[:6])}"
            f"{' …' if len(missing) > 6 else ''} patched; retrofit with arm 'full-o' "
            "(make_regressor/make_classifier(..., 'full-o')), or 'oa' for datasets of one width")


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


def _footprint(model: nn.Module, layout: _Layout) -> int:
    """A coarse upper estimate (bytes) of the batched forward's activations: the grouped cells
    and their tokens ``lanes·R·C·(G + 2E)`` and the row tokens with the ICL MLP
    ``lanes·R·D·(3 + ff)``, ``D = E·cls``, at the inputs' element size, twice over for
    temporaries. A guard against hopeless batches, not a measurement; ``memory_budget``
    overrides the free memory it is compared with."""
    config = getattr(model, "config", None)
    e = int(getattr(config, "embed_dim", 0) or model.x_embed.out_features)
    g = int(model.x_embed.in_features)
    d = int(getattr(model, "icl_emsize", e))
    ff = int(getattr(config, "ff_factor", 4) or 4)
    cells = layout.lanes * (layout.n + layout.m)
    size = 2 * layout.calls[0].x.element_size()
    return size * cells * (layout.c * (g + 2 * e) + d * (3 + ff))


def _cells(calls: Sequence[_Call]) -> tuple[int, int]:
    """(padded, real) cell counts of stacking ``calls``: ``lanes·(N+M)·C``, ``Σ B_k·R_k·C_k``."""
    layout = _Layout.of(list(calls))
    return (layout.lanes * (layout.n + layout.m) * layout.c,
            sum(c.x.shape[0] * c.x.shape[1] * c.x.shape[2] for c in calls))


def _groups(calls: list[_Call], max_padding: float | None) -> list[list[int]]:
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


def _check_memory(model: nn.Module, calls: list[_Call], budget: int | None) -> None:
    """Name the first dataset whose addition makes the padded batch outgrow ``budget``."""
    budget = _available_memory(calls[0].x.device) if budget is None else budget
    for k in range(len(calls)):
        need = _footprint(model, _Layout.of(calls[:k + 1]))
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
    bounds = _architecture(model)
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
            layout = _Layout.of(calls)
            _sites_needed(model, bounds, layout)
            _check_memory(model, calls, memory_budget)
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
