"""``oretrofit.tabpfn.Retrofitted``: the sklearn meta-estimator
(:mod:`oretrofit._surgery.meta_estimator`) over tabpfn's TabPFNRegressor / TabPFNClassifier."""

from __future__ import annotations

from ..._surgery.meta_estimator import for_family
from .estimators import retrofit_estimator

__all__ = ["Retrofitted"]

Retrofitted = for_family(__name__, "tabpfn", "tabpfn's TabPFNRegressor / TabPFNClassifier",
                         retrofit_estimator)
