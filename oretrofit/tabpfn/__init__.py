"""TabPFN: retrofitted regressors and classifiers, checkpoints, demo/random hosts, artifacts.

The public entry points of the TabPFN host (:mod:`oretrofit.hosts.tabpfn`, where the sites and
their I/O live). Needs ``oretrofit[tabpfn]``. :class:`Retrofitted` is the sklearn meta-estimator
whose arm, τ and ε a search tunes.
"""

from ..hosts.tabpfn.batched import predict_batched, predict_proba_batched
from ..hosts.tabpfn.artifact import read_patch_spec, write_patched_artifact
from ..hosts.tabpfn.checkpoints import (DEMO_CHECKPOINT, DEMO_CLASSIFIER_CHECKPOINT, SIZES, build_model,
                                        checkpoint_sha256,
                                        load_checkpoint, resolve_model_path, weights_label,
                                        write_random_checkpoint)
from ..hosts.tabpfn.estimators import (load_patched_classifier, load_patched_regressor,
                                       make_classifier, make_regressor, vendor_defaults)
from ..hosts.tabpfn.meta_estimator import Retrofitted

__all__ = ["make_regressor", "make_classifier", "vendor_defaults", "resolve_model_path",
           "write_random_checkpoint", "checkpoint_sha256", "load_checkpoint", "build_model",
           "weights_label", "write_patched_artifact", "read_patch_spec", "load_patched_regressor",
           "load_patched_classifier", "SIZES", "DEMO_CHECKPOINT", "DEMO_CLASSIFIER_CHECKPOINT", "predict_batched",
           "predict_proba_batched", "Retrofitted"]
