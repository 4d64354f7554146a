"""Runs a dataset × seed × arm × τ matrix of TabPFN v3 fits, one independent task per cell.

Each cell builds its own regressor from the checkpoint (``make_regressor``: base and each O arm
are separate instances, nothing is fine-tuned), fits on the protocol's train rows and scores the
test rows:

    RMSE = sqrt(mean((ŷ - y)²))            in the target's original units
    R²   = 1 - Σ(ŷ - y)² / Σ(y - ȳ)²       ȳ the mean of the test targets

``base`` is one cell per (dataset, seed), shared by every τ (no τ changes an unpatched host).
Each per-site τ variant (:mod:`.variants`: a calibrated spec, a site-family ablation) adds one
cell per (dataset, seed) of its arm.
Cells run through joblib (``loky`` processes when ``n_jobs > 1``) or, with ``backend="dask"``,
on a Dask cluster; the driver writes each result as it arrives (see :mod:`.store`).

Every setting is validated before the run folder is touched (device, estimators, the matrix,
each dataset's split under every seed, the checkpoint loading into its architecture), so a bad
setting leaves no ``run.json`` behind. The folder is written under its lock
(:meth:`RunFolder.lock`). A ``loky`` worker watches the driver and exits when it is gone, so a
killed driver leaves no worker computing on.
"""

from __future__ import annotations

import functools
import math
import os
import socket
import sys
import threading
import time
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

import joblib
import numpy as np
import torch

from .._operators.presence import EPS_RETROFIT, check_eps
from .._operators.presence_profile import PresenceProfile, presence_by_module
from .._files.provenance import environment, portable, sha256_file
from .._surgery.registry import ARMS, RetrofitError
from .families import (check_host, checkpoint_file, make_regressor, vendor_kwargs,
                       weights_file)
from .data import Dataset, canonical_spec, load_datasets, refuse_twins
from .protocol import PAPER_PROTOCOL, SplitProtocol, rmse_r2
from .store import Cell, RunFolder
from .variants import Variant, check_variants

__all__ = ["Matrix", "ModelSettings", "RunResult", "run_matrix", "run_cell", "parse_shard",
           "shard_cells", "BACKENDS"]

BACKENDS = ("joblib", "dask")
# progress(event, cell, cells_done, cells_total); event is "start" or "done".
Progress = Callable[[str, Cell, int, int], None]


@dataclass(frozen=True)
class Matrix:
    """The grid: every dataset × seed × arm, with O arms once per τ and once per variant of the
    arm, and ``base`` once."""

    datasets: tuple[str, ...]
    seeds: tuple[int, ...]
    arms: tuple[str, ...] = tuple(ARMS)
    taus: tuple[float, ...] = (1e-8,)
    variants: tuple[Variant, ...] = ()

    def __post_init__(self) -> None:
        object.__setattr__(self, "datasets", tuple(map(canonical_spec, self.datasets)))
        unknown = [a for a in self.arms if a not in ARMS]
        if unknown:
            raise ValueError(f"unknown arm(s) {', '.join(unknown)}; choose from {', '.join(ARMS)}")
        bad = [t for t in self.taus if isinstance(t, bool) or not isinstance(t, (int, float))
               or not (math.isfinite(t) and t > 0)]
        if bad or not self.taus:
            raise ValueError(f"every τ must be a finite positive number, got {list(self.taus)}")
        if any(isinstance(s, bool) or not isinstance(s, int) or s < 0 for s in self.seeds):
            raise ValueError(f"seeds must be integers >= 0, got {list(self.seeds)}")
        if not (self.datasets and self.seeds and self.arms):
            raise ValueError("a matrix needs at least one dataset, seed and arm")
        for what, values in (("--datasets/--data", self.datasets), ("--seeds", self.seeds),
                             ("--arms", self.arms), ("--tau", self.taus)):
            repeated = sorted({str(v) for v in values if values.count(v) > 1})
            if repeated:
                raise ValueError(f"{what} lists {', '.join(repeated)} more than once; list each "
                                 "once (a repeat would be run and averaged twice)")
        object.__setattr__(self, "variants", tuple(self.variants))
        keys = [v.key for v in self.variants]
        repeated = sorted({k for k in keys if keys.count(k) > 1})
        if repeated:
            raise ValueError(f"variant {', '.join(repeated)} is given more than once (e.g. two "
                             "--tau-spec files with the same δ and q for one arm); give one")
        outside = [v.key for v in self.variants if v.arm not in self.arms]
        if outside:
            raise ValueError(f"variant {', '.join(outside)} runs an arm that --arms leaves out; "
                             "add its arm to --arms")

    def variant(self, cell: Cell) -> Variant | None:
        """The variant ``cell`` runs (None for a plain τ)."""
        return next((v for v in self.variants
                     if (v.arm, v.name) == (cell.arm, cell.variant)), None)

    def cells(self) -> list[Cell]:
        """Cells in a fixed order (the order shards are cut from)."""
        return [cell for d in self.datasets for s in self.seeds for arm in self.arms
                for cell in (*(Cell(d, s, arm, None if arm == "base" else tau)
                               for tau in ((None,) if arm == "base" else self.taus)),
                             *(Cell(d, s, arm, v.tau, v.name)
                               for v in self.variants if v.arm == arm))]


@dataclass(frozen=True)
class ModelSettings:
    """What every cell's regressor is built from (passed whole to ``make_regressor``)."""

    model_path: str = "demo"
    device: str = "cpu"
    n_estimators: int = 1
    eps: float = EPS_RETROFIT
    inference_precision: str | None = None      # float32 | float16 | bfloat16 | auto |
                                                # autocast; None: float32
    host: str = "tabpfn"                        # the model family (:mod:`.families`)

    def __post_init__(self) -> None:
        check_device(self.device)
        if isinstance(self.n_estimators, bool) or not isinstance(self.n_estimators, int) \
                or self.n_estimators < 1:
            raise ValueError(f"--n-estimators must be an integer >= 1, got {self.n_estimators!r}")
        check_eps(self.eps)
        check_host(self.host)
        vendor_kwargs(self.host, self.regressor_kwargs(), seed=0)

    def regressor_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"eps": self.eps, "device": self.device,
                                  "n_estimators": self.n_estimators}
        if self.inference_precision in ("auto", "autocast"):
            kwargs["inference_precision"] = self.inference_precision
        elif self.inference_precision is None:            # arms compared like for like
            kwargs["inference_precision"] = torch.float32
        else:
            dtype = getattr(torch, self.inference_precision, None)
            if not isinstance(dtype, torch.dtype):
                raise ValueError(f"unknown inference precision {self.inference_precision!r}; "
                                 "use float32, float16, bfloat16, auto or autocast")
            kwargs["inference_precision"] = dtype
        return kwargs


def check_device(device: str) -> torch.device:
    """``device`` as a torch device this machine has: cpu, an available cuda device, or mps."""
    try:
        found = torch.device(device)
    except (RuntimeError, TypeError):
        raise ValueError(f"unknown --device {device!r}; use cpu, cuda or cuda:N") from None
    if found.type == "cuda" and not torch.cuda.is_available():
        raise ValueError(f"--device {device}: no CUDA device is available to this torch "
                         f"{torch.__version__} (built with CUDA {torch.version.cuda}); "
                         "use --device cpu")
    if found.type == "cuda" and (found.index or 0) >= torch.cuda.device_count():
        raise ValueError(f"--device {device}: this machine has {torch.cuda.device_count()} CUDA "
                         "device(s); use cuda:0 .. cuda:N-1")
    if found.type == "mps" and not torch.backends.mps.is_available():
        raise ValueError(f"--device {device}: Apple MPS is not available here; use --device cpu")
    if found.type not in ("cpu", "cuda", "mps"):
        raise ValueError(f"--device {device}: regression runs use cpu, cuda or mps")
    return found


@dataclass
class RunResult:
    out: Path
    cells_total: int                  # cells in this shard
    cells_skipped: int                # already in the folder
    cells_run: list[Cell] = field(default_factory=list)


def parse_shard(text: str) -> tuple[int, int]:
    """``"i/n"`` (1 ≤ i ≤ n) -> (i, n)."""
    index, sep, count = str(text).partition("/")
    if not (sep and index.strip().isdigit() and count.strip().isdigit()
            and 1 <= int(index) <= int(count)):
        raise ValueError(f"--shard takes i/n with 1 <= i <= n (e.g. 2/3), got {text!r}")
    return int(index), int(count)


def shard_cells(cells: Sequence[Cell], index: int, count: int) -> list[Cell]:
    """Shard ``index`` of ``count`` takes every ``count``-th cell; the shards partition cells."""
    return list(cells[index - 1::count])


def _watch_driver(driver: int) -> None:
    """In a ``loky`` worker (a child of the driver process ``driver``): exit as soon as the
    driver is gone (the worker's parent changes), instead of finishing a cell nobody writes."""
    if os.getpid() == driver or _WATCHED:
        return
    if os.getppid() != driver:                  # the driver died before this cell started
        os._exit(1)
    _WATCHED.append(driver)

    def watch() -> None:
        while os.getppid() == driver:
            time.sleep(0.2)
        os._exit(1)

    threading.Thread(target=watch, name="oretrofit-driver-watch", daemon=True).start()


_WATCHED: list[int] = []


def _require_finite(cell: Cell, prediction: Any, model: ModelSettings) -> None:
    """Refuse a cell whose predictions hold NaN or ±inf where they are made, naming the cell:
    stored, its RMSE would be NaN, and ``tables`` would ask to re-run it, which computes the same
    NaN. The checkpoint's weights are finite (checked when it is loaded), so the cause is how it
    was run."""
    values = np.asarray(prediction, dtype=np.float64).reshape(-1)
    bad = int((~np.isfinite(values)).sum())
    if bad:
        tau = "" if cell.tau is None else f" τ {cell.tau:g}"
        variant = f" variant {cell.variant}" if cell.variant else ""
        raise RetrofitError(
            f"{cell.dataset} seed {cell.seed} arm {cell.arm}{tau}{variant}: {bad} of "
            f"{values.size} predictions of {model.model_path} are NaN or infinite, so no RMSE can "
            "be scored (the checkpoint's weights are finite: they are checked when it is loaded). "
            "Likely causes: a low --inference-precision (float16 overflows; use float32), an ε "
            "or τ too small for this data, or features of extreme scale; run the base arm to "
            "see whether the checkpoint alone predicts finite values")


def run_cell(cell: Cell, arrays: tuple[np.ndarray, ...], checkpoint: str,
             model: ModelSettings, driver: int | None = None,
             variant: Variant | None = None) -> tuple[Cell, dict[str, Any]]:
    """Fit and score one cell on ``(X_train, y_train, X_test, y_test)``; runs in a worker
    (which watches ``driver``, the driver's pid, when given). ``variant``: the per-site τ
    (and ε) the cell's variant runs."""
    if driver is not None:
        _watch_driver(driver)
    X_train, y_train, X_test, y_test = arrays
    start, cpu_start = time.perf_counter(), time.process_time()
    kwargs = model.regressor_kwargs()
    eps = kwargs.pop("eps")
    kwargs, predict_kwargs = vendor_kwargs(model.host, kwargs, cell.seed)
    # a vendor drawing from the global generators (TabDPT's fit) draws the same in every arm
    torch.manual_seed(cell.seed)
    np.random.seed(cell.seed)
    if cell.arm != "base":                      # base patches nothing: no τ or ε to pass
        kwargs["eps"] = eps
    if cell.tau is not None:
        kwargs["tau"] = cell.tau
    if variant is not None:
        kwargs["site_tau"] = variant.site_tau
        kwargs["eps"] = variant.eps if variant.eps is not None else model.eps
    regressor, applied = make_regressor(model.host)(checkpoint, arm=cell.arm, **kwargs)
    # Every presence the O sites compute in fit + predict, per module (base computes none).
    where = presence_by_module(applied.model) if applied is not None else nullcontext({})
    with where as by_module:
        fit_start = time.perf_counter()
        regressor.fit(X_train, y_train)
        predict_start = time.perf_counter()
        prediction = regressor.predict(X_test, **predict_kwargs)
        end = time.perf_counter()
    _require_finite(cell, prediction, model)
    rmse, r2 = rmse_r2(y_test, prediction)
    return cell, {
        "rmse": rmse, "r2": r2, "n_train": int(len(y_train)), "n_test": int(len(y_test)),
        "n_features": int(X_train.shape[1]), "fit_s": predict_start - fit_start,
        "predict_s": end - predict_start, "wall_s": end - start,
        "cpu_s": time.process_time() - cpu_start,         # all threads of this process
        "sites_patched": len(applied.report()) if applied is not None else 0,
        "presence": functools.reduce(PresenceProfile.merge, by_module.values(),
                                     PresenceProfile()).summary(),
        "presence_by_module": {name: p.summary() for name, p in sorted(by_module.items())},
        "inference_precision": str(regressor.get_params().get("inference_precision")),
        "worker": socket.gethostname(), "torch_threads": torch.get_num_threads()}


def _check_backend(backend: str, n_jobs: int, scheduler: str | None) -> None:
    if backend not in BACKENDS:
        raise ValueError(f"unknown backend {backend!r}; choose from {', '.join(BACKENDS)}")
    if isinstance(n_jobs, bool) or not isinstance(n_jobs, int) or n_jobs < 1:
        raise ValueError(f"--n-jobs must be an integer >= 1, got {n_jobs!r}")
    if backend == "dask" and not scheduler:
        raise ValueError("--backend dask needs --scheduler ADDRESS (e.g. tcp://host:8786)")
    if backend == "dask":
        try:
            import distributed  # noqa: F401
        except ImportError as exc:
            raise ValueError("--backend dask needs the distributed package: "
                             "pip install 'oretrofit[dask]'") from exc


@contextmanager
def _backend(backend: str, n_jobs: int, scheduler: str | None) -> Iterator[None]:
    """joblib's own processes, or a Dask cluster through joblib's ``dask`` backend."""
    if backend == "joblib":
        with joblib.parallel_config(backend="loky" if n_jobs > 1 else "sequential",
                                    n_jobs=n_jobs):
            yield
        return
    from distributed import Client
    with Client(scheduler) as client, joblib.parallel_config(backend="dask", n_jobs=-1):
        client.wait_for_workers(1)
        yield


def run_matrix(matrix: Matrix, model: ModelSettings, out: str | Path, *,
               protocol: SplitProtocol = PAPER_PROTOCOL, openml_cache: str | None = None,
               standins: Mapping[str, str] | None = None, shard: tuple[int, int] = (1, 1),
               backend: str = "joblib", n_jobs: int = 1, scheduler: str | None = None,
               progress: Progress | None = None) -> RunResult:
    """Run the cells of ``matrix`` (this shard's share) missing from ``out``; resumable.

    Every dataset is loaded before any cell runs, so a missing one fails fast with one error
    naming all of them. ``standins`` maps specs to offline replacements (recorded per dataset).
    """
    _check_backend(backend, n_jobs, scheduler)
    datasets = load_datasets(matrix.datasets, openml_cache=openml_cache, standins=standins)
    refuse_twins(datasets)
    for dataset in datasets.values():
        for seed in matrix.seeds:
            protocol.check_fits(dataset.spec, len(dataset.y), seed)
    checkpoint, weights, sha256 = _checkpoint(model, matrix)
    folder = RunFolder(out)
    with folder.lock():
        folder.sweep()
        folder.check_cells()
        return _run_locked(matrix, model, folder, datasets, checkpoint, weights,
                           sha256, protocol=protocol, standins=standins,
                           shard=shard, backend=backend, n_jobs=n_jobs, scheduler=scheduler,
                           progress=progress)


def _checkpoint(model: ModelSettings, matrix: Matrix) -> tuple[Path, str, str]:
    """The run's checkpoint, its weights label and SHA-256, checked before any cell runs: a
    TabPFN one builds and plans every variant; another family's is a file in its format."""
    if model.host != "tabpfn":
        if matrix.variants:
            raise ValueError(f"per-site τ variants are planned on TabPFN's host; --host "
                             f"{model.host} runs the arms at one τ each (drop --variant)")
        checkpoint = checkpoint_file(model.host, model.model_path)
        return (checkpoint, f"{model.host} checkpoint",
                sha256_file(weights_file(model.host, checkpoint)))
    from ..tabpfn import checkpoint_sha256, resolve_model_path
    checkpoint = resolve_model_path(model.model_path)
    weights, host = _check_builds(checkpoint)
    sha256 = checkpoint_sha256(checkpoint)
    check_variants(host, matrix.variants, model.eps, sha256)
    return checkpoint, weights, sha256


def _check_builds(checkpoint: Path) -> tuple[str, torch.nn.Module]:
    """Build the host from the checkpoint once (a state_dict that does not fit its config fails
    here, naming the file); returns the weights label and the built host."""
    from ..tabpfn import build_model, load_checkpoint, weights_label
    loaded = load_checkpoint(checkpoint)
    try:
        host = build_model(loaded)[0]
    except (RuntimeError, ValueError, TypeError, KeyError) as exc:
        raise ValueError(f"checkpoint {checkpoint} does not build a TabPFN v3 host "
                         f"({type(exc).__name__}: {str(exc).splitlines()[0][:300]}); re-create "
                         "or re-download it") from None
    return weights_label(loaded), host


def _run_locked(matrix: Matrix, model: ModelSettings, folder: RunFolder,
                datasets: Mapping[str, Dataset], checkpoint: Path, weights: str, sha256: str, *,
                protocol: SplitProtocol, standins: Mapping[str, str] | None,
                shard: tuple[int, int], backend: str, n_jobs: int, scheduler: str | None,
                progress: Progress | None) -> RunResult:
    folder.bind({"checkpoint_sha256": sha256,
                 "weights": weights,
                 "device_type": torch.device(model.device).type,
                 "n_estimators": model.n_estimators, "eps": model.eps,
                 "inference_precision": model.inference_precision,
                 "protocol": protocol.describe(),
                 **({} if model.host == "tabpfn" else {"host": model.host})})
    folder.bind_variants({v.key: v.record() for v in matrix.variants})
    # a local table by its content: the spec the folder first recorded it under
    known = {spec: folder.record_dataset(dataset) for spec, dataset in datasets.items()}
    datasets = {known[spec]: dataset for spec, dataset in datasets.items()}
    cells = shard_cells([replace(c, dataset=known[c.dataset]) for c in matrix.cells()], *shard)
    todo = [c for c in cells if not folder.done(c)]
    result = RunResult(folder.path, len(cells), len(cells) - len(todo))
    folder.record_invocation({
        "environment": environment(model.device), "argv": [portable(a) for a in sys.argv],
        "model": {**asdict(model), "model_path": portable(model.model_path),
                  "checkpoint": portable(checkpoint)},
        "torch_default_dtype": str(torch.get_default_dtype()),
        "matrix": asdict(matrix), "shard": list(shard), "backend": backend, "n_jobs": n_jobs,
        "scheduler": scheduler, "standins": dict(standins or {}),
        "cells_in_shard": len(cells), "cells_to_run": len(todo)})

    driver = os.getpid() if backend == "joblib" and n_jobs > 1 else None

    def tasks() -> Iterator[Any]:               # consumed by joblib as it dispatches
        for c in todo:
            if progress:
                progress("start", c, result.cells_skipped + len(result.cells_run), len(cells))
            yield joblib.delayed(run_cell)(c, _split_arrays(datasets[c.dataset], c.seed,
                                                            protocol), str(checkpoint), model,
                                           driver, matrix.variant(c))

    with _backend(backend, n_jobs, scheduler):
        for cell, metrics in joblib.Parallel(return_as="generator_unordered")(tasks()):
            split = protocol.split(len(datasets[cell.dataset].y), cell.seed)
            folder.write_cell(cell, {**metrics, "split_sha256": split.digest(),
                                     "dataset_sha256": datasets[cell.dataset].checksum})
            result.cells_run.append(cell)
            if progress:
                progress("done", cell, result.cells_skipped + len(result.cells_run), len(cells))
    return result


def _split_arrays(dataset: Dataset, seed: int, protocol: SplitProtocol
                  ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    split = protocol.split(len(dataset.y), seed)
    return (dataset.X[split.train], dataset.y[split.train],
            dataset.X[split.test], dataset.y[split.test])
