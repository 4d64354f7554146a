"""Held-out accuracy and log-loss of a TabPFN v3 classifier checkpoint against classical classifiers.

For each dataset and split seed s, ``train_test_split(test_size=0.3, random_state=s,
stratify=y)`` makes one split (every class in both parts); every model is fitted on the train
rows and scored on the test rows by

    accuracy = mean(ŷ = y),   log-loss = −mean log p̂(y | x)   (p̂ clipped by scikit-learn's log_loss).

Hosts run as tabpfn's own ``TabPFNClassifier(model_path=...)``; baselines (features
standardised on the train rows): logistic regression (L2, C = 1) and a 300-tree random forest.
The datasets are scikit-learn's bundled classification tables; ``digits`` is its first
:data:`DIGITS_ROWS` rows (all ten classes), so that a CPU evaluates it in seconds.
"""

from __future__ import annotations

import hashlib
import logging
import time
import warnings
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .._files.markdown import pipe_table
from .._files.provenance import environment, portable, sha256_file, write_json_atomic
from .evaluate import TEST_FRACTION, summarise

__all__ = ["BASELINES", "DATASETS", "DIGITS_ROWS", "evaluate_classifier", "load_classification", "markdown_table"]

# progress and notices, not results: shown by the CLI (oretrofit.cli.output.show_progress)
_log = logging.getLogger(__name__)

DATASETS = ("sklearn:iris", "sklearn:wine", "sklearn:breast_cancer", "sklearn:digits")
BASELINES = ("logistic_regression", "random_forest")
DIGITS_ROWS = 500
METRICS = ("accuracy", "log_loss")


def load_classification(spec: str) -> tuple[np.ndarray, np.ndarray, dict[str, Any]]:
    """(X, y, receipt) of a bundled scikit-learn classification table ``sklearn:<name>``; the
    receipt holds its size, class count and the sha256 of its float64 X and int64 y."""
    from sklearn import datasets as skd

    kind, _, name = spec.partition(":")
    loaders = {"iris": skd.load_iris, "wine": skd.load_wine, "breast_cancer": skd.load_breast_cancer,
               "digits": skd.load_digits}
    if kind != "sklearn" or name not in loaders:
        raise ValueError(f"unknown classification dataset {spec!r}; use one of {', '.join(DATASETS)}")
    X, y = loaders[name](return_X_y=True)
    rows = DIGITS_ROWS if name == "digits" else len(y)
    X, y = np.asarray(X, dtype="<f8")[:rows], np.asarray(y, dtype="<i8")[:rows]
    digest = hashlib.sha256(X.tobytes() + y.tobytes()).hexdigest()
    loader = f"load_{name}(return_X_y=True)" + (f"[:{rows}]" if name == "digits" else "")
    return X, y, {"spec": spec, "loader": loader, "n_rows": int(X.shape[0]), "n_features": int(X.shape[1]),
                  "n_classes": int(len(np.unique(y))), "sha256": digest}


def _baseline(name: str, seed: int) -> Any:
    """A fresh baseline classifier behind a train-row StandardScaler."""
    from sklearn.ensemble import RandomForestClassifier
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    if name == "logistic_regression":
        model = LogisticRegression(C=1.0, max_iter=5000)
    elif name == "random_forest":
        model = RandomForestClassifier(n_estimators=300, random_state=seed, n_jobs=1)
    else:
        raise ValueError(f"unknown baseline {name!r}; choose from {', '.join(BASELINES)}")
    return make_pipeline(StandardScaler(), model)


def _host(checkpoint: Path, seed: int) -> Any:
    """The host as tabpfn's own TabPFNClassifier, with the inference config its checkpoint carries."""
    from tabpfn import TabPFNClassifier

    return TabPFNClassifier(model_path=str(checkpoint), device="cpu", random_state=seed,
                            ignore_pretraining_limits=True)


def evaluate_classifier(hosts: dict[str, Path], datasets: list[str], n_seeds: int = 3,
                        receipt_path: Path | None = None,
                        log: Callable[[str], None] = _log.info) -> dict[str, Any]:
    """Accuracy and log-loss per (dataset, seed, model) for every host checkpoint and baseline;
    write the receipt if asked."""
    if n_seeds < 1:
        raise ValueError(f"the number of split seeds (--seeds) must be at least 1, got {n_seeds}")
    if not datasets:
        raise ValueError(f"no dataset to evaluate: give --datasets one or more of {', '.join(DATASETS)}")
    from sklearn.exceptions import ConvergenceWarning
    from sklearn.metrics import accuracy_score, log_loss
    from sklearn.model_selection import train_test_split

    loaded = {spec: load_classification(spec) for spec in datasets}
    rows = []
    for spec, (X, y, _) in loaded.items():
        for seed in range(n_seeds):
            X_tr, X_te, y_tr, y_te = train_test_split(X, y, test_size=TEST_FRACTION, random_state=seed, stratify=y)
            models = {name: (lambda p=path: _host(p, seed)) for name, path in hosts.items()}
            models.update({name: (lambda n=name: _baseline(n, seed)) for name in BASELINES})
            for name, make in models.items():
                start = time.perf_counter()
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore", ConvergenceWarning)
                    model = make().fit(X_tr, y_tr)
                    proba = model.predict_proba(X_te)
                classes = np.asarray(model.classes_)
                rows.append({"dataset": spec, "seed": seed, "model": name,
                             "accuracy": float(accuracy_score(y_te, classes[proba.argmax(axis=1)])),
                             "log_loss": float(log_loss(y_te, proba, labels=classes)),
                             "seconds": time.perf_counter() - start})
                log(f"{spec} seed {seed} {name}: accuracy {rows[-1]['accuracy']:.3f}, "
                    f"log-loss {rows[-1]['log_loss']:.3f}")
    receipt = {"schema_version": 1, "kind": "oretrofit.pretrain.classification",
               "test_fraction": TEST_FRACTION, "stratified": True, "n_seeds": n_seeds,
               "hosts": {name: {"path": portable(Path(path)), "sha256": sha256_file(path)}
                         for name, path in hosts.items()},
               "baselines": list(BASELINES),
               "datasets": {spec: info for spec, (_, _, info) in loaded.items()}, "results": rows,
               "summary": {metric: summarise(rows, metric) for metric in METRICS},
               "environment": environment("cpu")}
    if receipt_path is not None:
        write_json_atomic(receipt_path, receipt)
    return receipt


def markdown_table(receipt: dict[str, Any]) -> str:
    """Mean accuracy and log-loss (± sd over split seeds) per dataset and model, from a receipt."""
    accuracy, loss = receipt["summary"]["accuracy"], receipt["summary"]["log_loss"]
    models = list(next(iter(accuracy.values())))
    rows = [[dataset, *(f"{accuracy[dataset][m]['mean']:.3f} ± {accuracy[dataset][m]['sd']:.3f} / "
                        f"{loss[dataset][m]['mean']:.3f}" for m in models)] for dataset in accuracy]
    return (pipe_table(["dataset", *models], rows)
            + f"\n\nAccuracy (mean ± sd) / log-loss (mean) on stratified 70/30 splits over "
              f"{receipt['n_seeds']} split seeds.")
