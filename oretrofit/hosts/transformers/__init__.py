"""The generic transformers host, one module per part: ``host.py`` (the layers' sites),
``backbones.py`` (where a model's layers are), ``boundary.py`` (the sites at the token boundary,
outside the layers), ``layouts.py`` (the layout table), ``stream.py`` (the residual stream a
layer's MLP branch reads, traced); the three attention routes, ``interface_route.py`` (the O
attention function of the attention interface), ``softmax_route.py`` (modules computing their
own softmax) and ``sdpa_route.py`` (modules calling SDPA themselves, transformers 4.x), with
``indexer.py`` (top-k sparse attention) and ``pooling.py`` (attention-pooling heads);
``capture.py`` (the carriers' presences, captured by hooks), ``cache.py`` (presences kept in
the KV cache beside their keys), ``gates.py`` (the gates by presence outside the attention
function); ``releases.py`` (the version gate and what differs between releases),
``selfcheck.py`` and ``shrink.py`` (a newer release's check of the model's architecture on a
tiny copy of it); ``contracts.py`` and ``inputs.py`` (the paper's contracts measured on a
model, and the inputs they run: example inputs, mask-free zero-padded batches), ``check.py``
(the contracts against their limits), ``calibrate.py`` (τ from lines of text), ``models.py``
(the models the CLI takes by name), ``loading.py`` (every ``from_pretrained``: offline, never a
folder's own code), ``pretrained.py`` (a retrofitted model saved and loaded as a folder) and
``report.py`` (the checks on real pretrained weights).
Importing this package imports none of them. Needs ``oretrofit[hf]``; its public entry point is
:mod:`oretrofit.transformers`.
"""
