"""Tests of the TabPFN host.

``FAST``: the tabpfn arguments the tests pin where they do not test tabpfn's defaults (one
estimator on the CPU; tabpfn's ``n_estimators="auto"`` runs several).

``CDF_TRANSLATE``: tabpfn before 9.1.0 moves each estimator's fp32 bucket probabilities onto the
target's borders as differences of their CDFs (tabpfn.utils._cdf), which cancel: a logit change
of 1e-6 becomes up to 4e-4 of a translated probability and 3e-3 of a prediction (9.1.0 sums
positive overlaps: 5e-5). The model's own logits are as close to base as on later releases.
"""

from packaging.version import Version

from oretrofit.hosts.tabpfn import releases

FAST = {"device": "cpu", "n_estimators": 1}
CDF_TRANSLATE = Version(releases.installed_version() or "0") < Version("9.1.0")
