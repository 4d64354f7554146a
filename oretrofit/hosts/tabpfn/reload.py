"""tabpfn's model loader, taught to load a patched artifact patched.

tabpfn builds an estimator's model from its ``model_path`` at every ``fit`` and in
``load_from_fit_state``. The estimators of :mod:`oretrofit.hosts.tabpfn.estimators` name a
patched artifact there (a checkpoint carrying its patch spec,
:mod:`oretrofit.hosts.tabpfn.artifact`), so their parameters stay tabpfn's plain ones and
``clone``, pickle and ``save_fit_state`` treat them as any tabpfn estimator. Importing this
module wraps ``tabpfn.model_loading.load_model`` once: a checkpoint without a patch spec loads
exactly as before; one with a spec loads as

    the live model registered for that file (:func:`register`), when there is one, else
    a fresh model of its weights with the spec re-applied (:func:`oretrofit.apply_spec`),

so a reload never runs an unpatched model. The live model is the one
``make_regressor`` / ``make_classifier`` returned the :class:`~oretrofit.Retrofit` of; it is
held weakly, and shared by every estimator that loads the same file (as tabpfn shares a built
model through ``TABPFN_MODEL_CACHE_SIZE``): the file is named by its weights and spec.
"""

from __future__ import annotations

import functools
import threading
import weakref
from pathlib import Path
from typing import Any, Callable

import torch
from torch import nn

__all__ = ["register", "patched_model", "embedded_spec", "install"]

_LIVE: weakref.WeakValueDictionary[str, nn.Module] = weakref.WeakValueDictionary()
_LOCK = threading.Lock()
_WRAPPED = "__oretrofit_reloads_patch__"


def _key(path: str | Path) -> str:
    return str(Path(path).resolve())


def register(path: str | Path, model: nn.Module) -> nn.Module:
    """The model tabpfn loads from ``path`` while it is alive: the live one registered for it
    when there is one, else ``model`` (retrofitted with the spec inside ``path``), registered."""
    with _LOCK:
        return _LIVE.setdefault(_key(path), model)


def patched_model(path: str | Path) -> nn.Module | None:
    """The model tabpfn loads from ``path`` (the live one, else a fresh one of its weights with
    its spec re-applied), or None when ``path`` is a plain checkpoint (or patched by arm
    ``base``: nothing)."""
    spec = embedded_spec(path)
    return None if spec is None or spec.get("arm") == "base" else _patched(Path(path), spec)


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


def _patched(path: Path, spec: dict[str, Any]) -> nn.Module:
    """The live model of ``path`` while it is retrofitted, else a fresh one of its weights
    with ``spec`` applied (registered as the live model)."""
    from ..._surgery.registry import Retrofit, apply_spec
    from .checkpoints import build_model, load_checkpoint
    with _LOCK:
        model = _LIVE.get(_key(path))
        if model is None or Retrofit.of(model) is None:
            model = build_model(load_checkpoint(path))[0]
            apply_spec(model, spec)
            _LIVE[_key(path)] = model
        return model


def _reloading(load_model: Callable[..., tuple]) -> Callable[..., tuple]:
    @functools.wraps(load_model)
    def load(*, path: Path, **kwargs: Any) -> tuple:
        loaded = load_model(path=path, **kwargs)
        model = patched_model(path)
        return loaded if model is None else (model, *loaded[1:])

    setattr(load, _WRAPPED, True)
    return load


def install() -> None:
    """Wrap ``tabpfn.model_loading.load_model`` (once; its callers look it up by name)."""
    from tabpfn import model_loading
    if not getattr(model_loading.load_model, _WRAPPED, False):
        model_loading.load_model = _reloading(model_loading.load_model)


install()
