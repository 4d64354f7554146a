"""The paper's operators, what a reader checks against its equations: token presence (eq. 3, 9)
with its memo and per-module profile, OAttention (the reference and the fused entry), the
OAttention modules, the residual components (OFFN, ONorm, OInject, OStandardize) and the
transformer block.

May import :mod:`oretrofit._kernels` (how OAttention runs fast, and the dtype helpers) and
nothing else of oretrofit.
"""
