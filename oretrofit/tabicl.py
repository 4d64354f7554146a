"""TabICL: retrofitted classifiers and regressors (and the meta-estimator :class:`Retrofitted`),
many datasets' predictions batched, and random checkpoints in the vendor's format.

The public entry points of the TabICL host (:mod:`oretrofit.hosts.tabicl`, where the sites
live). Needs ``oretrofit[tabicl]``.
"""

from .hosts.tabicl.batched import predict_batched, predict_proba_batched
from .hosts.tabicl.checkpoints import TINY_CONFIG, random_model, write_random_checkpoint
from .hosts.tabicl.estimators import (RetrofittedTabICLClassifier, RetrofittedTabICLRegressor,
                                      make_classifier, make_regressor)
from .hosts.tabicl.meta_estimator import Retrofitted

__all__ = ["Retrofitted", "make_classifier", "make_regressor", "RetrofittedTabICLClassifier",
           "RetrofittedTabICLRegressor", "write_random_checkpoint", "random_model",
           "TINY_CONFIG", "predict_batched", "predict_proba_batched"]
