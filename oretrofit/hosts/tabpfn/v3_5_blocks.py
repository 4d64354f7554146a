"""O-mixins of the TabPFN v3.5 types that v3 lacks (``architectures/tabpfn_v3_5.py``, tabpfn
9.0.0+); its attention blocks, decoder and target encodings reuse
:mod:`oretrofit.hosts.tabpfn.v3_blocks` (the same layout, plus per-head q/k norms).

* ``OPreHeadMLP``: the heads' residual pre-norm MLP (``_PreHeadMLP``) as OFFN,
  ``x + ρτ(x) · MLP(Norm(x))`` (eq. 15), ``x`` the row embedding after ``output_norm``.
* ``OTabPFNV3p5``: the v3.5 model with ``forward``'s own signature (tabpfn reads it).
"""

from __future__ import annotations

import functools

from tabpfn.architectures import tabpfn_v3_5 as v3_5
from torch import Tensor

from ..._surgery.patching import site_config
from .v3_blocks import OTabPFN, _ffn_branch

__all__ = ["OPreHeadMLP", "OTabPFNV3p5"]


class OPreHeadMLP:
    """``_PreHeadMLP`` of the regression or classification head: OFFN on the row embedding."""

    def forward(self, x: Tensor) -> Tensor:
        return x + _ffn_branch(self.mlp, self.norm, x, site_config(self, "ffn"))


class OTabPFNV3p5(OTabPFN):
    """:class:`~oretrofit.hosts.tabpfn.v3_blocks.OTabPFN` for ``TabPFNV3p5``."""

    @functools.wraps(v3_5.TabPFNV3p5.forward)     # tabpfn reads the signature (return_kv_cache)
    def forward(self, *args: object, **kwargs: object) -> object:
        return self._forward(*args, **kwargs)
