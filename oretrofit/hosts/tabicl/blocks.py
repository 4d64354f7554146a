"""O-mixins for TabICL's building blocks (``tabicl/_model/layers.py``, ``embedding.py``,
``learning.py``; the releases they fit are in :mod:`oretrofit.hosts.tabicl.releases`).

Every attention of TabICL is one block type, ``MultiheadAttentionBlock`` (a pre-norm
``nn.TransformerEncoderLayer`` whose ``attn`` is TabICL's own ``nn.MultiheadAttention``
subclass with RoPE, scalable softmax and a KV cache), so one mixin serves the column
embedder's induced attention, the row transformer and the ICL transformer. The carrier of every
site is the residual stream entering the block (queries ``q``, sources ``k``), read before the
LayerNorm:

* attention (``attn``): ``y_i = p_i (W_O Σ_j p_j e^{s_ij} v_j / Σ_j p_j e^{s_ij} + b_O)`` with
  ``s_ij`` after RoPE and the scalable softmax, whose ``log n`` becomes ``log S_b``, ``S_b``
  the presence mass of the sources (:mod:`oretrofit._operators.scalable_softmax`).
* FFN (``ffn``):        ``h + ρτ(h) · FFN(Norm(h))``   (OFFN, eq. 15)
* norm:                 ``ρτ(h) · LayerNorm(h)``        (ONorm, eq. 16, on each LayerNorm module)
* target embeddings (``te.col``, ``te.icl``): ``h + ρτ(h) · e(y)`` (OInject, eq. 17): the
  vendor adds ``y_encoder(y)`` to the train rows' cell tokens ``h = in_linear(x)`` (column
  embedder) and row tokens ``h = R`` (ICL); while the site is patched a forward hook on
  ``y_encoder`` (:func:`target_hook`) gates its output by the presence of that carrier.

Under O the KV cache keeps the sources' presences as one extra key channel ``(…, H, S, D + 1)``,
so they travel wherever tabicl slices, concatenates or moves the cache.
"""

from __future__ import annotations

import inspect
import threading
from typing import Any, Callable

import torch
import torch.nn.functional as F
from tabicl._model.ssmax import QASSMaxMLP, SSMax, SSMaxMLP
from torch import Tensor, nn

from ..._operators.attention import o_attention
from ..._operators.components import o_gate
from ..._operators.presence import presence
from ..._operators.scalable_softmax import log_mass, query_aware_scaled
from ..._surgery.host import RetrofitError
from ..._surgery.patching import SiteConfig, site_config
from ..torch_nn import gated_linear

__all__ = ["OAttentionBlock", "OColEmbedding", "OICLearning", "target_hook", "mass_scaled",
           "cached_presence_kv"]


class _TargetGates(threading.local):
    """The gates the patched target embeddings left for this thread's forward, keyed by
    ``id(y_encoder)``: never on the module, so concurrent forwards of one model never see each
    other's."""

    def __init__(self) -> None:
        self.gates: dict[int, Callable[[Tensor], Tensor]] = {}


_GATES = _TargetGates()


def target_hook(module: nn.Module, _inputs: object, output: Tensor) -> Tensor:
    """The forward hook a ``te.*`` site puts on ``y_encoder`` while patched: the gate left by
    the running method for this thread, if any (module level, so the hook pickles)."""
    gate = _GATES.gates.get(id(module))
    return output if gate is None else gate(output)


def mass_scaled(layer: nn.Module, q: Tensor, mass: Tensor) -> Tensor:
    """TabICL's scalable softmax ``q (…, H, S, D)`` with ``n`` replaced by the presence mass
    ``S (…)`` of each batch element (``SSMax``: ``q · s_h log S``; ``SSMaxMLP``:
    ``q · mlp(log S)``; ``QASSMaxMLP``: ``q ⊙ base_mlp(log S) ⊙ (1 + tanh(query_mlp(q)))``)."""
    log_s = log_mass(mass, q.dtype)[..., None]                               # (..., 1)
    heads = q.shape[-3]
    if isinstance(layer, QASSMaxMLP):
        return query_aware_scaled(q, layer.base_mlp(log_s).unflatten(-1, (heads, 1, -1)),
                                  layer.query_mlp)
    if isinstance(layer, SSMaxMLP):
        return q * layer.mlp(log_s).unflatten(-1, (heads, 1, -1))
    if isinstance(layer, SSMax):
        return q * (layer.scales.view(heads, 1, 1) * log_s[..., None, None])
    raise RetrofitError(f"the scalable softmax {type(layer).__name__} is not one the TabICL host "
                        "knows (SSMax, SSMaxMLP, QASSMaxMLP); install a tested tabicl release")


def cached_presence_kv(entry: Any, head_dim: int) -> tuple[Tensor, Tensor, Tensor]:
    """A KV cache entry built under O: keys ``(…, H, S, D)``, values and the sources'
    presences ``(…, S)`` read back from the extra key channel. One built without the channel
    (before the retrofit) is refused."""
    key, value = entry.key, entry.value
    if key is None or key.shape[-1] != head_dim + 1:
        raise RetrofitError("this TabICL KV cache was built without the sources' presences "
                            "(fitted before the retrofit, or on another model); fit again after "
                            "retrofitting")
    return key[..., :-1], value, key[..., 0, :, -1]


def _heads(x: Tensor, heads: int) -> Tensor:
    """``(…, S, E) -> (…, H, S, D)``."""
    return x.unflatten(-1, (heads, -1)).transpose(-3, -2)


class OAttentionBlock:
    """``MultiheadAttentionBlock`` (pre-norm): the attention (``attn``) and FFN (``ffn``)
    sites; either may be patched alone, the other keeping the vendor's computation."""

    def forward(self, q: Tensor, k: Tensor | None = None, v: Tensor | None = None,
                cached_kv: Any = None, key_padding_mask: Tensor | None = None,
                attn_mask: Tensor | None = None, train_size: int | None = None,
                rope: nn.Module | None = None, need_kv: bool = False) -> Any:
        attn_cfg, ffn_cfg = site_config(self, "attn"), site_config(self, "ffn")
        if train_size is not None:
            k = v = q[..., :train_size, :]
        else:
            k, v = (q if k is None else k), (q if v is None else v)
        if attn_cfg is None:
            attn, kv = self._host_attention(q, k, v, cached_kv, key_padding_mask, attn_mask,
                                            train_size, rope, need_kv)
        else:
            if key_padding_mask is not None or attn_mask is not None:
                raise RetrofitError("a retrofitted TabICL attention takes no masks: pad with "
                                    "zero vectors instead (they are inert under O)")
            attn, kv = self._o_attention(q, k, v, cached_kv, train_size, rope, need_kv,
                                         attn_cfg)
        x = q + self.dropout1(attn)
        y = self._ff_block(self.norm2(x))
        x = x + (y if ffn_cfg is None else o_gate(presence(x, ffn_cfg.tau), y))
        return (x, *kv) if need_kv and kv is not None else x

    def _host_attention(self, q: Tensor, k: Tensor, v: Tensor, cached_kv: Any,
                        key_padding_mask: Tensor | None, attn_mask: Tensor | None,
                        train_size: int | None, rope: nn.Module | None, need_kv: bool
                        ) -> tuple[Tensor, tuple[Tensor, Tensor] | None]:
        """The vendor's pre-norm attention branch (and its K/V when asked)."""
        masks = dict(key_padding_mask=key_padding_mask, attn_mask=attn_mask, rope=rope)
        q_normed = self.norm1(q)
        if cached_kv is not None:
            return self.attn(q_normed, cached_kv=cached_kv, **masks), None
        k_normed = q_normed[..., :train_size, :] if train_size is not None else (
            q_normed if k is q else self.norm1(k))
        v_normed = k_normed if v is k else self.norm1(v)
        out = self.attn(q_normed, k_normed, v_normed, need_kv=need_kv, **masks)
        return (out[0], out[1:]) if need_kv else (out, None)

    def _o_attention(self, q: Tensor, k: Tensor, v: Tensor, cached_kv: Any,
                     train_size: int | None, rope: nn.Module | None, need_kv: bool,
                     config: SiteConfig) -> tuple[Tensor, tuple[Tensor, Tensor] | None]:
        """OAttention of receivers ``q (…, Sq, E)`` over sources ``k`` (values from ``v``), or
        over the cached ones."""
        a = self.attn
        heads, batch, n_q = a.num_heads, q.shape[:-2], q.shape[-2]
        w_q, w_k, w_v = a.in_proj_weight.chunk(3)
        b_q, b_k, b_v = a.in_proj_bias.chunk(3) if a.in_proj_bias is not None else (None,) * 3
        p_q = presence(q, config.tau)                                        # (..., Sq)
        q_normed = self.norm1(q)
        qh = _rotated(rope, _heads(F.linear(q_normed, w_q, b_q), heads))     # (..., H, Sq, D)
        if cached_kv is not None:
            kh, vh, p_k = cached_presence_kv(cached_kv, a.head_dim)
        else:
            k_normed = q_normed[..., :train_size, :] if train_size is not None else (
                q_normed if k is q else self.norm1(k))
            kh = _rotated(rope, _heads(F.linear(k_normed, w_k, b_k), heads))
            v_normed = k_normed if v is k else self.norm1(v)
            vh = _heads(F.linear(v_normed, w_v, b_v), heads)
            p_k = presence(k, config.tau)                                    # (..., Sk)
        if a.ssmax_layer is not None:
            qh = mass_scaled(a.ssmax_layer, qh, p_k.sum(-1))
        n_k = kh.shape[-2]
        out, _ = o_attention(qh.reshape(-1, heads, n_q, a.head_dim),
                             kh.reshape(-1, heads, n_k, a.head_dim),
                             vh.reshape(-1, heads, n_k, a.head_dim),
                             p_q.reshape(-1, n_q), p_k.reshape(-1, n_k), eps=config.eps,
                             dropout_p=a.dropout if self.training else 0.0)   # (B', H, Sq, D)
        out = out.view(*batch, heads, n_q, a.head_dim).transpose(-3, -2).flatten(-2)
        out = gated_linear(a.out_proj, out, p_q)                             # (..., Sq, E)
        if not need_kv or cached_kv is not None:
            return out, None
        channel = p_k.to(kh.dtype)[..., None, :, None].expand(*p_k.shape[:-1], heads, n_k, 1)
        return out, (torch.cat([kh, channel], -1), vh)


def _rotated(rope: nn.Module | None, t: Tensor) -> Tensor:
    return t if rope is None else rope.rotate_queries_or_keys(t)


class _OTargets:
    """A model stage that adds ``y_encoder(y)`` to the train rows' tokens: its methods run
    with the gate ``e -> ρτ(h) · e`` left for :func:`target_hook`, ``h`` the carrier that
    ``carrier(bound arguments)`` gives (evaluated when ``y_encoder`` runs, before the vendor
    adds its output in place)."""

    target_site: str

    def _targets_gated(self, vendor: Callable[..., Any], carrier: Callable[[dict], Tensor],
                       args: tuple, kwargs: dict) -> Any:
        config = site_config(self, self.target_site)
        if config is None:
            return vendor(*args, **kwargs)
        given = inspect.signature(vendor).bind(*args, **kwargs).arguments

        def gate(e: Tensor) -> Tensor:                                       # (..., n, E)
            return o_gate(presence(carrier(given)[..., :e.shape[-2], :], config.tau), e)

        key = id(self.y_encoder)
        _GATES.gates[key] = gate
        try:
            return vendor(*args, **kwargs)
        finally:
            _GATES.gates.pop(key, None)


class OColEmbedding(_OTargets):
    """``ColEmbedding`` (``te.col``): the carrier is the cell token ``in_linear(x)``."""

    target_site = "te.col"

    def _cells(self, given: dict) -> Tensor:
        return self.in_linear(given["features"])

    def _compute_embeddings(self, *args: Any, **kwargs: Any) -> Tensor:
        return self._targets_gated(super()._compute_embeddings, self._cells, args, kwargs)

    def _compute_embeddings_with_cache(self, *args: Any, **kwargs: Any) -> Tensor:
        return self._targets_gated(super()._compute_embeddings_with_cache, self._cells, args,
                                   kwargs)


class OICLearning(_OTargets):
    """``ICLearning`` (``te.icl``): the carrier is the row token ``R`` (the row transformer's
    CLS read-outs) of each train row."""

    target_site = "te.icl"

    @staticmethod
    def _rows(given: dict) -> Tensor:
        return given["R"]

    def _icl_predictions(self, *args: Any, **kwargs: Any) -> Tensor:
        return self._targets_gated(super()._icl_predictions, self._rows, args, kwargs)

    def _icl_predictions_with_cache(self, *args: Any, **kwargs: Any) -> Tensor:
        return self._targets_gated(super()._icl_predictions_with_cache, self._rows, args,
                                   kwargs)

    def prepare_repr_cache(self, *args: Any, **kwargs: Any) -> Tensor:
        return self._targets_gated(super().prepare_repr_cache, self._rows, args, kwargs)
