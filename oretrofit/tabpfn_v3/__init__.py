"""TabPFN v3 host I/O: checkpoints, random/demo hosts, retrofitted regressors and classifiers, patched artifacts.

The sites themselves live in :mod:`oretrofit.patches.tabpfn_v3`. Needs ``oretrofit[tabpfn]``.
"""

from .artifact import load_patched_regressor, read_patch_spec, write_patched_artifact
from .checkpoints import (DEMO_CHECKPOINT, SIZES, build_model, checkpoint_sha256, load_checkpoint,
                          resolve_model_path, weights_label, write_random_checkpoint)
from .regressor import make_classifier, make_regressor

__all__ = ["make_regressor", "make_classifier", "resolve_model_path", "write_random_checkpoint", "checkpoint_sha256",
           "load_checkpoint", "build_model", "weights_label", "write_patched_artifact",
           "read_patch_spec", "load_patched_regressor", "SIZES", "DEMO_CHECKPOINT"]
