"""How OAttention runs fast: :mod:`.routes` decides the kernel route of every call (one table,
one check cache); one module per backend (:mod:`.sdpa`, :mod:`.lse` — the log-sum-exp path —,
:mod:`.cudnn`, :mod:`.flex`, :mod:`.triton`); and the dtype helpers every operator computes with.

Imports nothing of oretrofit outside this package.
"""
