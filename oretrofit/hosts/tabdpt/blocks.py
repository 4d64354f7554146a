"""The O-mixin for tabdpt's ``TransformerEncoderLayer`` (``tabdpt/model.py``; one copy for every
admitted release, see :mod:`oretrofit.hosts.tabdpt.releases`).

Swapped in by :func:`oretrofit._surgery.patching.set_site` as ``OTransformerEncoderLayer`` and
reading its per-site settings with :func:`site_config`; an unpatched site keeps the vendor's
computation. Parameters, buffers and ``state_dict`` keys are never touched. The layer returns
its residual ``attn + FFN``; the model adds it to the rows' tokens.

The carrier of every site is the row token ``x`` entering the layer (the residual stream,
before ``attn_norm``), or for the FFN the stream ``x + attn`` entering ``ff_norm``:

* attention (``attn``): every row reads the context rows (the first ``eval_pos``, thinking rows
  included):
  ``y_i = W_O · g_i ⊙ p_i Σ_j p_j e^{β s_ij} v_j / (ε + Σ_j p_j e^{β s_ij})`` with ``s_ij`` after
  the per-head q/k RMSNorm, ``g_i = σ(W_g q_i)`` the vendor's per-head query gate and ``β`` its
  length scale ``1 + κ·max(0, log(min(n, n_max)/n₀))``. The projections are bias-free, so the
  receiver gate ``p_i`` may sit before ``W_O``. Under O, ``n`` (the number of context rows) is
  the presence mass ``S_b = Σ_j p_bj`` of each batch element instead, so a null context row
  changes neither the weights nor the scale.
* target encoding (``te``): the target embedding ``e(y_j)`` concatenated into the value input
  ``[h_j, e(y_j)]`` of a context row, gated by that row's presence: ``[h_j, ρτ(x_j) · e(y_j)]``
  (OInject, eq. 17, on the concatenation: a null row carries no target).
* FFN (``ffn``): ``ρτ(s) · SwiGLU(Norm(s))``, ``s = x + attn``   (OFFN, eq. 15)
* norm (``norm``, on ``attn_norm`` and ``ff_norm``): ``ρτ(h) · LayerNorm(h)`` (ONorm, eq. 16; the
  affine LayerNorm would give a null row the bias).

The sites that read one carrier at one τ share its presences, computed once per layer call (the
norm's, the target's and the attention's of ``x``; the norm's and the FFN's of ``x + attn``): a
prediction runs under ``torch.inference_mode``, where the presence memo of the hooks
(:mod:`oretrofit._operators.presence_memo`) does not serve, and small tables make these a
noticeable share of a call.

The q/k RMSNorms act per head on a row's own projections, which are exactly 0 for a null row
(bias-free projections of an ONorm'd 0): they are token-local and need no gate.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor

from ..._operators.attention import o_attention
from ..._operators.components import o_gate
from ..._operators.presence import presence
from ..._surgery.patching import SiteConfig, site_config

__all__ = ["OTransformerEncoderLayer"]

_KEYS = ("norm", "te", "attn", "ffn")           # the layer's sites, as host.py names them


def _presences(h: Tensor, *configs: SiteConfig | None) -> dict[float, Tensor]:
    """ρτ(h) ``(B, L)`` at the τ of each patched site among ``configs``, once per τ: the sites
    of a layer that gate by the same carrier share its presences."""
    return {tau: presence(h, tau) for tau in {c.tau for c in configs if c is not None}}


def _gated(branch: Tensor, p: dict[float, Tensor], config: SiteConfig | None) -> Tensor:
    """``ρτ · branch`` (eq. 11) at the site's τ; the branch itself where the site is not
    patched."""
    return branch if config is None else o_gate(p[config.tau], branch)


class OTransformerEncoderLayer:
    """tabdpt's ``TransformerEncoderLayer``: rows (``L``) read the context rows (``eval_pos``)."""

    def forward(self, x: Tensor, y: Tensor, eval_pos: int) -> Tensor:
        """``x (L, B, D)`` row tokens, ``y (eval_pos, B, E_y)`` the context rows' target
        embeddings -> the residual ``(L, B, D)``, as the vendor's."""
        norm_cfg, te_cfg, attn_cfg, ffn_cfg = (site_config(self, key) for key in _KEYS)
        x_BLD, y_BND = x.transpose(0, 1), y.transpose(0, 1)
        b, n_rows, _ = x_BLD.shape
        p_x = _presences(x_BLD, norm_cfg, attn_cfg)
        h = _gated(self.attn_norm(x_BLD), p_x, norm_cfg)
        q = self.q_proj(h)
        gate = torch.sigmoid(self.q_gate(q))                                 # (B, L, H)
        if te_cfg is not None:
            p_ctx = (p_x[te_cfg.tau][:, :eval_pos] if te_cfg.tau in p_x
                     else presence(x_BLD[:, :eval_pos], te_cfg.tau))
            y_BND = o_gate(p_ctx, y_BND)
        k = self.k_proj(h[:, :eval_pos])
        v = self.v_proj(torch.cat([h[:, :eval_pos], y_BND], dim=-1))
        q, k, v = (t.view(b, -1, self.num_heads, self.head_dim).transpose(1, 2) for t in (q, k, v))
        q, k = self.q_norm(q), self.k_norm(k)
        attn = self._attend(q, k, v, p_x, eval_pos, attn_cfg).transpose(1, 2)
        attn = attn * gate.unsqueeze(-1)
        attn = self.out_proj(attn.reshape(b, n_rows, self.num_heads * self.head_dim))
        stream = x_BLD + attn
        p_stream = _presences(stream, norm_cfg, ffn_cfg)
        ffn = _gated(self.ff(_gated(self.ff_norm(stream), p_stream, norm_cfg)), p_stream, ffn_cfg)
        return (attn + ffn).transpose(0, 1)

    def _attend(self, q: Tensor, k: Tensor, v: Tensor, p_x: dict[float, Tensor], eval_pos: int,
                config: SiteConfig | None) -> Tensor:
        """Attention of every row over the context rows, ``(B, H, L, D)``: the vendor's SDPA
        with its length scale, or OAttention with the scale read from the presence mass."""
        scale = 1.0 / math.sqrt(self.head_dim)
        if config is None:
            beta = self.get_scale_param(eval_pos, device=q.device, dtype=q.dtype)
            return F.scaled_dot_product_attention(q, k, v, scale=scale * beta)
        p = p_x[config.tau]                                                  # (B, L)
        p_k = p[:, :eval_pos]
        beta = self.get_scale_param(p_k.sum(-1), device=q.device, dtype=q.dtype)   # (B,) or ()
        out, _ = o_attention(q * beta.reshape(-1, 1, 1, 1), k, v, p, p_k, eps=config.eps,
                             scale=scale)
        return out
