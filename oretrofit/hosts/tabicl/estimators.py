"""Retrofitted ``TabICLClassifier`` / ``TabICLRegressor``: the vendor's estimators, with the
vendor's arguments, names and defaults, whose model is retrofitted when it is loaded.

The vendor loads its model (from ``model_path``, or the ``checkpoint_version`` it downloads)
at every ``fit``; a model patched before ``fit`` would be silently replaced. The estimators made
here load it once through the vendor's own ``_load_model``, retrofit it, and hand that same
patched instance back at every later ``fit`` (so the returned ``Retrofit`` stays the one
predict uses). A pickled estimator whose model the vendor rebuilds from saved weights is
retrofitted again on load, and so is a ``copy.copy`` (the vendor's copy drops the model: copies
used on threads never share one, whose ``_cache`` the vendor sets at each cached predict). A ``clone``
carries the vendor's parameters only, not the retrofit: its ``fit`` is refused rather than run
unpatched.
"""

from __future__ import annotations

from typing import Any

from tabicl import TabICLClassifier, TabICLRegressor

from ..._operators.presence import EPS_RETROFIT, TAU_RETROFIT
from ..._surgery.registry import Retrofit, RetrofitError, check_arm, retrofit

__all__ = ["make_classifier", "make_regressor", "retrofit_estimator",
           "RetrofittedTabICLClassifier", "RetrofittedTabICLRegressor"]

_MODEL = "_oretrofit_model"          # the patched model, handed back at every fit
_SETTINGS = "_oretrofit_settings"    # (arm, tau, eps) of the retrofit


class _RetrofittedEstimator:
    """Mixin over a vendor estimator: its model is retrofitted with ``_oretrofit_settings``
    when loaded; ``retrofit_`` is the :class:`~oretrofit.Retrofit` of ``model_``."""

    def _load_model(self) -> None:
        model = self.__dict__.get(_MODEL)
        if model is not None:
            self.model_ = model
            return
        settings = self.__dict__.get(_SETTINGS)
        if settings is None:
            raise RetrofitError(f"this {type(self).__name__} has lost its retrofit (a clone "
                                "copies the vendor's parameters only); make it with "
                                "oretrofit.tabicl.make_classifier / make_regressor instead")
        super()._load_model()
        self._retrofit_model(settings)

    def _retrofit_model(self, settings: tuple[str, float, float]) -> None:
        arm, tau, eps = settings
        self.retrofit_ = retrofit(self.model_, arm, tau, eps)
        self.__dict__[_MODEL] = self.model_

    def __getstate__(self) -> dict[str, Any]:
        state = super().__getstate__()
        for key in (_MODEL, "retrofit_"):
            state.pop(key, None)
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        super().__setstate__(state)
        if hasattr(self, "model_") and _MODEL not in self.__dict__:
            self._retrofit_model(self.__dict__[_SETTINGS])       # rebuilt from saved weights


class RetrofittedTabICLClassifier(_RetrofittedEstimator, TabICLClassifier):
    """``TabICLClassifier`` whose model is retrofitted (made by :func:`make_classifier`)."""


class RetrofittedTabICLRegressor(_RetrofittedEstimator, TabICLRegressor):
    """``TabICLRegressor`` whose model is retrofitted (made by :func:`make_regressor`)."""


def _make(estimator: type, vendor: type, model_path: Any, arm: str, tau: float | None,
          eps: float | None, vendor_kwargs: dict[str, Any]) -> tuple[Any, Retrofit | None]:
    check_arm(arm, tau=tau, eps=eps)
    if arm == "base":
        return vendor(model_path=model_path, **vendor_kwargs), None
    out = estimator(model_path=model_path, **vendor_kwargs)
    out.__dict__[_SETTINGS] = (arm, TAU_RETROFIT if tau is None else tau,
                               EPS_RETROFIT if eps is None else eps)
    out._load_model()
    return out, out.retrofit_


def make_classifier(model_path: Any = None, arm: str = "full-o", tau: float | None = None, *,
                    eps: float | None = None, **vendor_kwargs: Any
                    ) -> tuple[Any, Retrofit | None]:
    """An unfitted ``TabICLClassifier`` (every argument but ``arm``, ``tau`` and ``eps`` is the
    vendor's, with the vendor's default) whose model is retrofitted with ``arm``.

    Args:
        model_path: the vendor's: a checkpoint file in the vendor's format, or None for the
            ``checkpoint_version`` the vendor downloads (``allow_auto_download``).
        arm: ``full-o`` (default), ``oa``, or ``base`` (the vendor's estimator unpatched; the
            Retrofit returned is None).
        tau, eps: presence scale (default ``TAU_RETROFIT`` = 1e-8) and OAttention ε (default
            0, the limit ε → 0⁺), see :func:`oretrofit.retrofit`.
    Returns:
        ``(classifier, retrofit)``; ``retrofit.model`` is the instance every ``fit`` and
        ``predict`` use (also ``classifier.retrofit_``).
    """
    return _make(RetrofittedTabICLClassifier, TabICLClassifier, model_path, arm, tau, eps,
                 vendor_kwargs)


def make_regressor(model_path: Any = None, arm: str = "full-o", tau: float | None = None, *,
                   eps: float | None = None, **vendor_kwargs: Any
                   ) -> tuple[Any, Retrofit | None]:
    """:func:`make_classifier` for ``TabICLRegressor``."""
    return _make(RetrofittedTabICLRegressor, TabICLRegressor, model_path, arm, tau, eps,
                 vendor_kwargs)


def retrofit_estimator(estimator: Any, arm: str, tau: float | None, eps: float | None
                       ) -> tuple[Any, Retrofit | None]:
    """An unfitted estimator with the vendor ``estimator``'s arguments whose model is retrofitted
    with ``arm``: what :class:`oretrofit.tabicl.Retrofitted` fits."""
    params = estimator.get_params(deep=False)
    maker = make_classifier if isinstance(estimator, TabICLClassifier) else make_regressor
    return maker(params.pop("model_path"), arm, tau, eps=eps, **params)
