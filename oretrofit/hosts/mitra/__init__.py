"""The Mitra host (autogluon.tabular's ``Tab2D``): ``host.py`` (its sites) over ``blocks.py``
(the O-mixin of its layer) and ``releases.py`` (the autogluon.tabular releases it admits);
``checkpoints.py`` (the vendor's checkpoint format, random models), ``padding.py`` (the token
boundary, and one forward over datasets of different sizes), ``estimators.py`` (retrofitted
``MitraClassifier`` / ``MitraRegressor``), ``meta_estimator.py`` (the sklearn meta-estimator
``Retrofitted``, whose arm and τ a search tunes) and ``batched.py`` (their ``predict`` over many
datasets in one padded forward). Needs ``autogluon.tabular[mitra]`` 1.6.0 to 1.6.3, which pins
``pandas<2.4`` and so lives in an environment of its own (``make test-mitra`` builds one).

This package is also the public entry point of the Mitra host, importable as ``oretrofit.mitra``
(``oretrofit/__init__.py`` names it so): ``from oretrofit.mitra import make_classifier``. Its
names are imported on first use, so importing the package imports neither torch nor autogluon.
"""

from __future__ import annotations

from ..._surgery.lazy import lazy_attributes as _lazy_attributes

# public name -> the module of this package that defines it
_HOMES = {"Retrofitted": "meta_estimator", "make_classifier": "estimators",
          "make_regressor": "estimators", "predict_batched": "batched",
          "predict_proba_batched": "batched", "padded_forward": "padding", "TINY": "checkpoints",
          "random_model": "checkpoints", "write_random_checkpoint": "checkpoints"}

__all__ = list(_HOMES)

__getattr__, __dir__ = _lazy_attributes(
    globals(), {name: (f".{home}", name) for name, home in _HOMES.items()})
