"""A ``TabPFNRegressor`` / ``TabPFNClassifier`` whose fit/predict run a separate, retrofitted
TabPFN v3 instance.

``TabPFNRegressor.fit`` rebuilds its model from ``model_path``, so a model patched before fit
would be silently lost. The patched instance is therefore handed in through tabpfn's in-memory
model spec (:func:`oretrofit.patches.tabpfn_v3_releases.model_specs`) as ``model_path``; it is
built fresh from the checkpoint, so no model shared through tabpfn's caches
(``TABPFN_MODEL_CACHE_SIZE``) is ever patched.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Mapping

import torch
from torch import nn

from .._registry import ARMS, Retrofit, RetrofitError, apply_spec, retrofit
from ..patches import tabpfn_v3_releases as releases
from .checkpoints import build_model, checkpoint_task, load_checkpoint, resolve_model_path

__all__ = ["make_regressor", "make_classifier", "regressor_from_checkpoint",
           "estimator_from_checkpoint", "spec_patch"]


def estimator_from_checkpoint(path: str | os.PathLike[str],
                              patch: Callable[[nn.Module], Retrofit | None], *,
                              task: releases.Task = "regressor", device: str = "cpu",
                              seed: int = 0, n_estimators: int = 1,
                              fit_mode: str = "fit_preprocessors",
                              inference_precision: torch.dtype | str = torch.float32,
                              **tabpfn_kwargs: Any) -> tuple[Any, Retrofit | None]:
    """Build a fresh model from a validated ``task`` checkpoint, ``patch`` it, wrap it in
    tabpfn's estimator of that task (``TabPFNRegressor`` or ``TabPFNClassifier``)."""
    from tabpfn import TabPFNClassifier, TabPFNRegressor
    checkpoint = load_checkpoint(path)
    if checkpoint_task(checkpoint) != task:
        maker = "make_classifier" if task == "regressor" else "make_regressor"
        raise RetrofitError(f"{path} is a TabPFN v3 {checkpoint_task(checkpoint)} checkpoint, "
                            f"not a {task}; use {maker} for it, or pass a {task} checkpoint "
                            f"(--model-path random gives a random {task})")
    estimator = TabPFNClassifier if task == "classifier" else TabPFNRegressor
    model, config, inference_config = build_model(checkpoint)
    result = patch(model)
    if result is not None and fit_mode == "fit_with_cache":
        try:
            tabpfn_kwargs = releases.cache_options(estimator, tabpfn_kwargs)
        except RetrofitError:
            result.revert()
            raise
    specs = releases.model_specs(model, config, inference_config, task)
    return estimator(model_path=specs, device=device, n_estimators=n_estimators,
                     fit_mode=fit_mode, inference_precision=inference_precision,
                     random_state=seed, **tabpfn_kwargs), result


def regressor_from_checkpoint(path: str | os.PathLike[str],
                              patch: Callable[[nn.Module], Retrofit | None], **kwargs: Any
                              ) -> tuple[Any, Retrofit | None]:
    """:func:`estimator_from_checkpoint` for a regressor checkpoint."""
    return estimator_from_checkpoint(path, patch, task="regressor", **kwargs)


def _make(task: releases.Task, model_path: str | os.PathLike[str] | None, arm: str, tau: float,
          eps: float, site_tau: Mapping[str, float] | None, **kwargs: Any
          ) -> tuple[Any, Retrofit | None]:
    if arm not in ARMS:
        raise RetrofitError(f"unknown arm {arm!r}; choose one of {', '.join(ARMS)}")
    path = resolve_model_path(model_path, task)

    def patch(model: nn.Module) -> Retrofit | None:
        if arm == "base":
            return None
        return retrofit(model, arm, tau, eps, site_tau=site_tau)

    return estimator_from_checkpoint(path, patch, task=task, **kwargs)


def make_regressor(model_path: str | os.PathLike[str] | None, arm: str = "base",
                   tau: float = 1e-8, *, eps: float = 1e-6,
                   site_tau: Mapping[str, float] | None = None, device: str = "cpu",
                   seed: int = 0, n_estimators: int = 1, fit_mode: str = "fit_preprocessors",
                   inference_precision: torch.dtype | str = torch.float32,
                   **tabpfn_kwargs: Any) -> tuple[Any, Retrofit | None]:
    """An unfitted ``TabPFNRegressor`` running the TabPFN v3 host retrofitted with ``arm``.

    Args:
        model_path: see :func:`resolve_model_path` (``"random"``, ``"demo"``, None or a path).
        arm: ``base`` (unpatched; the Retrofit returned is None), ``oa`` or ``full-o``.
        tau, eps, site_tau: presence scale, OAttention ε and per-site τ (see
            :func:`oretrofit.retrofit`).
        seed: the regressor's ``random_state``.
        fit_mode: under ``oa``/``full-o``, ``fit_with_cache`` keeps the train rows' presences
            in tabpfn's KV cache, which must not be quantized (``kv_cache_precision="auto"`` is
            set where tabpfn has it; releases that always quantize are refused).
        inference_precision: pinned (fp32 by default) so arms compare like for like.
    Returns:
        ``(regressor, retrofit)``; ``retrofit.model`` is the instance fit/predict use.
    """
    return _make("regressor", model_path, arm, tau, eps, site_tau, device=device, seed=seed,
                 n_estimators=n_estimators, fit_mode=fit_mode,
                 inference_precision=inference_precision, **tabpfn_kwargs)


def make_classifier(model_path: str | os.PathLike[str] | None, arm: str = "base",
                    tau: float = 1e-8, *, eps: float = 1e-6,
                    site_tau: Mapping[str, float] | None = None, device: str = "cpu",
                    seed: int = 0, n_estimators: int = 1, fit_mode: str = "fit_preprocessors",
                    inference_precision: torch.dtype | str = torch.float32,
                    **tabpfn_kwargs: Any) -> tuple[Any, Retrofit | None]:
    """An unfitted ``TabPFNClassifier`` running a TabPFN v3 classifier checkpoint retrofitted
    with ``arm`` (the regressor's sites plus the many-class decoder ``dec``).

    ``model_path``: a classifier checkpoint, ``"random"`` (a small random classifier host) or
    None (tabpfn's cached ``tabpfn-v3-classifier-v3_default.ckpt``); the other arguments are
    those of :func:`make_regressor`.
    """
    return _make("classifier", model_path, arm, tau, eps, site_tau, device=device, seed=seed,
                 n_estimators=n_estimators, fit_mode=fit_mode,
                 inference_precision=inference_precision, **tabpfn_kwargs)


def spec_patch(spec: Mapping[str, Any]) -> Callable[[nn.Module], Retrofit | None]:
    """The patch step that re-applies a saved patch spec (None for the ``base`` arm)."""
    return lambda model: None if spec.get("arm") == "base" else apply_spec(model, spec)
