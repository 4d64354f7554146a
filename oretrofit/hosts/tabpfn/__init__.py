"""The TabPFN host: ``host.py`` over ``versions.py`` (one table of the model versions),
``v2_5.py``/``v2_5_blocks.py`` (v2.5 and v2.6), ``v3.py``/``v3_blocks.py`` and
``v3_5.py``/``v3_5_blocks.py`` (each version's sites and O-blocks), ``releases.py``
(the tabpfn releases it admits and what differs between them), ``checkpoints.py`` (checkpoints,
the demo/random hosts), ``estimators.py`` (tabpfn's own regressors and classifiers over a
patched artifact), ``artifact.py`` (the patched artifact's file), ``reload.py`` (tabpfn's
loader re-applies an artifact's spec) and ``batched.py`` over ``rendezvous.py`` (each dataset's
fit and predict on a thread, its forwards answered from batched ones), ``forward_plan.py``
(which forwards) and ``padding.py`` (each version's token boundaries). Importing this package
imports none of them; the public entry points are :mod:`oretrofit.tabpfn`. Needs
``oretrofit[tabpfn]``.
"""
