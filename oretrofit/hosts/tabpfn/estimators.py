"""A ``TabPFNRegressor`` / ``TabPFNClassifier`` whose fit/predict run a separate, retrofitted
TabPFN v3 instance.

``TabPFNRegressor.fit`` rebuilds its model from ``model_path``, so a model patched before fit
would be silently lost. The patched instance is therefore handed in through tabpfn's in-memory
model spec (:func:`oretrofit.hosts.tabpfn.releases.model_specs`) as ``model_path``; it is
built fresh from the checkpoint, so no model shared through tabpfn's caches
(``TABPFN_MODEL_CACHE_SIZE``) is ever patched.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Mapping

import torch
from torch import nn

from ..._operators.presence import EPS_RETROFIT, TAU_RETROFIT
from ..._surgery.registry import ARMS, Retrofit, RetrofitError, apply_spec, read_spec, retrofit
from . import releases
from .checkpoints import (build_model, checkpoint_sha256, checkpoint_task, load_checkpoint,
                          resolve_model_path)

__all__ = ["make_regressor", "make_classifier", "regressor_from_checkpoint",
           "estimator_from_checkpoint", "spec_patch", "check_spec_checkpoint"]

EPS = EPS_RETROFIT              # OAttention ε of make_regressor / make_classifier by default


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
    if checkpoint_task(checkpoint, task) != task:
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
    specs = releases.model_specs(model, config, inference_config, task,
                                 checkpoint["state_dict"].get("criterion.borders"))
    return estimator(model_path=specs, device=device, n_estimators=n_estimators,
                     fit_mode=fit_mode, inference_precision=inference_precision,
                     random_state=seed, **tabpfn_kwargs), result


def regressor_from_checkpoint(path: str | os.PathLike[str],
                              patch: Callable[[nn.Module], Retrofit | None], **kwargs: Any
                              ) -> tuple[Any, Retrofit | None]:
    """:func:`estimator_from_checkpoint` for a regressor checkpoint."""
    return estimator_from_checkpoint(path, patch, task="regressor", **kwargs)


def check_spec_checkpoint(spec: Mapping[str, Any], path: str | os.PathLike[str]) -> None:
    """Refuse ``spec`` for the checkpoint at ``path`` when the spec names another checkpoint:
    the source of ``oretrofit patch`` (``source_checkpoint_sha256``) or the checkpoint whose
    carriers a calibrated spec's τ were read from (``calibration.data.checkpoint_sha256``)."""
    calibration = spec.get("calibration")
    recorded = {"patched from": spec.get("source_checkpoint_sha256"),
                "calibrated on": (calibration.get("data") or {}).get("checkpoint_sha256")
                if isinstance(calibration, Mapping) else None}
    named = {what: sha for what, sha in recorded.items() if sha is not None}
    if not named:
        return
    sha = checkpoint_sha256(path)
    for what, recorded_sha in named.items():
        if recorded_sha != sha:
            raise RetrofitError(
                f"the patch spec was {what} the checkpoint with SHA-256 {str(recorded_sha)[:12]}…, "
                f"but {path} has {sha[:12]}…; make the spec from this checkpoint (`oretrofit "
                "calibrate --model-path` or `oretrofit patch --out`), or pass the checkpoint it "
                "names")


def _spec_arm(spec: Mapping[str, Any], arm: str | None, tau: float | None, eps: float | None,
              site_tau: Mapping[str, float] | None) -> str:
    """The arm a spec patches, refusing settings that would contradict it."""
    given = [name for name, value in (("tau", tau), ("eps", eps), ("site_tau", site_tau))
             if value is not None]
    if given:
        raise RetrofitError(f"spec= sets every τ and ε itself; drop {', '.join(given)} (or drop "
                            "spec= and pass arm/tau/site_tau)")
    if arm is not None and arm != spec["arm"]:
        raise RetrofitError(f"arm {arm!r} contradicts the spec's arm {spec['arm']!r}; leave arm "
                            "out (the spec's arm is used) or pass the spec's arm")
    return str(spec["arm"])


def _make(task: releases.Task, model_path: str | os.PathLike[str] | None, arm: str | None,
          tau: float | None, eps: float | None, site_tau: Mapping[str, float] | None,
          spec: Mapping[str, Any] | str | os.PathLike[str] | None, **kwargs: Any
          ) -> tuple[Any, Retrofit | None]:
    if spec is not None:
        spec = read_spec(spec)
        arm = _spec_arm(spec, arm, tau, eps, site_tau)
    arm = "base" if arm is None else arm
    if arm not in ARMS:
        raise RetrofitError(f"unknown arm {arm!r}; choose one of {', '.join(ARMS)}")
    given = [name for name, value in (("tau", tau), ("eps", eps), ("site_tau", site_tau))
             if value is not None]
    if arm == "base" and spec is None and given:
        raise RetrofitError(f"arm 'base' patches no site, so {', '.join(given)} would be "
                            "ignored; drop them, or choose arm 'oa' or 'full-o'")
    path = resolve_model_path(model_path, task)
    if spec is not None:
        check_spec_checkpoint(spec, path)
        return estimator_from_checkpoint(path, spec_patch(spec), task=task, **kwargs)

    def patch(model: nn.Module) -> Retrofit | None:
        if arm == "base":
            return None
        return retrofit(model, arm, TAU_RETROFIT if tau is None else tau,
                        EPS if eps is None else eps, site_tau=site_tau)

    return estimator_from_checkpoint(path, patch, task=task, **kwargs)


def make_regressor(model_path: str | os.PathLike[str] | None, arm: str | None = None,
                   tau: float | None = None, *, eps: float | None = None,
                   site_tau: Mapping[str, float] | None = None,
                   spec: Mapping[str, Any] | str | os.PathLike[str] | None = None,
                   device: str = "cpu", seed: int = 0, n_estimators: int = 1,
                   fit_mode: str = "fit_preprocessors",
                   inference_precision: torch.dtype | str = torch.float32,
                   **tabpfn_kwargs: Any) -> tuple[Any, Retrofit | None]:
    """An unfitted ``TabPFNRegressor`` running the TabPFN v3 host retrofitted with ``arm``.

    Args:
        model_path: see :func:`resolve_model_path` (``"random"``, ``"demo"``, None or a path).
        arm: ``base`` (unpatched; the Retrofit returned is None; the default without ``spec``),
            ``oa`` or ``full-o``.
        tau, eps, site_tau: presence scale (default ``TAU_RETROFIT`` = 1e-8), OAttention ε
            (default 0, the limit ε → 0⁺) and per-site τ (see :func:`oretrofit.retrofit`).
        spec: a patch spec (dict, or the path of its JSON: ``Retrofit.save_spec``,
            ``oretrofit calibrate --out``) applied with :func:`oretrofit.apply_spec` instead of
            arm/tau/eps/site_tau: it sets every site's τ (a calibrated spec: one per site). With
            ``spec``, leave tau, eps and site_tau out and arm out or equal to the spec's arm;
            anything else is a :class:`RetrofitError`. A spec made for another host, whose
            sites do not fit this checkpoint, or that names another checkpoint (patched from or
            calibrated on) is refused the same way.
        seed: the regressor's ``random_state``.
        fit_mode: under ``oa``/``full-o``, ``fit_with_cache`` keeps the train rows' presences
            in tabpfn's KV cache, which must not be quantized (``kv_cache_precision="auto"`` is
            set where tabpfn has it; releases that always quantize are refused).
        inference_precision: pinned (fp32 by default) so arms compare like for like.
    Returns:
        ``(regressor, retrofit)``; ``retrofit.model`` is the instance fit/predict use.
    """
    return _make("regressor", model_path, arm, tau, eps, site_tau, spec, device=device,
                 seed=seed, n_estimators=n_estimators, fit_mode=fit_mode,
                 inference_precision=inference_precision, **tabpfn_kwargs)


def make_classifier(model_path: str | os.PathLike[str] | None, arm: str | None = None,
                    tau: float | None = None, *, eps: float | None = None,
                    site_tau: Mapping[str, float] | None = None,
                    spec: Mapping[str, Any] | str | os.PathLike[str] | None = None,
                    device: str = "cpu", seed: int = 0, n_estimators: int = 1,
                    fit_mode: str = "fit_preprocessors",
                    inference_precision: torch.dtype | str = torch.float32,
                    **tabpfn_kwargs: Any) -> tuple[Any, Retrofit | None]:
    """An unfitted ``TabPFNClassifier`` running a TabPFN v3 classifier checkpoint retrofitted
    with ``arm`` (the regressor's sites plus the many-class decoder ``dec``), or with ``spec``.

    ``model_path``: a classifier checkpoint, ``"random"`` (a small random classifier host) or
    None (tabpfn's cached ``tabpfn-v3-classifier-v3_default.ckpt``); the other arguments are
    those of :func:`make_regressor`.
    """
    return _make("classifier", model_path, arm, tau, eps, site_tau, spec, device=device,
                 seed=seed, n_estimators=n_estimators, fit_mode=fit_mode,
                 inference_precision=inference_precision, **tabpfn_kwargs)


def spec_patch(spec: Mapping[str, Any]) -> Callable[[nn.Module], Retrofit | None]:
    """The patch step that re-applies a saved patch spec (None for the ``base`` arm)."""
    return lambda model: None if spec.get("arm") == "base" else apply_spec(model, spec)
