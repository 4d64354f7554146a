"""The TabICL host: ``host.py`` over ``sites.py`` (the named sites of a ``TabICL`` model) and
``blocks.py`` (their O-mixins), ``releases.py`` (the tabicl releases it admits),
``estimators.py`` (retrofitted ``TabICLClassifier`` / ``TabICLRegressor``) and ``padding.py``
(the token boundaries where the model creates tokens, and padding made inert there). Importing
this package imports none of them; the public entry points are :mod:`oretrofit.tabicl`. Needs
``oretrofit[tabicl]``.
"""
