"""The TabDPT host: ``host.py`` (the sites of a ``tabdpt.model.TabDPTModel``) over ``blocks.py``
(the O-mixin of its layer) and ``releases.py`` (the tabdpt releases it admits);
``checkpoints.py`` (the vendor's checkpoint format, random models), ``padding.py`` (the token
boundary, and one forward over datasets of different sizes), ``estimators.py`` (retrofitted
``TabDPTClassifier`` / ``TabDPTRegressor``) and ``batched.py`` (their ``predict`` over many
datasets in one padded forward). Importing this package imports none of them; the
public entry points are :mod:`oretrofit.tabdpt`. Needs ``tabdpt`` (``make test-tabdpt`` builds
an environment with it: tabdpt pins ``huggingface-hub<2.0``).
"""
