"""The generic transformers host: ``host.py`` (the layers' sites), ``backbones.py`` (where a model's
layers are), ``boundary.py`` (the sites at the token boundary, outside the layers), ``layouts.py``
(the layout table), ``attention.py`` (the O attention function), ``softmax_route.py`` (OAttention
for modules computing their own softmax), ``capture.py`` (the carriers' presences, captured by
hooks), ``gates.py`` (the gates by presence outside the attention function), ``releases.py`` (the
version gate and what differs between releases), ``selfcheck.py`` and ``shrink.py`` (a newer
release's check of the model's architecture on a tiny copy of it), ``contracts.py`` and
``inputs.py`` (the paper's contracts measured on a model, and the inputs they run: example inputs,
mask-free zero-padded batches), ``check.py`` (the contracts against their limits), ``calibrate.py``
(τ from lines of text), ``models.py`` (the models the CLI takes by name), ``loading.py`` (every
``from_pretrained``: offline, never a folder's own code) and ``report.py`` (the checks on real
pretrained weights).
Importing this package imports none of them. Needs ``oretrofit[hf]``; its public entry point is
:mod:`oretrofit.transformers`.
"""
