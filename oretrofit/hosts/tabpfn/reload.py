"""tabpfn's estimators whose every model load applies the patch spec inside ``model_path``.

tabpfn builds an estimator's model from its ``model_path`` at every ``fit`` (through the
estimator's ``_initialize_model_variables``) and in ``load_from_fit_state``. The estimators of
:mod:`oretrofit.hosts.tabpfn.estimators` are :class:`RetrofittedTabPFNRegressor` /
:class:`RetrofittedTabPFNClassifier`: tabpfn's classes, with tabpfn's parameters, whose
``model_path`` names a patched artifact (a checkpoint carrying its patch spec,
:mod:`oretrofit.hosts.tabpfn.artifact`). Only their loads change: the model tabpfn built from
the file is replaced by

    the model handed over for that file (:func:`hand_over`), once, when there is one, else
    a fresh model of its weights with the spec re-applied (:func:`oretrofit.apply_spec`),

so no load runs an unpatched model, and no two loads share a model (each may be moved to its
own device and precision, as tabpfn builds a fresh model at every ``fit``). ``clone``, pickle
and ``GridSearchCV`` keep the class, so they keep the rule. tabpfn's own estimators are not
touched: importing oretrofit changes no tabpfn function, and a plain ``TabPFNRegressor`` reads
an artifact as the unpatched checkpoint it contains. A fitted state saved by these estimators
names their class, so tabpfn's own ``load_from_fit_state`` refuses it (it knows its two
classes only) instead of loading it unpatched. The model handed over is the one
``make_regressor`` / ``make_classifier`` returned the :class:`~oretrofit.Retrofit` of: the
estimator's first use (its next ``fit``, or ``predict_batched``) runs it. It is held weakly.
"""

from __future__ import annotations

import inspect
import json
import os
import tempfile
import threading
import weakref
from pathlib import Path
from typing import Any

import torch
from tabpfn import TabPFNClassifier, TabPFNRegressor
from torch import nn

__all__ = ["hand_over", "patched_model", "embedded_spec", "RetrofittedTabPFNRegressor",
           "RetrofittedTabPFNClassifier"]

_HANDED: weakref.WeakValueDictionary[str, nn.Module] = weakref.WeakValueDictionary()
_LOCK = threading.Lock()


def _key(path: str | Path) -> str:
    return str(Path(path).resolve())


def hand_over(path: str | Path, model: nn.Module) -> None:
    """Make ``model`` (retrofitted with the spec inside ``path``) the model the next load of
    ``path`` returns, while it is alive."""
    with _LOCK:
        _HANDED[_key(path)] = model


def embedded_spec(path: str | Path) -> dict[str, Any] | None:
    """The patch spec inside the checkpoint at ``path`` (checked against its checksum), or None
    for a plain checkpoint. A plain ``.ckpt`` is only memory-mapped to look."""
    from .artifact import ARTIFACT_KEY, read_patch_spec
    path = Path(path)
    if path.suffix == ".safetensors":
        from safetensors import safe_open
        with safe_open(str(path), framework="pt", device="cpu") as fh:
            present = ARTIFACT_KEY in (fh.metadata() or {})
    else:
        present = ARTIFACT_KEY in torch.load(path, map_location="cpu", weights_only=True,
                                             mmap=True)
    return read_patch_spec(path) if present else None


def patched_model(path: str | Path, claim: bool = False) -> nn.Module | None:
    """The model a load of ``path`` runs: with ``claim``, the one handed over while it is
    retrofitted (taken: the next load builds its own); else, or without one, fresh weights with
    the spec inside ``path`` applied. None when ``path`` is a plain checkpoint (or patched by
    arm ``base``: nothing)."""
    from ..._surgery.registry import Retrofit, apply_spec
    from .checkpoints import build_model, load_checkpoint
    spec = embedded_spec(path)
    if spec is None or spec.get("arm") == "base":
        return None
    with _LOCK:
        handed = _HANDED.pop(_key(path), None) if claim else None
    if handed is not None and Retrofit.of(handed) is not None:        # not reverted since
        return handed
    model = build_model(load_checkpoint(path))[0]
    apply_spec(model, spec)
    return model


_LOAD_DEVICE = inspect.signature(TabPFNRegressor.load_from_fit_state).parameters["device"].default


class _PatchedLoads:
    """Mixin over a tabpfn estimator: each model it loads from ``model_path`` is
    :func:`patched_model` of that path (a plain checkpoint's stays tabpfn's)."""

    def _initialize_model_variables(self) -> int:
        byte_size = super()._initialize_model_variables()   # type: ignore[misc]
        paths = self.model_path if isinstance(self.model_path, list) else [self.model_path]
        patched = [patched_model(path, claim=True) if isinstance(path, (str, os.PathLike))
                   else None for path in paths]
        self.models_ = [model if model is not None else built
                        for model, built in zip(patched, self.models_)]
        return byte_size

    @classmethod
    def load_from_fit_state(cls, path: Path | str, *, device: Any = _LOAD_DEVICE) -> Any:
        """The fitted estimator saved by ``save_fit_state`` at ``path``, its model loaded as
        at ``fit``: tabpfn's ``load_fitted_tabpfn_model`` for this class (tabpfn's resolves
        only its own two class names)."""
        import joblib
        from tabpfn.inference import InferenceEngine
        from tabpfn.model_loading import _extract_archive
        with tempfile.TemporaryDirectory() as tmpdir:
            tmp = Path(tmpdir)
            _extract_archive(Path(path), tmp)
            params = json.loads((tmp / "init_params.json").read_text())
            saved = params.pop("__class_name__")
            if saved != cls.__name__:
                raise TypeError(f"{path} holds a fitted {saved}, not a {cls.__name__}; load it "
                                f"with {saved}.load_from_fit_state")
            precision = params.get("inference_precision")
            if isinstance(precision, str) and precision.startswith("torch."):
                params["inference_precision"] = getattr(torch, precision.split(".")[1])
            params["device"] = device
            estimator = cls(**params)
            estimator._initialize_model_variables()
            for key, value in joblib.load(tmp / "fitted_attrs.joblib").items():
                setattr(estimator, key, value)
            estimator.executor_ = InferenceEngine.load_state(tmp / "executor_state.joblib",
                                                             estimator.models_)
        estimator.to(device)
        return estimator


class RetrofittedTabPFNRegressor(_PatchedLoads, TabPFNRegressor):
    """``TabPFNRegressor`` whose model is loaded retrofitted (made by
    :func:`oretrofit.tabpfn.make_regressor`)."""


class RetrofittedTabPFNClassifier(_PatchedLoads, TabPFNClassifier):
    """``TabPFNClassifier`` whose model is loaded retrofitted (made by
    :func:`oretrofit.tabpfn.make_classifier`)."""
