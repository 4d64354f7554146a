"""Retrofitted ``MitraClassifier`` / ``MitraRegressor``: the vendor's estimators, every argument
passed through with the vendor's names and defaults, plus ``arm``, ``tau`` and ``eps`` as
estimator parameters (``get_params``, so ``clone`` and ``GridSearchCV`` carry them).

A Mitra estimator loads its model at every ``fit`` (``Tab2D.from_pretrained(hf_model)``, once per
ensemble member) and fine-tunes it there (``fine_tune=True``, the vendor's default): a model
patched before ``fit`` would be silently replaced. The estimators made here load the checkpoint
through the vendor's own loader at every ``fit``, as the vendor does, and retrofit each model
as it is loaded, so no fit runs unpatched. The fitted members pickle with the estimator; a
``clone`` carries ``arm``, ``tau`` and ``eps`` and retrofits the models its ``fit`` loads.
"""

from __future__ import annotations

import inspect
import os
from typing import Any, Callable

from autogluon.tabular.models.mitra.sklearn_interface import MitraClassifier, MitraRegressor
from torch import nn

from ..._operators.presence import EPS_RETROFIT, TAU_RETROFIT
from ..._surgery.registry import ARMS, Retrofit, RetrofitError, retrofit

__all__ = ["make_classifier", "make_regressor", "retrofit_estimator",
           "RetrofittedMitraClassifier", "RetrofittedMitraRegressor"]

_RETROFIT_PARAMS = {"arm": "full-o", "tau": TAU_RETROFIT, "eps": EPS_RETROFIT}


def _with_retrofit_params(vendor_init: Callable[..., None]) -> Callable[..., None]:
    """The vendor's ``__init__`` taking ``arm``, ``tau`` and ``eps`` too, its signature (which
    sklearn's ``get_params`` reads) the vendor's plus those three."""
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        settings = {name: kwargs.pop(name, default) for name, default in _RETROFIT_PARAMS.items()}
        vendor_init(self, *args, **kwargs)
        for name, value in settings.items():
            setattr(self, name, value)

    signature = inspect.signature(vendor_init)
    __init__.__signature__ = signature.replace(parameters=[  # type: ignore[attr-defined]
        *signature.parameters.values(),
        *(inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=default)
          for name, default in _RETROFIT_PARAMS.items())])
    return __init__


class _Loader:
    """What the vendor's ``fit`` loads its models with (``Tab2D.from_pretrained``): the
    vendor's loader, each model it loads retrofitted with the estimator's settings."""

    def __init__(self, estimator: Any) -> None:
        self.estimator = estimator

    def from_pretrained(self, path: str, device: str = "cuda") -> nn.Module:
        return self.retrofitted(path, device).model

    def retrofitted(self, path: str, device: str) -> Retrofit:
        from autogluon.tabular.models.mitra._internal.models.tab2d import Tab2D
        e = self.estimator
        if e.arm not in ARMS or e.arm == "base":
            raise RetrofitError(f"a retrofitted Mitra estimator needs arm 'oa' or 'full-o', not "
                                f"{e.arm!r} (the vendor's own estimator is the base arm)")
        return retrofit(Tab2D.from_pretrained(path, device=device), e.arm, e.tau, e.eps)


class _RetrofittedEstimator:
    """Mixin over a Mitra estimator: every model its ``fit`` loads is retrofitted."""

    def check_retrofit(self) -> Retrofit:
        """The retrofit of the checkpoint's model (``hf_model`` on ``device``) with ``arm``,
        ``tau`` and ``eps``, loaded here: what every ``fit`` applies to the models it loads
        (a checkpoint or setting the host refuses is refused here, before any fit)."""
        return _Loader(self).retrofitted(self.hf_model, self.device)

    def _create_config(self, task: Any, dim_output: int, time_limit: Any = None) -> tuple:
        cfg, _ = super()._create_config(task, dim_output, time_limit)
        return cfg, _Loader(self)


class RetrofittedMitraClassifier(_RetrofittedEstimator, MitraClassifier):
    """``MitraClassifier`` whose models are retrofitted (made by :func:`make_classifier`)."""

    __init__ = _with_retrofit_params(MitraClassifier.__init__)


class RetrofittedMitraRegressor(_RetrofittedEstimator, MitraRegressor):
    """``MitraRegressor`` whose models are retrofitted (made by :func:`make_regressor`)."""

    __init__ = _with_retrofit_params(MitraRegressor.__init__)


def _make(estimator: type, vendor: type, model_path: str | os.PathLike[str] | None, arm: str,
          tau: float, eps: float, vendor_kwargs: dict[str, Any]) -> tuple[Any, Retrofit | None]:
    if arm not in ARMS:
        raise RetrofitError(f"unknown arm {arm!r}; choose one of {', '.join(ARMS)}")
    if "hf_model" in vendor_kwargs:
        raise RetrofitError("model_path is Mitra's hf_model: pass the checkpoint once, as "
                            "model_path")
    if model_path is not None:
        vendor_kwargs = {**vendor_kwargs, "hf_model": os.fspath(model_path)}
    if arm == "base":
        return vendor(**vendor_kwargs), None
    out = estimator(**vendor_kwargs, arm=arm, tau=tau, eps=eps)
    return out, out.check_retrofit()


def make_classifier(model_path: str | os.PathLike[str] | None, arm: str = "full-o",
                    tau: float = TAU_RETROFIT, *, eps: float = EPS_RETROFIT,
                    **vendor_kwargs: Any) -> tuple[Any, Retrofit | None]:
    """An unfitted ``MitraClassifier`` whose models are retrofitted with ``arm``.

    Args:
        model_path: the vendor's ``hf_model``: a checkpoint directory (``config.json`` and
            ``model.safetensors``, e.g. :func:`oretrofit.hosts.mitra.write_random_checkpoint`)
            or a Hugging Face repo id; None for the vendor's default
            (``autogluon/mitra-classifier``, downloaded).
        arm: ``full-o`` (default), ``oa``, or ``base`` (the vendor's estimator unpatched; the
            Retrofit returned is None).
        tau, eps: presence scale (default ``TAU_RETROFIT`` = 1e-8) and OAttention ε (default 0,
            the limit ε → 0⁺), as :func:`oretrofit.retrofit`.
        vendor_kwargs: every other ``MitraClassifier`` argument, by the vendor's name, with the
            vendor's defaults (``n_estimators``, ``device``, ``fine_tune``, ``seed``…).
    Returns:
        ``(classifier, retrofit)``: the retrofit of the checkpoint's model as every ``fit``
        applies it to the models it loads (their retrofits: ``Retrofit.of(trainer.model)`` for
        each of ``classifier.trainers``).
    """
    return _make(RetrofittedMitraClassifier, MitraClassifier, model_path, arm, tau, eps,
                 vendor_kwargs)


def make_regressor(model_path: str | os.PathLike[str] | None, arm: str = "full-o",
                   tau: float = TAU_RETROFIT, *, eps: float = EPS_RETROFIT,
                   **vendor_kwargs: Any) -> tuple[Any, Retrofit | None]:
    """:func:`make_classifier` for ``MitraRegressor`` (default checkpoint
    ``autogluon/mitra-regressor``)."""
    return _make(RetrofittedMitraRegressor, MitraRegressor, model_path, arm, tau, eps,
                 vendor_kwargs)


def retrofit_estimator(estimator: Any, arm: str, tau: float | None, eps: float | None
                       ) -> tuple[Any, Retrofit | None]:
    """An unfitted estimator with the vendor ``estimator``'s arguments whose models are
    retrofitted with ``arm`` (τ, ε None: ``TAU_RETROFIT``, ``EPS_RETROFIT``): what
    :class:`oretrofit.mitra.Retrofitted` fits."""
    params = estimator.get_params(deep=False)
    maker = make_classifier if isinstance(estimator, MitraClassifier) else make_regressor
    return maker(params.pop("hf_model"), arm, TAU_RETROFIT if tau is None else tau,
                 eps=EPS_RETROFIT if eps is None else eps, **params)
