"""``oretrofit.mitra.Retrofitted``: the sklearn meta-estimator
(:mod:`oretrofit._surgery.meta_estimator`) over autogluon's MitraClassifier / MitraRegressor."""

from __future__ import annotations

from ..._surgery.meta_estimator import for_family
from .estimators import retrofit_estimator

__all__ = ["Retrofitted"]

Retrofitted = for_family(__name__, "autogluon.tabular.models.mitra",
                         "autogluon's MitraClassifier / MitraRegressor", retrofit_estimator)
