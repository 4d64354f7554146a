"""OAttention, the support-coupled attention operator (paper eqs. 5–7, A.1 eq. 23).

    out_i = p_i · Σ_j m_ij p_j e^{s_ij} v_j / (ε + Σ_j m_ij p_j e^{s_ij}),   s_ij = scale · q_i·k_j

With soft-capping (Gemma2) the score is ``s_ij = c·tanh(scale · q_i·k_j / c)``; a finite additive
bias ``b_ij`` from a float mask (relative position biases, ALiBi) is added after the cap.
``p_i`` is the receiver presence, ``p_j`` the source presence, ``m_ij`` the visibility relation
and ``ε`` the denominator stabiliser that totalises empty support.

Two paths, one meaning: :func:`o_attention_reference` materialises the ``(Nq, Nk)`` scores and
can return weights; :func:`o_attention_fused` never builds an ``(Nq, Nk)`` tensor: one kernel
call with ``log p_j`` as a key bias returns ``o_i`` and ``L_i = log Z_i``, and
``out_i = p_i · σ(L_i − log ε) · o_i`` (:mod:`oretrofit._kernels`, whose ``routes`` chooses the
kernel). Attention-weight dropout, ``out_i = p_i · Σ_j δ_ij w_ij v_j``, keeps a null source, a
null receiver and empty support exact zeros. Which path and kernel serve which call, half
precision and dropout in full: docs/operators.md.
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import Tensor

from .._kernels import routes as route
from .._kernels.dtypes import compute_dtype
from .._kernels.lse import sink_logit
from .._kernels.routes import PRECISIONS
from .presence import EPS_MODULES, check_eps, check_positive

__all__ = ["o_attention", "o_attention_reference", "o_attention_fused", "o_weights", "PRECISIONS"]

class _Shapes(NamedTuple):
    batch: int
    heads: int
    kv_heads: int
    n_q: int
    n_k: int
    scale: float


def _check_inputs(q: Tensor, k: Tensor, v: Tensor, p_q: Tensor, p_k: Tensor,
                  mask: Tensor | None, eps: float, scale: float | None) -> _Shapes:
    """Validate shapes and dtypes; every error names the argument and the fix. (Every attention
    call of every layer runs it, a decode step's included: checks that pass cost few
    statements.)"""
    check_eps(eps)
    for name, t in (("q", q), ("k", k), ("v", v)):
        if not torch.is_tensor(t) or t.dim() != 4:
            raise ValueError(f"{name} must be a 4-D tensor (B, H, N, d); got "
                             f"{tuple(t.shape) if torch.is_tensor(t) else type(t).__name__}")
    b, h, n_q, d = q.shape
    bk, hkv, n_k, dk = k.shape
    if bk != b or v.shape[0] != b:
        raise ValueError(f"q, k and v must share the batch size; got q {tuple(q.shape)}, "
                         f"k {tuple(k.shape)}, v {tuple(v.shape)}")
    if dk != d:
        raise ValueError(f"k must have the same head size as q (d={d}); got k {tuple(k.shape)}")
    if v.shape[1] != hkv or v.shape[2] != n_k:
        raise ValueError(f"v must be (B, Hkv, Nk, dv) like k {tuple(k.shape)}; got v {tuple(v.shape)}")
    if hkv == 0 or h % hkv != 0:
        raise ValueError(f"the query heads H={h} must be a multiple of the key/value heads Hkv={hkv} "
                         "(grouped-query attention); repeat k/v heads or change the head counts")
    _check_presences("p_q", p_q, b, n_q, (h,))
    _check_presences("p_k", p_k, b, n_k, (h, hkv))
    if mask is not None:
        _check_mask(mask, (b, h, n_q, n_k))
    if scale is None:
        scale = 1.0 / math.sqrt(d) if d > 0 else 1.0
    return _Shapes(b, h, hkv, n_q, n_k, float(scale))


def _check_presences(name: str, p: Tensor, b: int, n: int, heads: tuple[int, ...]) -> None:
    """``p`` floating, ``(B, N)`` shared across heads or ``(B, H, N)`` per head, H in ``heads``."""
    if not torch.is_tensor(p):
        raise ValueError(f"{name} must be a tensor of presences, got {type(p).__name__}")
    shape = p.shape
    if not (shape == (b, n) or (len(shape) == 3 and shape[0] == b and shape[2] == n
                                and shape[1] in heads)):
        raise ValueError(f"{name} must be (B, N) = ({b}, {n}) shared across heads, or (B, H, N) "
                         f"per head with H = {' or '.join(map(str, heads))}; got {tuple(shape)}")
    if not p.is_floating_point():
        raise ValueError(f"{name} must be a floating tensor of presences in [0, 1]")


def _check_mask(mask: Tensor, full: tuple[int, int, int, int]) -> None:
    """``mask`` bool or floating, broadcasting to ``full`` = (B, H, Nq, Nk) itself."""
    if not torch.is_tensor(mask) or not (mask.dtype == torch.bool or mask.is_floating_point()):
        raise ValueError("mask must be a bool tensor (True = visible) or a float additive mask "
                         "(-inf = excluded)")
    if mask.dim() > 4:
        raise ValueError(f"mask must broadcast to (B, H, Nq, Nk) = {full}; "
                         f"got {tuple(mask.shape)}")
    if not _broadcasts_to(mask.shape, full):
        raise ValueError(f"mask of shape {tuple(mask.shape)} does not broadcast to "
                         f"(B, H, Nq, Nk) = {full}; use e.g. (B, 1, 1, Nk) for key "
                         "padding or (Nq, Nk) for a relation shared by all batches and heads")


def _broadcasts_to(shape: tuple[int, ...], target: tuple[int, ...]) -> bool:
    """Whether ``shape`` broadcasts to ``target`` itself (each axis, right-aligned, 1 or equal).
    Compared in Python: ``torch.broadcast_shapes`` costs tens of microseconds, and every
    attention call of every layer checks its mask."""
    return len(shape) <= len(target) and all(
        size in (1, full) for size, full in zip(reversed(shape), reversed(target)))


def _check_dropout(dropout_p: float) -> None:
    """``dropout_p`` must be a probability in [0, 1]; the error names it and the fix."""
    if isinstance(dropout_p, bool) or not isinstance(dropout_p, (int, float)) or not (
            0.0 <= dropout_p <= 1.0):
        raise ValueError(f"dropout_p must be a probability in [0, 1] (0 disables attention-weight "
                         f"dropout, e.g. in eval mode); got {dropout_p!r}")


def _per_query_head(p: Tensor, heads: int) -> Tensor:
    """(B, N) -> (B, 1, N); (B, Hkv, N) -> (B, H, N) following the KV-head repeat; (B, H, N) kept."""
    if p.dim() == 2:
        return p[:, None, :]
    if p.shape[1] != heads:
        return p.repeat_interleave(heads // p.shape[1], dim=1)
    return p


def _split_mask(mask: Tensor | None, dtype: torch.dtype) -> tuple[Tensor | None, Tensor | None]:
    """A mask as (visible bool, finite additive bias or None).

    A float mask holding only 0 and -inf (and not requiring grad) is a pure relation and
    becomes boolean, so the fused path keeps PyTorch's fast kernels; any other finite values are
    kept as an additive bias. Both come back with at least 4 dims (leading size-1 axes).
    """
    if mask is None:
        return None, None
    mask = mask.reshape((1,) * (4 - mask.dim()) + tuple(mask.shape))
    if mask.dtype == torch.bool:
        return mask, None
    visible = mask != float("-inf")
    finite = torch.where(visible, mask, torch.zeros((), dtype=mask.dtype, device=mask.device))
    if not mask.requires_grad and not bool(finite.any()):
        return visible, None
    return visible, finite.to(dtype)


def o_weights(scores: Tensor, p_k: Tensor, support: Tensor, eps: float) -> Tensor:
    """Eq. 6 over the last axis of ``scores`` ``(…, Nq, Nk)``:

        w_ij = m_ij p_j e^{s_ij} / (ε + Σ_t m_it p_t e^{s_it})

    ``p_k`` the source presences and ``support`` (bool, ``m_ij ∧ p_j ≠ 0``), both broadcastable
    to ``scores``; a score of -inf weighs 0 too. The row maximum M_i over the support is
    subtracted for stability and ε is carried as ε·e^{-M_i}, which equals eq. 6 exactly in real
    arithmetic; a row with no support (empty, or every score -inf) gives 0."""
    neg_inf = torch.full((), float("-inf"), dtype=scores.dtype, device=scores.device)
    masked = torch.where(support, scores, neg_inf)
    row_max = masked.amax(dim=-1, keepdim=True) if scores.shape[-1] > 0 else masked.new_zeros(
        masked.shape[:-1] + (1,))
    # a row with no support takes the sink's own score as its maximum: its sink term is 1, its
    # weights 0 (for ε = 0 too, whose sink weighs 0 against any live source)
    sink = sink_logit(eps)
    row_max = torch.where(torch.isfinite(row_max), row_max, sink).detach()
    u = torch.where(support, p_k * torch.exp(masked - row_max), torch.zeros_like(neg_inf))
    return u / (torch.exp(sink - row_max) + u.sum(dim=-1, keepdim=True))


def o_attention_reference(q: Tensor, k: Tensor, v: Tensor, p_q: Tensor, p_k: Tensor,
                          mask: Tensor | None = None, eps: float = EPS_MODULES,
                          scale: float | None = None, need_weights: bool = False,
                          softcap: float | None = None, dropout_p: float = 0.0
                          ) -> tuple[Tensor, Tensor | None]:
    """Materialised OAttention; see :func:`o_attention` for the arguments.

    The weights are :func:`o_weights` (eq. 6). With ``dropout_p > 0`` the weights applied to v (and
    returned) are ``F.dropout(w, dropout_p)``: δ_ij w_ij with δ_ij ∈ {0, 1/(1 − dropout_p)}.
    """
    shp = _check_inputs(q, k, v, p_q, p_k, mask, eps, scale)
    _check_dropout(dropout_p)
    out_dtype, ct = q.dtype, compute_dtype(q.dtype)
    group = shp.heads // shp.kv_heads
    kk = k.to(ct).repeat_interleave(group, dim=1) if group > 1 else k.to(ct)
    vv = v.to(ct).repeat_interleave(group, dim=1) if group > 1 else v.to(ct)
    scores = torch.matmul(q.to(ct), kk.transpose(-1, -2)) * shp.scale          # (B, H, Nq, Nk)
    if softcap is not None:
        scores = check_positive("softcap", softcap) * torch.tanh(scores / softcap)
    visible, bias = _split_mask(mask, ct)
    if bias is not None:
        scores = scores + bias
    pk = _per_query_head(p_k.to(ct), shp.heads)[:, :, None, :]                # (B, H|1, 1, Nk)
    support = pk != 0
    if visible is not None:
        support = support & visible
    weights = o_weights(scores, pk, support, eps)                             # (B, H, Nq, Nk)
    if dropout_p > 0.0:
        weights = F.dropout(weights, dropout_p)                               # δ_ij w_ij
    pq = _per_query_head(p_q.to(ct), shp.heads)[..., None]                    # (B, H|1, Nq, 1)
    out = pq * torch.matmul(weights, vv)                                      # (B, H, Nq, dv)
    return out.to(out_dtype), (weights.to(out_dtype) if need_weights else None)


def o_attention_fused(q: Tensor, k: Tensor, v: Tensor, p_q: Tensor, p_k: Tensor,
                      mask: Tensor | None = None, eps: float = EPS_MODULES,
                      scale: float | None = None) -> Tensor:
    """OAttention in O(N) memory, in the compute dtype (fp32; fp64 for fp64 inputs), on the
    route :func:`oretrofit._kernels.routes.route_for` gives it; see the module docstring.

    No ``(Nq, Nk)`` tensor is built unless the caller's own mask or finite additive bias has that
    shape (the kernel route then builds one float bias of the mask's shape, combined with the
    source presences). Grouped-query heads need no k/v copies (CPU).
    """
    shp = _check_inputs(q, k, v, p_q, p_k, mask, eps, scale)
    return _on_route(route.route_for(q, k, v, mask, precision="fp32"), q, k, v, p_q, p_k, mask,
                     eps, shp.scale, None, 0.0)


def _on_route(chosen: route.Route, q: Tensor, k: Tensor, v: Tensor, p_q: Tensor, p_k: Tensor,
              mask: Tensor | None, eps: float, scale: float, softcap: float | None,
              dropout_p: float, causal: bool = False) -> Tensor:
    """OAttention on ``chosen`` after the shared input checks, the mask split in the compute
    dtype; causality as the route's flag where it takes one, else built into the mask."""
    if causal and not chosen.causal:
        mask, causal = with_causality(mask, q.shape[2], k.shape[2], q.device), False
    visible, bias = _split_mask(mask, compute_dtype(q.dtype))
    return chosen(q, k, v, p_q, p_k, visible, bias, eps, scale, softcap, dropout_p, causal)


def with_causality(mask: Tensor | None, n_q: int, n_k: int, device: torch.device) -> Tensor:
    """``mask`` and the causal relation (key j visible to query i iff ``j ≤ i + Nk − Nq``) as one
    mask: the ``(Nq, Nk)`` lower triangle itself, AND-ed into a bool mask, or −inf above it in a
    float one."""
    lower = torch.ones(n_q, n_k, dtype=torch.bool, device=device).tril(n_k - n_q)
    if mask is None:
        return lower
    if mask.dtype == torch.bool:
        return mask & lower
    return mask.masked_fill(~lower, float("-inf"))


def o_attention(q: Tensor, k: Tensor, v: Tensor, p_q: Tensor, p_k: Tensor,
                mask: Tensor | None = None, eps: float = EPS_MODULES, scale: float | None = None,
                need_weights: bool = False, softcap: float | None = None, dropout_p: float = 0.0,
                precision: str = "auto", causal: bool = False) -> tuple[Tensor, Tensor | None]:
    """OAttention: ``out_i = p_i Σ_j m_ij p_j e^{s_ij} v_j / (ε + Σ_j m_ij p_j e^{s_ij})``.

    Args:
        q: queries ``(B, H, Nq, d)``.
        k, v: keys ``(B, Hkv, Nk, d)`` and values ``(B, Hkv, Nk, dv)``; GQA when Hkv divides H.
        p_q: receiver presences, ``(B, Nq)`` shared across heads (hidden-carrier boundary) or
            ``(B, H, Nq)`` per head (Q/K/V boundary, A.1).
        p_k: source presences, ``(B, Nk)`` or per head ``(B, H, Nk)`` / ``(B, Hkv, Nk)``.
        mask: bool (True = visible) or additive float (-inf = excluded), broadcastable to
            ``(B, H, Nq, Nk)``. Keep it compact (e.g. ``(B, 1, 1, Nk)``), not ``.expand()``ed.
        eps: ε ≥ 0, totalises empty support. ``0`` is the limit ε → 0⁺ (paper eq. 8), the
            default of a retrofit: a row with a live source is the plain presence-weighted
            softmax, with no sink competing with it; a row with none gives exact zeros.
        scale: score scale, default ``1/sqrt(d)``.
        need_weights: also return ``w_ij`` ``(B, H, Nq, Nk)``; selects the reference path.
        softcap: c > 0 caps the scores, ``s_ij = c·tanh(scale·q_i·k_j / c)`` (Gemma2's attention
            logit soft-capping), before a float mask's finite bias is added. On the Triton and
            FlexAttention routes (below) it is fused; elsewhere it selects the reference path
            (the cap is not linear in k, so no augmented SDPA call computes it).
        dropout_p: attention-weight dropout in [0, 1], applied whenever > 0 (as SDPA's
            ``dropout_p``; pass 0 in eval mode): ``out_i = p_i Σ_j δ_ij w_ij v_j`` with
            δ_ij ∈ {0, 1/(1 − dropout_p)}. On the Triton route δ comes from Philox on a seed
            drawn from torch's generator (``torch.manual_seed`` reproduces it); elsewhere
            ``F.dropout`` draws it on the ``(B, H, Nq, Nk)`` weights of the reference path, and
            ``need_weights`` then returns the dropped weights δ_ij w_ij.
        precision: ``"auto"`` (default): bf16/fp16 inputs on CUDA take the first kernel route
            that passes its check (:mod:`oretrofit._kernels.routes`: Triton, cuDNN,
            FlexAttention, memory-efficient; q, k, v in their dtype, softmax statistics in
            fp32), else they are computed in fp32; ``"fp32"``: half-precision inputs are always
            computed in fp32 (upcast copies).
        causal: key j is visible to query i only if ``j ≤ i + Nk − Nq`` (aligned to the last
            key, as a KV cache's new queries are; with Nq = Nk the lower triangle ``j ≤ i``), on
            top of ``mask``. The Triton route takes it as a flag and skips the tiles above the
            diagonal; every other path builds the ``(Nq, Nk)`` relation into the mask.

    Returns:
        ``(out (B, H, Nq, dv), weights or None)`` in the dtype of ``q``. Empty or fully masked
        support gives exact zeros (output and weights), on every route.
    """
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS} ('fp32' computes half-precision "
                         f"inputs in fp32); got {precision!r}")
    _check_dropout(dropout_p)
    shp = _check_inputs(q, k, v, p_q, p_k, mask, eps, scale)
    chosen = route.route_for(q, k, v, mask, softcap is not None, dropout_p > 0.0, need_weights,
                             precision)
    if chosen is None:
        if causal:
            mask = with_causality(mask, shp.n_q, shp.n_k, q.device)
        return o_attention_reference(q, k, v, p_q, p_k, mask, eps, scale, need_weights, softcap,
                                     dropout_p)
    if softcap is not None:
        softcap = check_positive("softcap", softcap)
    return _on_route(chosen, q, k, v, p_q, p_k, mask, eps, shp.scale, softcap, dropout_p,
                     causal), None
