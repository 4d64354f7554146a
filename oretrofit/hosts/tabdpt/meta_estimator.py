"""``oretrofit.tabdpt.Retrofitted``: the sklearn meta-estimator
(:mod:`oretrofit._surgery.meta_estimator`) over tabdpt's TabDPTClassifier / TabDPTRegressor."""

from __future__ import annotations

from ..._surgery.meta_estimator import for_family
from .estimators import retrofit_estimator

__all__ = ["Retrofitted"]

Retrofitted = for_family(__name__, "tabdpt", "tabdpt's TabDPTClassifier / TabDPTRegressor", retrofit_estimator)
