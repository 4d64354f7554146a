"""TabDPT: retrofitted classifiers and regressors (and the meta-estimator :class:`Retrofitted`),
vendor-format checkpoints, one padded forward over several datasets.

The public entry points of the TabDPT host (:mod:`oretrofit.hosts.tabdpt`, where the sites and
their I/O live). Needs ``tabdpt`` 1.3.1, which pins ``huggingface-hub<2.0`` and so lives in an
environment of its own beside transformers 5.x (``make test-tabdpt`` builds one).
"""

from ..hosts.tabdpt.batched import predict_batched, predict_proba_batched
from ..hosts.tabdpt.checkpoints import (TINY, checkpoint_config, random_model, write_checkpoint,
                                        write_random_checkpoint)
from ..hosts.tabdpt.estimators import make_classifier, make_regressor
from ..hosts.tabdpt.meta_estimator import Retrofitted
from ..hosts.tabdpt.padding import padded_forward

__all__ = ["Retrofitted", "make_classifier", "make_regressor", "predict_batched",
           "predict_proba_batched", "padded_forward", "TINY", "checkpoint_config",
           "random_model", "write_checkpoint", "write_random_checkpoint"]
