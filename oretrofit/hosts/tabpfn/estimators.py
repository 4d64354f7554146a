"""tabpfn's own ``TabPFNRegressor`` / ``TabPFNClassifier``, running a retrofitted model.

The estimator is the vendor's class with the vendor's arguments, names and defaults; only its
``model_path`` differs: it names a *patched artifact*, the checkpoint with its patch spec
inside (:mod:`oretrofit.hosts.tabpfn.artifact`), written once per (checkpoint, spec) to
oretrofit's cache folder. tabpfn rebuilds its model from ``model_path`` at every ``fit`` and in
``load_from_fit_state``; :mod:`oretrofit.hosts.tabpfn.reload` makes that load return the
retrofitted model (at the next ``fit``, the one whose :class:`~oretrofit.Retrofit` was
returned; at any later load, the spec re-applied to fresh weights). So ``clone``, pickle and ``save_fit_state`` work as for any
tabpfn estimator, and no reload runs an unpatched model. The model is built fresh from the
checkpoint: no model shared through tabpfn's caches is ever patched.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
from pathlib import Path
from typing import Any, Callable, Mapping

from torch import nn

from ..._files.provenance import cache_dir
from ..._operators.presence import EPS_RETROFIT, TAU_RETROFIT
from ..._surgery.registry import (Retrofit, RetrofitError, apply_spec, check_arm, read_spec,
                                  retrofit)
from . import releases, reload
from .artifact import ARTIFACT_KEY, read_patch_spec, write_patched_artifact
from .checkpoints import (build_model, checkpoint_sha256, checkpoint_task, inference_config,
                          load_checkpoint, release_checkpoint, resolve_model_path,
                          weights_label)

__all__ = ["make_regressor", "make_classifier", "estimator_from_checkpoint", "vendor_class",
           "vendor_defaults", "in_memory_specs", "spec_patch", "check_spec_checkpoint",
           "retrofit_estimator", "load_patched_regressor", "load_patched_classifier"]

_OURS = ("arm", "tau", "eps", "site_tau", "spec")


def vendor_class(task: releases.Task) -> type:
    """tabpfn's estimator class of ``task``."""
    from tabpfn import TabPFNClassifier, TabPFNRegressor
    return TabPFNClassifier if task == "classifier" else TabPFNRegressor


def _vendor_parameters(task: releases.Task) -> dict[str, inspect.Parameter]:
    parameters = inspect.signature(vendor_class(task).__init__).parameters
    return {name: p for name, p in parameters.items() if name not in ("self", "model_path")}


def vendor_defaults(task: releases.Task) -> dict[str, Any]:
    """The installed tabpfn estimator's arguments and their defaults (but ``model_path``): what
    ``make_regressor`` / ``make_classifier`` build it with unless told otherwise."""
    return {name: p.default for name, p in _vendor_parameters(task).items()}


def check_vendor_kwargs(task: releases.Task, kwargs: Mapping[str, Any]) -> None:
    """Refuse, by name, an argument the installed tabpfn estimator does not take and an
    ``"auto"`` where this release takes none (tabpfn 8.0.1's ``n_estimators``)."""
    name, parameters = vendor_class(task).__name__, _vendor_parameters(task)
    where = f"tabpfn {releases.installed_version()}'s {name}"
    if "seed" in kwargs:
        raise RetrofitError(f"seed= is not an argument of {where}: pass random_state= "
                            "(tabpfn's name for it)")
    unknown = sorted(set(kwargs) - set(parameters))
    if unknown:
        raise RetrofitError(f"{where} takes no {', '.join(unknown)}; its arguments are "
                            f"{', '.join(parameters)} (oretrofit's own: {', '.join(_OURS)})")
    for key, value in kwargs.items():
        parameter = parameters[key]
        if isinstance(value, str) and value == "auto" and parameter.default != "auto" \
                and "auto" not in str(parameter.annotation):
            raise RetrofitError(f"{where} takes no {key}='auto' (a later tabpfn does); pass a "
                                f"value, or leave {key} out for its default "
                                f"{parameter.default!r}")


def in_memory_specs(path: str | os.PathLike[str], model: nn.Module, task: releases.Task
                    ) -> Any:
    """tabpfn's in-memory model spec running ``model`` with the configs and bucket borders of
    the checkpoint at ``path`` (an estimator whose model is observed while it runs). The
    borders are the file's, as tabpfn reads them when it loads the file itself (not the
    model's buffer, which a forced precision may have cast)."""
    checkpoint = load_checkpoint(path)
    state = checkpoint["state_dict"]
    return releases.model_specs(model, model.config, inference_config(checkpoint), task,
                                state.get("criterion.borders", state.get("regression_borders")))


def _patched_artifact(path: Path, checkpoint: Mapping[str, Any], result: Retrofit) -> Path:
    """The patched artifact of ``path`` under ``result``'s spec, written once to
    ``cache_dir()/tabpfn-patched/<digest>/`` under the checkpoint's own name (tabpfn reads the
    model version from it), ``digest = sha256(checkpoint SHA-256 ‖ 0x00 ‖ spec JSON)``."""
    sha = checkpoint_sha256(path)
    spec = {**result.spec(), "source_checkpoint_sha256": sha,
            "weights": weights_label(dict(checkpoint))}
    digest = hashlib.sha256(f"{sha}\0{json.dumps(spec, sort_keys=True)}".encode()).hexdigest()
    out = cache_dir() / "tabpfn-patched" / digest[:32] / path.name
    return out if out.exists() else write_patched_artifact(out, path, spec)


def estimator_from_checkpoint(path: str | os.PathLike[str],
                              patch: Callable[[nn.Module], Retrofit | None], *,
                              task: releases.Task = "regressor", reuse_artifact: bool = False,
                              **vendor_kwargs: Any) -> tuple[Any, Retrofit | None]:
    """tabpfn's estimator of ``task`` over a validated checkpoint, its model ``patch``-ed.

    ``model_path`` is the checkpoint when ``patch`` patches nothing (it returns None), the
    checkpoint itself when ``reuse_artifact`` (a patched artifact whose spec ``patch``
    applies), else its patched artifact (:func:`_patched_artifact`); on a release lacking some
    of its inference-config fields, that file's copy without them, their settings carried by
    estimator arguments (:func:`_release_estimator`). ``vendor_kwargs`` go to the estimator
    unchanged (:func:`check_vendor_kwargs`).
    """
    check_vendor_kwargs(task, vendor_kwargs)
    path = Path(path)
    checkpoint = load_checkpoint(path)
    if checkpoint_task(checkpoint, task) != task:
        maker = "make_classifier" if task == "regressor" else "make_regressor"
        raise RetrofitError(f"{path} is a TabPFN v3 {checkpoint_task(checkpoint)} checkpoint, "
                            f"not a {task}; use {maker} for it, or pass a {task} checkpoint "
                            f"(--model-path random gives a random {task})")
    estimator = vendor_class(task)
    result = patch(build_model(checkpoint)[0])
    if result is None:
        if ARTIFACT_KEY in checkpoint and not reuse_artifact:
            raise RetrofitError(f"{path} is a patched artifact: tabpfn would load it patched; "
                                "pass its source checkpoint for arm 'base', or load it with "
                                "load_patched_regressor / load_patched_classifier")
        return _release_estimator(estimator, path, vendor_kwargs), None
    try:
        if vendor_kwargs.get("fit_mode") == "fit_with_cache":
            vendor_kwargs = releases.cache_options(estimator, vendor_kwargs)
        artifact = path if reuse_artifact else _patched_artifact(path, checkpoint, result)
        regressor = _release_estimator(estimator, artifact, vendor_kwargs)
    except RetrofitError:
        result.revert()
        raise
    reload.hand_over(regressor.model_path, result.model)
    return regressor, result


def _release_estimator(estimator: type, path: Path, vendor_kwargs: dict[str, Any]) -> Any:
    """``estimator`` over the file the installed tabpfn loads for ``path``
    (:func:`~.checkpoints.release_checkpoint`); the arguments that carry the settings of
    inference-config fields this release lacks are defaults, the caller's own win."""
    loadable, arguments = release_checkpoint(path)
    return estimator(model_path=str(loadable), **{**arguments, **vendor_kwargs})


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


def arm_patch(arm: str, tau: float | None, eps: float | None,
              site_tau: Mapping[str, float] | None = None
              ) -> Callable[[nn.Module], Retrofit | None]:
    """The patch step of ``arm`` (None for ``base``, which takes no τ, ε or site τ)."""
    check_arm(arm, tau=tau, eps=eps, site_tau=site_tau)

    def patch(model: nn.Module) -> Retrofit | None:
        if arm == "base":
            return None
        return retrofit(model, arm, TAU_RETROFIT if tau is None else tau,
                        EPS_RETROFIT if eps is None else eps, site_tau=site_tau)

    return patch


def _make(task: releases.Task, model_path: str | os.PathLike[str] | None, arm: str | None,
          tau: float | None, eps: float | None, site_tau: Mapping[str, float] | None,
          spec: Mapping[str, Any] | str | os.PathLike[str] | None, vendor_kwargs: dict[str, Any]
          ) -> tuple[Any, Retrofit | None]:
    check_vendor_kwargs(task, vendor_kwargs)
    path = resolve_model_path(model_path, task)
    if spec is None:
        patch = arm_patch("full-o" if arm is None else arm, tau, eps, site_tau)
    else:
        spec = read_spec(spec)
        _spec_arm(spec, arm, tau, eps, site_tau)
        check_spec_checkpoint(spec, path)
        patch = spec_patch(spec)
    return estimator_from_checkpoint(path, patch, task=task, **vendor_kwargs)


def make_regressor(model_path: str | os.PathLike[str] | None, arm: str | None = None,
                   tau: float | None = None, *, eps: float | None = None,
                   site_tau: Mapping[str, float] | None = None,
                   spec: Mapping[str, Any] | str | os.PathLike[str] | None = None,
                   **vendor_kwargs: Any) -> tuple[Any, Retrofit | None]:
    """An unfitted ``tabpfn.TabPFNRegressor`` running the checkpoint retrofitted with ``arm``.

    Args:
        model_path: see :func:`resolve_model_path` (``"random"``, ``"demo"``, None or a path).
        arm: ``full-o`` (the default without ``spec``), ``oa``, or ``base`` (unpatched; the
            Retrofit returned is None).
        tau, eps, site_tau: presence scale (default ``TAU_RETROFIT`` = 1e-8), OAttention ε
            (default 0, the limit ε → 0⁺) and per-site τ (see :func:`oretrofit.retrofit`).
        spec: a patch spec (dict, or the path of its JSON: ``Retrofit.save_spec``,
            ``oretrofit calibrate --out``) applied with :func:`oretrofit.apply_spec` instead of
            arm/tau/eps/site_tau; leave those out (arm may repeat the spec's). A spec made for
            another host, or naming another checkpoint, is refused.
        vendor_kwargs: ``TabPFNRegressor``'s own arguments, by its names (``random_state``,
            ``n_estimators``, ``device``, ``inference_precision``, ``fit_mode``, …), passed
            unchanged: what is left out keeps tabpfn's default (:func:`vendor_defaults`). One it
            does not take is refused by name (``seed``: pass ``random_state``). Under
            ``fit_mode="fit_with_cache"`` the KV cache carries the train rows' presences and
            must not be quantized: ``kv_cache_precision="auto"`` is set where tabpfn has it
            (a quantized one, or a release that always quantizes, is refused).
    Returns:
        ``(regressor, retrofit)``; ``retrofit.model`` is the instance the estimator's first use
        runs (its next ``fit`` and the predictions after it, or ``predict_batched``); a later
        load re-applies the spec to fresh weights.
    """
    return _make("regressor", model_path, arm, tau, eps, site_tau, spec, vendor_kwargs)


def make_classifier(model_path: str | os.PathLike[str] | None, arm: str | None = None,
                    tau: float | None = None, *, eps: float | None = None,
                    site_tau: Mapping[str, float] | None = None,
                    spec: Mapping[str, Any] | str | os.PathLike[str] | None = None,
                    **vendor_kwargs: Any) -> tuple[Any, Retrofit | None]:
    """An unfitted ``tabpfn.TabPFNClassifier`` running a classifier checkpoint retrofitted with
    ``arm`` (the regressor's sites plus the many-class decoder ``dec``), or with ``spec``.

    ``model_path``: a classifier checkpoint, ``"demo"`` (the small demo classifier shipped with
    oretrofit, prior-fitted from the demo regressor's weights), ``"random"`` (a small random classifier) or
    None (tabpfn's cached ``tabpfn-v3-classifier-v3_default.ckpt``); the other arguments are
    those of :func:`make_regressor`, ``vendor_kwargs`` ``TabPFNClassifier``'s.
    """
    return _make("classifier", model_path, arm, tau, eps, site_tau, spec, vendor_kwargs)


def load_patched_regressor(path: str | os.PathLike[str], **vendor_kwargs: Any
                           ) -> tuple[Any, Retrofit | None]:
    """``(regressor, retrofit)`` ready to fit/predict from a patched artifact (its
    ``model_path``); ``vendor_kwargs``: ``TabPFNRegressor``'s own, as for
    :func:`make_regressor`."""
    return _load_patched(path, "regressor", vendor_kwargs)


def load_patched_classifier(path: str | os.PathLike[str], **vendor_kwargs: Any
                            ) -> tuple[Any, Retrofit | None]:
    """``(classifier, retrofit)`` ready to fit/predict from a patched classifier artifact."""
    return _load_patched(path, "classifier", vendor_kwargs)


def _load_patched(path: str | os.PathLike[str], task: releases.Task,
                  vendor_kwargs: dict[str, Any]) -> tuple[Any, Retrofit | None]:
    spec = read_patch_spec(path)
    try:
        return estimator_from_checkpoint(path, spec_patch(spec), task=task,
                                         reuse_artifact=True, **vendor_kwargs)
    except RetrofitError as exc:
        raise RetrofitError(f"{path}: {exc}") from None


def retrofit_estimator(estimator: Any, arm: str, tau: float | None, eps: float | None
                       ) -> tuple[Any, Retrofit | None]:
    """A copy of the unfitted tabpfn ``estimator`` (its arguments unchanged) whose model is its
    checkpoint retrofitted with ``arm``: what :class:`oretrofit.tabpfn.Retrofitted` fits.
    ``model_path`` ``"auto"`` is tabpfn's cached default v3 checkpoint of the task. An argument
    left at tabpfn's default yields to the checkpoint's inference settings, as in tabpfn 9
    (:func:`_release_estimator`)."""
    from tabpfn import TabPFNClassifier
    task: releases.Task = "classifier" if isinstance(estimator, TabPFNClassifier) else "regressor"
    params = estimator.get_params(deep=False)
    model_path = params.pop("model_path")
    if not isinstance(model_path, (str, os.PathLike)):
        raise RetrofitError(f"{type(estimator).__name__}(model_path=…) must name a checkpoint "
                            f"file (or 'auto') to be retrofitted, not a "
                            f"{type(model_path).__name__}")
    path = resolve_model_path(None if str(model_path) == "auto" else model_path, task)
    # an argument at tabpfn's default names nothing (tabpfn 9's defaults defer to the
    # checkpoint): the checkpoint's settings a release carries as arguments apply
    defaults = vendor_defaults(task)
    named = {key: value for key, value in params.items()
             if not (value is defaults.get(key) or (isinstance(value, (str, int, float))
                                                    and releases.same_setting(value,
                                                                              defaults.get(key))))}
    return estimator_from_checkpoint(path, arm_patch(arm, tau, eps), task=task, **named)


def spec_patch(spec: Mapping[str, Any]) -> Callable[[nn.Module], Retrofit | None]:
    """The patch step that re-applies a saved patch spec (None for the ``base`` arm)."""
    return lambda model: None if spec.get("arm") == "base" else apply_spec(model, spec)
