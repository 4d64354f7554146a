"""OAttention on FlexAttention: the key bias in a ``score_mod``, the sink gate from its LSE.

One compiled ``flex_attention`` call with

    score_mod(s, b, h, i, j) = s′ + log p_j + b_ij   (``_NULL_LOGIT`` where p_j = 0 or m_ij false),

``s′ = c·tanh(s / c)`` under a softcap ``c`` (``s`` the scaled score), returns ``o`` and ``L``
(``return_aux=AuxRequest(lse=True)``), and OAttention is ``out_i = p_i σ(L_i − log ε) o_i`` with
:func:`oretrofit._kernels.lse.sink_gate`, the composition every kernel route shares. Its
backward is autograd's: FlexAttention differentiates its output and its LSE and the tensors its
``score_mod`` captures, so ``∂/∂p_j`` arrives through ``log p_j`` (computed by
:func:`oretrofit._kernels.lse.source_logit`, finite at null sources). q, k and v stay in
their dtype; scores and LSE are fp32 inside FlexAttention. GQA is FlexAttention's own
(``enable_gqa``), no repeats; masks and biases are indexed in the ``score_mod`` through their
broadcast axes, so a ``(B, 1, 1, Nk)`` mask stays that size.

Where this torch's FlexAttention lacks a gradient (its CPU build has no backward and, compiled,
no LSE) or anything else differs, the route's check fails and the next route serves.
"""

from __future__ import annotations

from functools import cache
from typing import Callable

import torch
from torch import Tensor

from .lse import _NULL_LOGIT, sink_gate, source_logit

__all__ = ["o_attention_flex", "compiled_flex"]

Attend = Callable[..., tuple[Tensor, object]]


@cache
def compiled_flex() -> Attend | None:
    """``torch.compile(flex_attention)`` (FlexAttention is only fast compiled), or None where this
    torch has no FlexAttention with ``AuxRequest``."""
    try:
        from torch.nn.attention.flex_attention import AuxRequest, flex_attention
    except ImportError:
        return None
    compiled = torch.compile(flex_attention, dynamic=False)

    def attend(q: Tensor, k: Tensor, v: Tensor, score_mod: Callable, scale: float,
               enable_gqa: bool) -> tuple[Tensor, Tensor]:
        out, aux = compiled(q, k, v, score_mod=score_mod, scale=scale, enable_gqa=enable_gqa,
                            return_aux=AuxRequest(lse=True))
        return out, aux.lse

    return attend


def _index(t: Tensor, b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
    """``t[b, h, i, j]`` of a 4-D tensor broadcast to ``(B, H, Nq, Nk)``: index 0 on its size-1
    axes, so nothing is expanded."""
    return t[tuple(x if n > 1 else 0 for x, n in zip((b, h, i, j), t.shape))]


def score_mod_for(logit: Tensor, visible: Tensor | None, bias: Tensor | None,
                  softcap: float | None) -> Callable:
    """The ``score_mod`` of the module docstring; ``logit`` ``(B, 1|H, Nk)`` (``log p_j``),
    ``visible``/``bias`` 4-D, broadcastable to ``(B, H, Nq, Nk)``."""
    shared = logit.shape[1] == 1

    def score_mod(s: Tensor, b: Tensor, h: Tensor, i: Tensor, j: Tensor) -> Tensor:
        if softcap is not None:
            s = softcap * torch.tanh(s / softcap)
        t = s + logit[b, 0 if shared else h, j]
        if bias is not None:
            t = t + _index(bias, b, h, i, j)
        if visible is not None:
            t = torch.where(_index(visible, b, h, i, j), t, _NULL_LOGIT)
        return t

    return score_mod


def o_attention_flex(q: Tensor, k: Tensor, v: Tensor, p_q: Tensor, p_k: Tensor,
                     visible: Tensor | None, bias: Tensor | None, eps: float, scale: float,
                     softcap: float | None = None, attend: Attend | None = None) -> Tensor:
    """OAttention ``(B, H, Nq, d)`` in q's dtype on FlexAttention (module docstring); arguments
    as :func:`oretrofit._kernels.triton.o_attention_triton` takes them. ``attend(q, k, v,
    score_mod, scale, enable_gqa) -> (o, lse)`` defaults to :func:`compiled_flex` (the tests pass
    a stand-in)."""
    attend = attend or compiled_flex()
    heads, stat = q.shape[1], torch.promote_types(q.dtype, torch.float32)
    logit = source_logit(p_k.to(stat), stat)                                # (B, 1|Hk, Nk)
    if logit.shape[1] not in (1, heads):
        logit = logit.repeat_interleave(heads // logit.shape[1], dim=1)    # per-KV-head presences
    o, lse = attend(q, k, v, score_mod_for(logit, visible, bias, softcap), scale,
                    k.shape[1] != heads)
    pq = (p_q[:, None] if p_q.dim() == 2 else p_q).to(stat)                 # (B, 1|H, Nq)
    return (o * (pq * sink_gate(lse, eps))[..., None]).to(q.dtype)
