"""Retrofitted ``TabDPTClassifier`` / ``TabDPTRegressor``: the vendor's estimator, every argument
passed through with the vendor's names and defaults, its model retrofitted in place.

A TabDPT estimator loads its model once, in ``__init__`` (``model_weight_path``, or the Hugging
Face download when it is None), and ``fit`` only keeps the data: the retrofit put on
``estimator.model`` is the one every later ``fit`` and ``predict`` runs, and it pickles with the
estimator. ``sklearn.clone`` builds a new estimator, which loads the checkpoint afresh, unpatched.
"""

from __future__ import annotations

import os
from typing import Any

from ..._operators.presence import EPS_RETROFIT, TAU_RETROFIT
from ..._surgery.registry import Retrofit, RetrofitError, check_arm, retrofit

__all__ = ["make_classifier", "make_regressor", "retrofit_estimator"]


def _make(kind: str, model_path: str | os.PathLike[str] | None, arm: str, tau: float, eps: float,
          vendor_kwargs: dict[str, Any]) -> tuple[Any, Retrofit | None]:
    check_arm(arm)
    if "model_weight_path" in vendor_kwargs:
        raise RetrofitError("model_path is tabdpt's model_weight_path: pass the checkpoint once, "
                            "as model_path")
    import tabdpt
    estimator = getattr(tabdpt, kind)(
        model_weight_path=None if model_path is None else os.fspath(model_path), **vendor_kwargs)
    return retrofit_estimator(estimator, arm, tau, eps)


def retrofit_estimator(estimator: Any, arm: str, tau: float | None, eps: float | None
                       ) -> tuple[Any, Retrofit | None]:
    """``estimator`` (a TabDPT estimator: it loaded its own model in ``__init__``) with that
    model retrofitted in place with ``arm`` (τ, ε None: ``TAU_RETROFIT``, ``EPS_RETROFIT``):
    what :class:`oretrofit.tabdpt.Retrofitted` fits, given a clone."""
    if arm == "base":
        return estimator, None
    return estimator, retrofit(estimator.model, arm, TAU_RETROFIT if tau is None else tau,
                               EPS_RETROFIT if eps is None else eps)


def make_classifier(model_path: str | os.PathLike[str] | None, arm: str = "full-o",
                    tau: float = TAU_RETROFIT, *, eps: float = EPS_RETROFIT,
                    **vendor_kwargs: Any) -> tuple[Any, Retrofit | None]:
    """A ``tabdpt.TabDPTClassifier`` whose model is retrofitted with ``arm``.

    Args:
        model_path: the checkpoint (tabdpt's ``model_weight_path``: a safetensors file in the
            vendor's format, e.g. :func:`oretrofit.tabdpt.write_random_checkpoint`), or None for
            the vendor's download from the Hugging Face Hub.
        arm: ``base`` (unpatched; the Retrofit returned is None), ``oa`` or ``full-o``.
        tau, eps: presence scale (default ``TAU_RETROFIT`` = 1e-8) and OAttention ε (default 0,
            the limit ε → 0⁺), as :func:`oretrofit.retrofit`.
        vendor_kwargs: every other ``TabDPTClassifier`` argument, by the vendor's name, with the
            vendor's defaults (``device``, ``use_flash``, ``compile``, ``context_reduction``…).
    Returns:
        ``(classifier, retrofit)``; ``retrofit.model`` is ``classifier.model``.
    """
    return _make("TabDPTClassifier", model_path, arm, tau, eps, vendor_kwargs)


def make_regressor(model_path: str | os.PathLike[str] | None, arm: str = "full-o",
                   tau: float = TAU_RETROFIT, *, eps: float = EPS_RETROFIT,
                   **vendor_kwargs: Any) -> tuple[Any, Retrofit | None]:
    """A ``tabdpt.TabDPTRegressor`` whose model is retrofitted with ``arm`` (the arguments are
    those of :func:`make_classifier`, the vendor's being ``TabDPTRegressor``'s)."""
    return _make("TabDPTRegressor", model_path, arm, tau, eps, vendor_kwargs)
