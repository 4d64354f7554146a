"""Tests of the TabPFN host.

``FAST``: the tabpfn arguments the tests pin where they do not test tabpfn's defaults (one
estimator on the CPU; tabpfn's ``n_estimators="auto"`` runs several).
"""

FAST = {"device": "cpu", "n_estimators": 1}
