"""Direct fp64 evaluation of the OAttention formula, independent of both library paths.

    out_i = p_i Σ_j m_ij p_j e^{s_ij} v_j / (ε + Σ_j m_ij p_j e^{s_ij}),   s_ij = scale · q_i·k_j

No max subtraction, no augmented keys, no SDPA: the formula written out term by term, for inputs
small enough that e^{s} does not overflow in fp64. The operator sweep and the tests compare the
reference and fused paths against it.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

__all__ = ["direct_o_attention"]


def _per_head(p: Tensor, heads: int) -> Tensor:
    """(B, N) -> (B, 1, N); (B, Hkv, N) -> (B, H, N) by KV-head repeat; (B, H, N) unchanged."""
    if p.dim() == 2:
        return p[:, None, :]
    return p.repeat_interleave(heads // p.shape[1], dim=1)


def direct_o_attention(q: Tensor, k: Tensor, v: Tensor, p_q: Tensor, p_k: Tensor,
                       mask: Tensor | None = None, eps: float = 1e-6,
                       scale: float | None = None) -> tuple[Tensor, Tensor]:
    """fp64 ``(out (B, H, Nq, dv), weights (B, H, Nq, Nk))`` of eq. 7 / eq. 23.

    ``mask`` is bool (True = visible) or additive float (-inf = excluded), broadcastable to
    ``(B, H, Nq, Nk)``; the additive form enters as ``e^{s_ij + bias_ij}``.
    """
    q, k, v, p_q, p_k = (t.detach().to(torch.float64) for t in (q, k, v, p_q, p_k))
    heads, kv_heads = q.shape[1], k.shape[1]
    k = k.repeat_interleave(heads // kv_heads, dim=1)
    v = v.repeat_interleave(heads // kv_heads, dim=1)
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    scores = scale * torch.einsum("bhid,bhjd->bhij", q, k)                  # (B, H, Nq, Nk)
    u = _per_head(p_k, heads)[:, :, None, :] * torch.exp(scores)
    if mask is not None and mask.dtype == torch.bool:
        u = u * mask.to(torch.float64)
    elif mask is not None:
        u = u * torch.exp(mask.detach().to(torch.float64))
    weights = u / (eps + u.sum(dim=-1, keepdim=True))
    out = _per_head(p_q, heads)[..., None] * torch.einsum("bhij,bhjd->bhid", weights, v)
    return out, weights


def _heads(x: Tensor, n: int) -> Tensor:
    b, t, _ = x.shape
    return x.reshape(b, t, n, -1).transpose(1, 2)                           # (B, H, N, hd)


def direct_projected(module, x: Tensor, context: Tensor, tau: float,
                     mask: Tensor | None = None) -> tuple[Tensor, Tensor]:
    """fp64 ``(output (B, Nq, d), weights)`` of a Hidden-carrier or QKV OAttention module.

    Projections from the module's bias-free weights; presence from the hidden carriers
    (``HiddenCarrierOAttention``) or per head from q and k (``QKVOAttention``).
    """
    from .._operators.attention_modules import QKVOAttention

    weight = {name: w.detach().cpu().double() for name, w in module.state_dict().items()}
    x, context = x.detach().cpu().double(), context.detach().cpu().double()
    q = _heads(x @ weight["q_proj.weight"].T, module.n_heads)
    k = _heads(context @ weight["k_proj.weight"].T, module.n_kv_heads)
    v = _heads(context @ weight["v_proj.weight"].T, module.n_kv_heads)
    carriers = (q, k) if isinstance(module, QKVOAttention) else (x, context)
    p_q, p_k = (c.square().sum(-1) / (tau + c.square().sum(-1)) for c in carriers)
    mask = None if mask is None else mask.detach().cpu()
    out, weights = direct_o_attention(q, k, v, p_q, p_k, mask, eps=module.eps)
    b, h, n, hd = out.shape
    return out.transpose(1, 2).reshape(b, n, h * hd) @ weight["out_proj.weight"].T, weights
