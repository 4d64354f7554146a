"""OAttention on one ``scaled_dot_product_attention`` call over augmented copies: the route for
any device, dtype and shape (:mod:`.routes`' fallback for a call without softcap or dropout).

With queries ``q' = [q, 1]`` and keys ``k'_j = [k_j, log p_j / scale]``, ``scale·q'·k'_j =
s_ij + log p_j``: no float mask is needed, so PyTorch keeps its flash/efficient kernels. A null
source gets the finite offset ``_NULL_LOGIT`` instead of ``log 0``, so its weight is exactly 0
without any mask; the caller's mask (if any) stays boolean. ε is one extra *sink* key with score
exactly ``log ε`` (``sink_logit``: finite for ε = 0, the limit ε → 0⁺) and value 0. SDPA then
returns ``Σ_j p_j e^{s_ij} v_j / (ε + Σ_j p_j e^{s_ij})`` and the result is multiplied by
``p_i``. Empty support puts all mass on the sink: an exact 0. Gradients are autograd's through
SDPA.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor

from .lse import sink_logit, source_logit

__all__ = ["o_attention_sdpa"]


def o_attention_sdpa(q: Tensor, k: Tensor, v: Tensor, p_q: Tensor, p_k: Tensor,
                     visible: Tensor | None, bias: Tensor | None, eps: float, scale: float,
                     softcap: float | None = None, dropout_p: float = 0.0) -> Tensor:
    """OAttention ``(B, H, Nq, dv)`` from one SDPA call on ``[q, 1]``, ``[k, log p / scale]``
    and an ε sink (module docstring); GQA by ``enable_gqa``. All inputs in the compute dtype,
    ``visible``/``bias`` as the operator splits a mask; no softcap or dropout (the route serves
    calls without)."""
    h, kv_heads, n_k = q.shape[1], k.shape[1], k.shape[2]
    if p_k.dim() == 3 and p_k.shape[1] != kv_heads:
        # Per-query-head source presence under GQA: the key column differs per query head.
        group = h // kv_heads
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    agg = _sdpa_with_sink(q, k, v, p_k, _sdpa_mask(visible, bias, n_k, q.dtype), eps, scale)
    pq = (p_q[:, None] if p_q.dim() == 2 else p_q)[..., None]                # (B, H|1, Nq, 1)
    return pq * agg                                                          # (B, H, Nq, dv)


def _sdpa_with_sink(q: Tensor, k: Tensor, v: Tensor, p_k: Tensor, attn_mask: Tensor | None,
                    eps: float, scale: float) -> Tensor:
    """``Σ_j p_j e^{s_ij} v_j / (ε + Σ_j p_j e^{s_ij})`` ``(B, H, Nq, dv)`` from one SDPA call.

    Augmented keys ``[k, log p_j / scale, 0…]`` and the sink ``[0…, log ε / scale, 0…]`` with
    value 0; queries ``[q, 1, 0…]``. The augmented copies live only inside this function.
    """
    (b, h, n_q, d), (hk, n_k), dv = q.shape, k.shape[1:3], v.shape[-1]
    width = max(d, dv) + 1                  # one shared head size keeps SDPA off its math kernel
    if q.device.type == "cuda":
        width = -(-width // 8) * 8          # flash/efficient kernels want head sizes in multiples of 8
    k_aug = k.new_zeros(b, hk, n_k + 1, width)                               # (B, Hk, Nk+1, w)
    k_aug[:, :, :n_k, :d] = k
    k_aug[:, :, :n_k, d] = source_logit(p_k, q.dtype) / scale                # (B, Hk|1, Nk)
    k_aug[:, :, n_k, d] = sink_logit(eps) / scale
    v_aug = v.new_zeros(b, hk, n_k + 1, width)                               # sink value is 0
    v_aug[:, :, :n_k, :dv] = v
    q_aug = q.new_zeros(b, h, n_q, width)                                    # (B, H, Nq, w)
    q_aug[..., :d] = q
    q_aug[..., d] = 1.0
    return F.scaled_dot_product_attention(q_aug, k_aug, v_aug, attn_mask=attn_mask, scale=scale,
                                          enable_gqa=hk != h)[..., :dv]


def _sdpa_mask(visible: Tensor | None, bias: Tensor | None, n_k: int, ct: torch.dtype
               ) -> Tensor | None:
    """The caller's mask (``visible`` and its finite ``bias``) extended by an always-visible
    sink column, or None without a mask."""
    if visible is None:
        return None
    sink = torch.ones(visible.shape[:-1] + (1,), dtype=torch.bool, device=visible.device)
    visible = torch.cat([visible.expand(*visible.shape[:-1], n_k), sink], dim=-1)   # (…, Nk + 1)
    if bias is None:
        return visible
    bias = bias.expand(*bias.shape[:-1], n_k)
    bias = torch.cat([bias, bias.new_zeros(bias.shape[:-1] + (1,))], dim=-1)
    return torch.where(visible, bias, torch.full((), float("-inf"), dtype=ct, device=bias.device))
