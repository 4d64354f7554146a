"""The O-mixin for Mitra's ``Layer`` (``autogluon/tabular/models/mitra/_internal/models/tab2d.py``;
the releases it fits are in :mod:`oretrofit.hosts.mitra.releases`).

Mitra is a cell grid ``(b, s, f + 1, d)``: per row, the label token (column 0) and one token per
feature. A layer is attention across rows (each column's query rows read its support rows),
an FFN, attention across features (each row's tokens read each other), an FFN; all pre-norm
with biased projections. The carrier of every site is the residual stream entering its branch
(read before the LayerNorm):

* attention (``rows.attn``, ``features.attn``):
  ``y_i = p_i (W_O Σ_j p_j e^{s_ij} v_j / Σ_j p_j e^{s_ij} + b_O)`` (OAttention, eq. 7, with
  the output bias gated by the receiver: :func:`oretrofit.hosts.torch_nn.gated_linear`).
* FFN (``rows.ffn``, ``features.ffn``): ``ρτ(h) · W₂ GELU(W₁ Norm(h) + b₁) + b₂``, the whole
  branch gated (OFFN, eq. 15).
* norm (the host's norm sites, :class:`oretrofit.hosts.torch_nn.ONormSite` on the four
  LayerNorms): ``ρτ(h) · LayerNorm(h)`` (ONorm, eq. 16).

Only the vendor's dense path is retrofitted (``Layer.forward`` without padders); its
flash-attn path (CUDA with ``flash_attn`` installed) is refused, see
:meth:`oretrofit.hosts.mitra.host.MitraHost.check`.
"""

from __future__ import annotations

import einops
import torch.nn.functional as F
from torch import Tensor, nn

from ..._operators.attention import o_attention
from ..._operators.components import o_gate
from ..._operators.presence import presence
from ..._surgery.host import RetrofitError
from ..._surgery.patching import SiteConfig, site_config
from ..torch_nn import gated_linear

__all__ = ["OLayer", "KEYS"]

KEYS = ("rows.attn", "rows.ffn", "features.attn", "features.ffn")


def _heads(x: Tensor, heads: int) -> Tensor:
    return einops.rearrange(x, "b t (h d) -> b h t d", h=heads)


def _attend(mha: nn.Module, query: Tensor, source: Tensor, p_q: Tensor, p_k: Tensor,
            config: SiteConfig | None) -> Tensor:
    """Mitra's ``MultiheadAttention`` of ``query (B, Nq, d)`` over ``source (B, Nk, d)``: the
    vendor's, or OAttention with receiver presences ``p_q (B, Nq)`` and source presences
    ``p_k (B, Nk)``."""
    if config is None:
        return mha(query, source, source)
    q, k, v = (_heads(proj(x), mha.n_heads) for proj, x in
               ((mha.q, query), (mha.k, source), (mha.v, source)))
    out, _ = o_attention(q, k, v, p_q, p_k, eps=config.eps)
    return gated_linear(mha.o, einops.rearrange(out, "b h t d -> b t (h d)"), p_q)


def _ffn(norm: nn.Module, up: nn.Linear, down: nn.Linear, h: Tensor,
         config: SiteConfig | None) -> Tensor:
    """The FFN branch ``down(GELU(up(norm(h))))``, gated by ``ρτ(h)`` under O."""
    out = down(F.gelu(up(norm(h))))
    return out if config is None else o_gate(presence(h, config.tau), out)


class OLayer:
    """Mitra's ``Layer``: support and query cells ``(b, s, f + 1, d)`` -> the same, updated."""

    def forward(self, support: Tensor, query: Tensor, padder_support: object = None,
                padder_query: object = None, batch_size: int | None = None,
                *_masks: object) -> tuple[Tensor, Tensor]:
        """The vendor's dense path with the patched sites gated; its padding masks are not read
        there by the vendor either (presence is what makes zero cells inert)."""
        if padder_support is not None or padder_query is not None:
            raise RetrofitError("Mitra's flash-attn path reached a retrofitted layer; the Mitra "
                                "host retrofits the dense path only")
        rows_attn, rows_ffn, feats_attn, feats_ffn = (site_config(self, k) for k in KEYS)
        support, query = self._rows(support, query, rows_attn)
        support, query = (x + _ffn(self.layer_norm2, self.linear1, self.linear2, x, rows_ffn)
                          for x in (support, query))
        support, query = (x + self._features(x, feats_attn) for x in (support, query))
        support, query = (x + _ffn(self.layer_norm4, self.linear3, self.linear4, x, feats_ffn)
                          for x in (support, query))
        return support, query

    def _rows(self, support: Tensor, query: Tensor,
              config: SiteConfig | None) -> tuple[Tensor, Tensor]:
        """Attention across rows, per column: support and query rows read the support rows."""
        b = support.shape[0]
        flat = [einops.rearrange(x, "b s f d -> (b f) s d") for x in (support, query)]
        normed = [einops.rearrange(self.layer_norm1(x), "b s f d -> (b f) s d")
                  for x in (support, query)]
        p = [None, None] if config is None else [presence(x, config.tau) for x in flat]
        out = [_attend(self.attention1, n, normed[0], p_x, p[0], config)
               for n, p_x in zip(normed, p)]
        return tuple(x + einops.rearrange(o, "(b f) s d -> b s f d", b=b)
                     for x, o in zip((support, query), out))

    def _features(self, x: Tensor, config: SiteConfig | None) -> Tensor:
        """Attention across one row's tokens (label and features), ``(b, s, f + 1, d)``."""
        b = x.shape[0]
        normed = einops.rearrange(self.layer_norm3(x), "b s f d -> (b s) f d")
        p = None if config is None else presence(einops.rearrange(x, "b s f d -> (b s) f d"),
                                                 config.tau)
        out = _attend(self.attention2, normed, normed, p, p, config)
        return einops.rearrange(out, "(b s) f d -> b s f d", b=b)
