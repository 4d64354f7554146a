"""The TabPFN host: ``v3.py`` and ``v3_blocks.py`` (the v3 sites and O-blocks), ``releases.py``
(the tabpfn releases it admits and what differs between them), ``checkpoints.py`` (checkpoints,
the demo/random hosts), ``estimators.py`` (retrofitted regressors and classifiers) and
``artifact.py`` (patched artifacts). Importing this package imports none of them; the public
entry points are :mod:`oretrofit.tabpfn`. Needs ``oretrofit[tabpfn]``.
"""
