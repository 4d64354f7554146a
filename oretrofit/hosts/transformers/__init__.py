"""The generic transformers host: ``host.py`` (its sites), ``layouts.py`` (the layout table),
``attention.py`` (the O attention function), ``gates.py`` (the gates outside the layers),
``releases.py`` (the version gate and what differs between releases), ``contracts.py`` (the
paper's contracts measured on a model), ``calibrate.py`` (τ from lines of text), ``models.py``
(the models the CLI takes by name) and ``report.py`` (the checks on real pretrained weights).
Importing this package imports none of them. Needs ``oretrofit[hf]``.
"""
