"""tabpfn's model loader, taught to load a patched artifact patched.

tabpfn builds an estimator's model from its ``model_path`` at every ``fit`` and in
``load_from_fit_state``. The estimators of :mod:`oretrofit.hosts.tabpfn.estimators` name a
patched artifact there (a checkpoint carrying its patch spec,
:mod:`oretrofit.hosts.tabpfn.artifact`), so their parameters stay tabpfn's plain ones and
``clone``, pickle and ``save_fit_state`` treat them as any tabpfn estimator. Importing this
module wraps ``tabpfn.model_loading.load_model`` once: a checkpoint without a patch spec loads
exactly as before; one with a spec loads as

    the model handed over for that file (:func:`hand_over`), once, when there is one, else
    a fresh model of its weights with the spec re-applied (:func:`oretrofit.apply_spec`),

so no load runs an unpatched model, and no two loads share a model (each may be moved to its
own device and precision, as tabpfn builds a fresh model at every ``fit``). The model handed
over is the one ``make_regressor`` / ``make_classifier`` returned the
:class:`~oretrofit.Retrofit` of: the estimator's first use (its next ``fit``, or
``predict_batched``) runs it. It is held weakly.
"""

from __future__ import annotations

import functools
import threading
import weakref
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

__all__ = ["hand_over", "patched_model", "embedded_spec", "install"]

_HANDED: weakref.WeakValueDictionary[str, nn.Module] = weakref.WeakValueDictionary()
_LOCK = threading.Lock()
_WRAPPED = "__oretrofit_reloads_patch__"


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


def _reloading(load_model: Callable[..., tuple]) -> Callable[..., tuple]:
    @functools.wraps(load_model)
    def load(*, path: Path, **kwargs: Any) -> tuple:
        loaded = load_model(path=path, **kwargs)
        model = patched_model(path, claim=True)
        return loaded if model is None else (model, *loaded[1:])

    setattr(load, _WRAPPED, True)
    return load


def install() -> None:
    """Wrap ``tabpfn.model_loading.load_model`` (once; its callers look it up by name)."""
    from tabpfn import model_loading
    if not getattr(model_loading.load_model, _WRAPPED, False):
        model_loading.load_model = _reloading(model_loading.load_model)


install()
