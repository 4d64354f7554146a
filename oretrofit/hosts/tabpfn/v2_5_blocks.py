"""O-mixins of the TabPFN v2 / v2.5 / v2.6 attention types (``architectures/tabpfn_v2.py``,
``tabpfn_v2_5.py`` and ``tabpfn_v2_6.py``, one layout: v2.6 swaps the blocks' LayerNorms for
RMSNorms). One copy for every release that ships them (8.0.1: the between-cells attention
returns a tensor; later: ``(output, kv_entry)`` and an explicit KV cache).

The carrier of both attentions is the block's residual stream ``x`` (post-norm blocks: the
attention reads ``x`` itself, its output is added and the sum normed):

* along-row (``per_sample_attention_between_features``): the cells of one row (feature groups +
  target cell) attend to each other,
  ``y_i = W_O · p_i Σ_j p_j e^{s_ij} v_j / (ε + Σ_j p_j e^{s_ij})``;
* along-column (``per_column_attention_between_cells``): the cells of one column, receivers
  every row (thinking, train, test), sources the thinking + train rows (``< single_eval_pos``);
  test rows read only the first key/value head (multi-query), as the vendor does. The KV cache
  (9.x) carries the sources' presences as one extra key channel ``(Bc, N, 1, D + 1)``.

q/k/v/out projections are bias-free, so the receiver gate ``p_i`` may sit before ``W_O``; the
norms (ONorm on ``layernorm_mha1/2``, ``layernorm_mlp``) and the MLP (OFFN) use the generic
:mod:`oretrofit.hosts.torch_nn` mixins.
"""

from __future__ import annotations

import inspect

import torch
from torch import Tensor

from ..._surgery.patching import SiteConfig, site_config
from ..._operators.presence import presence
from . import releases
from .v3_blocks import _o_attend, cached_presence_kv

__all__ = ["OAlongRowAttention", "OAlongColumnAttention"]


def _heads(module: torch.nn.Module, x: Tensor, projection: str) -> Tensor:
    """``(B, S, E) -> (B, S, H, D)`` through the named bias-free projection."""
    return getattr(module, projection)(x).view(*x.shape[:2], -1, module.head_dim)


class OAlongRowAttention:
    """``AlongRowAttention``: OAttention over the cells of one row (``(Br, C, E)``)."""

    def forward(self, x_BrSE: Tensor) -> Tensor:
        config = site_config(self, "attn")
        p = presence(x_BrSE, config.tau)                                     # (Br, C)
        q, k, v = (_heads(self, x_BrSE, f"{n}_projection") for n in "qkv")
        return self.out_projection(_o_attend(q, k, v, p, p, config))


class OAlongColumnAttention:
    """``AlongColumnAttention``: receivers all rows of a column, sources the thinking + train
    rows; test rows on the first KV head (MQA). Returns what the release's forward returns."""

    def forward(self, x_BcRE: Tensor, single_eval_pos: int | None = None, *,
                cached_kv: object | None = None, return_kv: bool = False
                ) -> Tensor | tuple[Tensor, object | None]:
        config = site_config(self, "attn")
        bc, r, _ = x_BcRE.shape
        p = presence(x_BcRE, config.tau)                                     # (Bc, R)
        q = _heads(self, x_BcRE, "q_projection")
        kv_entry = None
        if cached_kv is not None:
            out = self._o_cached(q, p, cached_kv, config)
        else:
            n = r if single_eval_pos is None else single_eval_pos
            k, v = (_heads(self, x_BcRE[:, :n], f"{s}_projection") for s in "kv")
            p_k = p[:, :n]
            out = _o_attend(q[:, :n], k, v, p[:, :n], p_k, config)
            if n < r:                                      # test rows: first KV head only
                out = torch.cat([out, _o_attend(q[:, n:], k[:, :, :1], v[:, :, :1], p[:, n:],
                                                p_k, config)], dim=1)
            if return_kv:
                channel = p_k.to(k.dtype)[:, :, None, None]
                kv_entry = releases.kv_cache_entry(
                    torch.cat([k[:, :, :1], channel], -1).detach(),
                    v[:, :, :1].contiguous().detach())
        out = self.out_projection(out)
        if "return_kv" in inspect.signature(super().forward).parameters:      # 9.x
            return out, kv_entry
        return out

    def _o_cached(self, q: Tensor, p_q: Tensor, cached_kv: object, config: SiteConfig) -> Tensor:
        """Every row a test row, over the cached thinking + train rows (head 0)."""
        k, v, p_k = cached_presence_kv(cached_kv, self.head_dim, "v2.x", q.dtype)
        return _o_attend(q, k, v, p_q, p_k, config)
