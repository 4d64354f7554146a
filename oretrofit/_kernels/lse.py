"""Copy-free fused OAttention on an SDPA kernel that returns the log-sum-exp.

With ``t_ij = scale·q_i·k_j + b_ij`` and the source presence as an additive score bias
``b_ij = log p_j`` (plus the caller's finite bias; ``_NULL_LOGIT`` where ``p_j = 0`` or ``m_ij`` is
false), one kernel call returns

    o_i = Σ_j e^{t_ij − L_i} v_j,      L_i = log Z_i = log Σ_j e^{t_ij},

and OAttention is ``out_i = p_i · Z_i / (ε + Z_i) · o_i = p_i · σ(L_i − log ε) · o_i``, written in
place over ``o``: no augmented copy of q, k or v. Empty support (all sources null or masked)
gives ``L_i ≈ −10³⁰``, ``σ = 0`` and an exact zero; ``_NULL_LOGIT`` is finite so that no kernel's
convention for fully masked rows matters.

Backward (:class:`_LSEOAttention`), with ``o′_i = σ_i o_i = out_i / p_i``: the same kernel's
backward, given ``out = o′`` and ``lse″_i = log(ε + Z_i) − log p_i``, recomputes
``P_ij = e^{t_ij − lse″_i} = p_i e^{t_ij} / (ε + Z_i)``, ``D_i = dO_i·o′_i`` and
``dS_ij = P_ij (dO_i·v_j − D_i)``, the exact gradient of ``out`` with respect to ``t_ij`` (the
ε-sink has value 0, so it adds nothing to ``D``); it returns ``dq = scale·dS k``,
``dk = scale·dSᵀ q``, ``dv = Pᵀ dO``. Besides, ``∂/∂p_i = dO_i·o′_i`` and
``∂/∂p_j = Σ_i dS_ij / p_j``. The kernel does not return the column sums of ``dS``; they come from
an augmented backward ``q′ = [q, c]``, ``k′ = [k, 0]`` (``c`` the power of two nearest ``1/scale``) (``v``, ``dO``, ``o′`` padded with 0):
its ``dk′`` has ``scale·c·Σ_i dS_ij`` in the extra column. That call is tiled over queries and keys
(:data:`BACKWARD_TILE`), so its copies are tile-sized; when ``p_k`` needs no gradient nothing is
augmented. Null receivers (``p_i = 0``) get ``lse″ = +10³⁰`` (no gradient reaches q, k, v through
them) and their ``o′_i``, which ``out_i = 0`` no longer holds, is kept from the forward for
``∂/∂p_i`` (only when ``p_q`` requires grad). A null source's presence gradient is 0 (as on the
reference path, whose support excludes it).

Kernels (:class:`Backend`; each must satisfy :func:`_math_forward` / :func:`_math_backward`):

* CPU: ``aten::_scaled_dot_product_flash_attention_for_cpu`` and its ``_backward`` (fp32, fp64;
  GQA natively; q, k and v must share the head size). Tested on torch 2.13.0 and 2.14.1
  (the torch compat receipt, ``scripts/torch_compat.py``).
* CUDA: ``aten::_scaled_dot_product_efficient_attention`` and its ``_backward`` (the
  memory-efficient kernel, the one with a bias and the LSE; fp32 here, head sizes in multiples
  of 8; its LSE is padded to multiples of 32 rows, its bias must be 4-D with 16-aligned strides,
  and GQA is repeated). Not run in this repository's tests (no GPU): its adaptation is tested
  on CPU against an emulation of the ops' contract, and ``scripts/gpu_attention.py`` checks it
  on a GPU.

A kernel is used only after :mod:`.routes` has checked, once per device type and dtype, that its
ops exist and satisfy the contract on a tiny case (:func:`check_backend`: the private ops may
change between torch versions); otherwise OAttention takes the augmented-copy route.

Half precision on CUDA (:mod:`oretrofit._kernels.routes`, a chain of checked routes): the
fused Triton kernels compute the whole operator in q's dtype; cuDNN attention
(:mod:`oretrofit._kernels.cudnn`) and the memory-efficient kernel in q's dtype are backends of
:func:`o_attention_lse` (one backward call, not tiles: :attr:`Backend.tiled`; presence statistics
in fp32); FlexAttention composes :func:`sink_gate` under autograd. Where none passes its check,
OAttention computes in fp32 as above.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor

from .dtypes import number_like

# Score bias of a null or masked source: finite, so a row with no live source stays finite
# (L ≈ −1e30, σ(L − log ε) = 0 exactly) whatever a kernel does with fully masked rows, and far
# enough below any real score that e^{t − max} is exactly 0.
_NULL_LOGIT = -1e30
# The ε sink's score for ε = 0 (the limit ε → 0⁺): half fp16's null logit (−32752: a quarter of
# its lowest finite value, as null_logit derives it), so it lies
# below every live row's L_i = log Σ_j p_j e^{s_ij} (e^{−16376 − L} is exactly 0 even in fp64)
# and above every null source's score on every route, in every dtype: a row with no live source
# gives all its mass to the sink (value 0) and the gate σ(L − log ε) is exactly 0 or 1.
_LIMIT_SINK_LOGIT = torch.finfo(torch.float16).min / 4          # −16376
# lse″ of a null receiver in the backward: every P_ij = e^{t − lse″} is exactly 0.
_NULL_LSE = 1e30
# Query rows and key columns of one backward call (see the docstring). 768 query rows is the
# least on which the CPU kernel uses its large (256-row) query blocks; a tile's augmented copies
# and kernel outputs (4 query-side, 4 key-side tensors) then hold about one operand's worth at
# N = 4096. Chosen over (512, 512) and other shapes by benchmarks/bench_attention.py's cells.
BACKWARD_TILE = (768, 384)

Forward = Callable[[Tensor, Tensor, Tensor, Tensor, float], tuple[Tensor, Tensor]]
Backward = Callable[[Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, Tensor, float],
                    tuple[Tensor, Tensor, Tensor]]


@dataclass(frozen=True)
class Backend:
    """One kernel pair. ``forward(q, k, v, bias, scale) -> (o, lse)`` and
    ``backward(dO, q, k, v, bias, out, lse, scale) -> (dq, dk, dv)`` as :func:`_math_forward`
    and :func:`_math_backward`; q ``(B, H, Nq, d)``, k/v ``(B, Hkv, Nk, d)`` with Hkv | H, bias
    4-D broadcastable to ``(B, H, Nq, Nk)``. ``head_multiple``: the head sizes it takes;
    ``width_multiple``: head size granularity of the augmented backward call."""

    name: str
    forward: Forward
    backward: Backward
    head_multiple: int = 1
    width_multiple: int = 1
    # Backward by tiles of BACKWARD_TILE (bounded augmented copies on a CPU); False: one call,
    # since on a GPU a tile's launch costs more than its work.
    tiled: bool = True


def _math_forward(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, scale: float
                  ) -> tuple[Tensor, Tensor]:
    """``o_i = Σ_j e^{t_ij − L_i} v_j``, ``L_i = logsumexp_j t_ij``, ``t = scale·q kᵀ + bias``
    (materialised: the contract the kernels are checked against)."""
    kk, vv = _repeat_kv(k, q.shape[1]), _repeat_kv(v, q.shape[1])
    t = scale * q @ kk.transpose(-1, -2) + bias
    lse = torch.logsumexp(t, dim=-1)
    return torch.exp(t - lse[..., None]) @ vv, lse


def _math_backward(d_out: Tensor, q: Tensor, k: Tensor, v: Tensor, bias: Tensor, out: Tensor,
                   lse: Tensor, scale: float) -> tuple[Tensor, Tensor, Tensor]:
    """``P = e^{t − lse}``, ``dS = P ⊙ (dO vᵀ − D)``, ``D_i = dO_i·out_i``;
    ``dq = scale·dS k``, ``dk = scale·dSᵀ q``, ``dv = Pᵀ dO`` (k/v gradients summed per KV head)."""
    heads, kv_heads = q.shape[1], k.shape[1]
    kk, vv = _repeat_kv(k, heads), _repeat_kv(v, heads)
    p = torch.exp(scale * q @ kk.transpose(-1, -2) + bias - lse[..., None])
    ds = p * (d_out @ vv.transpose(-1, -2) - (d_out * out).sum(-1, keepdim=True))
    dk, dv = scale * ds.transpose(-1, -2) @ q, p.transpose(-1, -2) @ d_out
    return scale * ds @ kk, _sum_groups(dk, kv_heads), _sum_groups(dv, kv_heads)


def _repeat_kv(t: Tensor, heads: int) -> Tensor:
    """(B, Hkv, N, w) -> (B, H, N, w): each KV head repeated for its group of query heads."""
    return t if t.shape[1] == heads else t.repeat_interleave(heads // t.shape[1], dim=1)


def _sum_groups(t: Tensor, kv_heads: int) -> Tensor:
    """(B, H, N, w) -> (B, Hkv, N, w): the sum over each KV head's group of query heads."""
    return t if t.shape[1] == kv_heads else t.unflatten(1, (kv_heads, -1)).sum(2)


def _cpu_backend() -> Backend | None:
    """The CPU flash kernel pair (``o, L`` forward; ``dq, dk, dv`` backward as
    :func:`_math_backward`), or None where this torch lacks the ops."""
    aten = torch.ops.aten
    if not (hasattr(aten, "_scaled_dot_product_flash_attention_for_cpu")
            and hasattr(aten, "_scaled_dot_product_flash_attention_for_cpu_backward")):
        return None
    forward_op = aten._scaled_dot_product_flash_attention_for_cpu
    backward_op = aten._scaled_dot_product_flash_attention_for_cpu_backward

    def forward(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, scale: float
                ) -> tuple[Tensor, Tensor]:
        return forward_op(q, k, v, attn_mask=bias, scale=scale)

    def backward(d_out: Tensor, q: Tensor, k: Tensor, v: Tensor, bias: Tensor, out: Tensor,
                 lse: Tensor, scale: float) -> tuple[Tensor, Tensor, Tensor]:
        return backward_op(d_out, q, k, v, out, lse, 0.0, False, attn_mask=bias, scale=scale)

    return Backend("cpu-flash", forward, backward)


def _efficient_bias(bias: Tensor, shape: tuple[int, ...]) -> Tensor:
    """The bias as the memory-efficient kernel takes it: 4-D ``shape``, last dim contiguous and
    every other stride a multiple of 16 (padded storage, as SDPA's own ``pad_bias``)."""
    n = bias.shape[-1]
    if n % 16 or not bias.is_contiguous():
        padded = bias.new_zeros(*bias.shape[:-1], -(-n // 16) * 16)
        padded[..., :n] = bias
        bias = padded[..., :n]
    return bias.expand(shape)


def efficient_backend(forward_op: Callable, backward_op: Callable, tiled: bool = True
                      ) -> Backend:
    """A :class:`Backend` on the memory-efficient kernel's ops (``forward_op`` as
    ``aten::_scaled_dot_product_efficient_attention``, ``backward_op`` as its ``_backward``):
    LSE padded to multiples of 32 rows, bias expanded with aligned strides, GQA by repeating
    k/v (the kernel wants equal head counts). Taking the ops as arguments lets the tests check
    this adaptation on CPU against an emulation of the ops' contract. ``tiled``: as
    :attr:`Backend.tiled` (the fp32 route keeps its tiles; the half-precision route, one call)."""

    def forward(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, scale: float
                ) -> tuple[Tensor, Tensor]:
        heads = q.shape[1]
        shape = (q.shape[0], heads, q.shape[2], k.shape[2])
        o, lse, _, _ = forward_op(q, _repeat_kv(k, heads), _repeat_kv(v, heads),
                                  _efficient_bias(bias, shape), True, 0.0, False, scale=scale)
        return o, lse[..., : q.shape[2]]

    def backward(d_out: Tensor, q: Tensor, k: Tensor, v: Tensor, bias: Tensor, out: Tensor,
                 lse: Tensor, scale: float) -> tuple[Tensor, Tensor, Tensor]:
        (b, heads, n_q, _), kv_heads = q.shape, k.shape[1]
        lse_padded = lse.new_zeros(b, heads, -(-n_q // 32) * 32)
        lse_padded[..., :n_q] = lse
        shape = (b, heads, n_q, k.shape[2])
        seed = torch.empty((), dtype=torch.long)        # unused without dropout
        dq, dk, dv, _ = backward_op(d_out.contiguous(), q, _repeat_kv(k, heads),
                                    _repeat_kv(v, heads), _efficient_bias(bias, shape), out,
                                    lse_padded, seed, seed, 0.0, [True, True, True, False],
                                    False, scale=scale)
        return dq, _sum_groups(dk, kv_heads), _sum_groups(dv, kv_heads)

    return Backend("cuda-efficient", forward, backward, head_multiple=8, width_multiple=16,
                   tiled=tiled)


def _cuda_backend(tiled: bool = True) -> Backend | None:
    """:func:`efficient_backend` on this torch's CUDA ops, or None where it lacks them."""
    aten = torch.ops.aten
    if not (hasattr(aten, "_scaled_dot_product_efficient_attention")
            and hasattr(aten, "_scaled_dot_product_efficient_attention_backward")):
        return None
    return efficient_backend(aten._scaled_dot_product_efficient_attention,
                             aten._scaled_dot_product_efficient_attention_backward, tiled)


def check_backend(backend: Backend, device: torch.device, dtype: torch.dtype) -> str:
    """'' when ``backend`` meets :func:`_math_forward` / :func:`_math_backward` on a tiny GQA
    case with null and fully null rows and a broadcast bias, at the plain and the augmented head
    size; else what failed."""
    g = torch.Generator().manual_seed(0)
    tol = 1e-4 if dtype == torch.float32 else 1e-9
    try:
        with torch.no_grad():
            for d in (backend.width_multiple * 4, backend.width_multiple * 5):
                q, k, v = (torch.randn(2, 2, n, d, generator=g, dtype=dtype).to(device)
                           for n in (3, 5, 5))
                k, v = k[:, :1], v[:, :1]                                   # GQA, Hkv = 1
                bias = torch.randn(2, 1, 1, 5, generator=g, dtype=dtype).to(device)
                bias[0, ..., 1] = bias[1] = _NULL_LOGIT     # a null source; no live one in batch 1
                o, lse = backend.forward(q, k, v, bias, 1 / math.sqrt(d))
                want_o, want_lse = _math_forward(q, k, v, bias, 1 / math.sqrt(d))
                if not (torch.allclose(o[0], want_o[0], atol=tol) and torch.isfinite(o).all()
                        and torch.allclose(lse[0], want_lse[0], atol=tol)
                        and bool((lse[1] < -1e29).all())):                  # o[1]: any finite
                    return f"forward differs at head size {d}"
                lse = lse.clone()
                lse[0, 0, 1] = _NULL_LSE                                    # a null receiver
                d_out = torch.randn(o.shape, generator=g, dtype=dtype).to(device)
                got = backend.backward(d_out, q, k, v, bias, o, lse, 1 / math.sqrt(d))
                want = _math_backward(d_out, q, k, v, bias, o, lse, 1 / math.sqrt(d))
                if not all(a.shape == b.shape and torch.allclose(a, b, atol=tol)
                           for a, b in zip(got, want)):
                    return f"backward differs at head size {d}"
    except (RuntimeError, TypeError, ValueError, NotImplementedError) as error:
        return f"{type(error).__name__}: {str(error).splitlines()[0][:200]}"
    return ""


def null_logit(dtype: torch.dtype) -> float:
    """``_NULL_LOGIT`` where ``dtype`` holds it (fp32, bf16, fp64), else half its lowest finite
    value (fp16: −32752, still far below any real score and log ε)."""
    return max(_NULL_LOGIT, torch.finfo(dtype).min / 2)


def score_bias(p_k: Tensor, heads: int, visible: Tensor | None, bias: Tensor | None,
               dtype: torch.dtype | None = None) -> Tensor:
    """``b_ij = log p_j (+ the caller's finite bias)``, ``_NULL_LOGIT`` where ``p_j = 0`` or
    ``m_ij`` is false: ``(B, 1|H, 1|Nq, Nk)``, computed in p_k's dtype and given in ``dtype``
    (default p_k's; the null value then :func:`null_logit` of it). (B, Nk) presences stay shared;
    per-head ones are given per query head (the kernel repeats KV heads for GQA, not the bias).
    NaN stays NaN. Not differentiable at null sources (see :func:`source_logit`)."""
    if p_k.dim() == 3 and p_k.shape[1] != heads:
        p_k = p_k.repeat_interleave(heads // p_k.shape[1], dim=1)
    # log 0 = -inf clamps to the null logit; NaN stays NaN (clamp keeps it): two ops per call
    logit = torch.log(p_k).clamp_min_(null_logit(p_k.dtype))
    heads_axis = logit.shape[1] if logit.dim() == 3 else 1
    logit = logit.view(logit.shape[0], heads_axis, 1, logit.shape[-1])     # (B, 1|H, 1, Nk)
    if bias is not None:
        logit = logit + bias
    if visible is not None:
        logit = torch.where(visible, logit, _NULL_LOGIT)
    if dtype is None or dtype == logit.dtype:
        return logit
    return logit.clamp_min(null_logit(dtype)).to(dtype)


def source_logit(p_k: Tensor, ct: torch.dtype) -> Tensor:
    """log p_j for live sources; a finite ``_NULL_LOGIT`` (e^{…} = 0 exactly) for null ones,
    differentiable: (B, N) -> (B, 1, N); (B, Hk, N) kept.

    Double where: the log of a null presence is never evaluated, so its gradient stays finite
    (0), and the constant keeps 0·k = 0 in the backward.
    """
    pk = p_k if p_k.dim() == 3 else p_k[:, None, :]
    live = pk != 0
    log_pk = torch.log(torch.where(live, pk, torch.ones_like(pk)))
    return torch.where(live, log_pk, torch.full((), _NULL_LOGIT, dtype=ct, device=pk.device))


def sink_logit(eps: float) -> float:
    """``log ε``, the ε sink's score on every path; for ``ε = 0`` (the limit ε → 0⁺) the finite
    :data:`_LIMIT_SINK_LOGIT`, which weighs exactly 0 against any live source and carries all the
    mass of a row whose sources are all null."""
    return math.log(eps) if eps > 0.0 else _LIMIT_SINK_LOGIT


def sink_gate(lse: Tensor, eps: float) -> Tensor:
    """``σ(L_i − log ε) = Z_i / (ε + Z_i)``: the weight the ε sink leaves to the sources.

    Every kernel route composes OAttention from a kernel's ``o, L`` as
    ``out_i = p_i σ(L_i − log ε) o_i`` with this gate: :func:`_forward` (whose backward is
    :class:`_LSEOAttention`'s) and the FlexAttention route (whose backward is autograd's)."""
    return torch.sigmoid(lse - number_like(sink_logit(eps), lse))


def o_attention_lse(q: Tensor, k: Tensor, v: Tensor, p_q: Tensor, p_k: Tensor,
                    visible: Tensor | None, bias: Tensor | None, eps: float, scale: float,
                    backend: Backend) -> Tensor:
    """OAttention ``(B, H, Nq, d)`` on ``backend`` (see module docstring); all inputs in the
    compute dtype, ``visible``/``bias`` as :func:`oretrofit._operators.attention._split_mask` gives them
    (neither requiring grad). Without grad (frozen hosts) nothing is saved."""
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v, p_q, p_k)):
        if p_k is p_q and torch.compiler.is_compiling():
            p_k = p_k.view_as(p_k)   # a compiler traces no Function given one tensor twice
        return _LSEOAttention.apply(q, k, v, p_q, p_k, visible, bias, eps, scale, backend)
    out, _, _, _ = _forward(q, k, v, p_q, p_k,
                            score_bias(p_k, q.shape[1], visible, bias, q.dtype), eps, scale,
                            backend, keep_null_rows=False)
    return out


def _forward(q: Tensor, k: Tensor, v: Tensor, p_q: Tensor, p_k: Tensor, bias: Tensor,
             eps: float, scale: float, backend: Backend, keep_null_rows: bool
             ) -> tuple[Tensor, Tensor, Tensor | None, Tensor | None]:
    """``(out, L, null_index, null_rows)``: ``out_i = p_i σ(L_i − log ε) o_i`` in place over the
    kernel's ``o``; with ``keep_null_rows``, the indices ``(B, 1|H, m)`` of the null receivers
    and their ``o′ = σ·o`` rows ``(B, H, m, d)``. Traced by a compiler, every receiver's row is
    kept (``m = Nq``, null ones first): ``m`` read from the presences would break the graph
    (and with it every frame around, each compiled on its own); a live receiver's kept
    ``dO·o′`` is the one the backward computes anyway."""
    o, lse = backend.forward(q, k, v, bias, scale)
    gate = sink_gate(lse, eps)                                              # (B, H, Nq)
    index = rows = None
    traced = torch.compiler.is_compiling()
    if keep_null_rows and (traced or bool((p_q == 0).any())):
        pq = p_q.unsqueeze(1) if p_q.dim() == 2 else p_q                    # (B, 1|H, Nq)
        o.mul_(gate[..., None])
        null = pq == 0
        m = null.shape[-1] if traced else int(null.sum(-1).max())
        index = torch.sort((~null).to(torch.uint8), dim=-1, stable=True).indices[..., :m]
        rows = o.gather(2, index[..., None].expand(o.shape[0], o.shape[1], m, o.shape[3]))
        gate = pq.expand_as(gate)
    else:
        # σ is this call's own tensor: gated in place, by (B, Nq) presences as (B, 1, Nq), or for
        # a batch of one as they are (one view op less: a decode step pays it in every layer)
        gate = gate.mul_(p_q.unsqueeze(1) if p_q.dim() == 2 and p_q.shape[0] != 1 else p_q)
    # methods, not indexing with None: a decode step pays these per layer
    return o.mul_(gate.unsqueeze(-1)), lse, index, rows


class _LSEOAttention(torch.autograd.Function):
    """Autograd of :func:`o_attention_lse` (formulas in the module docstring)."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, p_q: Tensor, p_k: Tensor,
                visible: Tensor | None, bias: Tensor | None, eps: float, scale: float,
                backend: Backend) -> Tensor:
        logit = score_bias(p_k, q.shape[1], visible, bias, q.dtype)
        out, lse, index, rows = _forward(q, k, v, p_q, p_k, logit, eps, scale, backend,
                                         keep_null_rows=ctx.needs_input_grad[3])
        ctx.save_for_backward(q, k, v, p_q, p_k, logit, out, lse, index, rows)
        ctx.eps, ctx.scale, ctx.backend = eps, scale, backend
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, d_out: Tensor) -> tuple[Tensor | None, ...]:
        q, k, v, p_q, p_k, logit, out, lse, index, rows = ctx.saved_tensors
        need_q, need_k, need_v, need_pq, need_pk = ctx.needs_input_grad[:5]
        pq = p_q[:, None] if p_q.dim() == 2 else p_q                        # (B, 1|H, Nq)
        live = pq != 0
        inv_pq = torch.where(live, 1 / pq, 0.0)
        lse2 = torch.where(live, torch.logaddexp(lse, torch.full_like(lse, sink_logit(ctx.eps)))
                           - torch.log(pq), _NULL_LSE)
        if need_q or need_k or need_v or need_pk:
            expand = p_k.dim() == 3 and p_k.shape[1] == q.shape[1] != k.shape[1]
            dq, dk, dv, colsum, rowdot = tiled_backward(
                ctx.backend, d_out, q, k, v, logit, out, inv_pq, lse2, ctx.scale,
                want_colsum=need_pk, want_rowdot=need_pq, expand_kv=expand)
        else:                                                # only p_q: no kernel call at all
            stat = _stat_dtype(q.dtype)
            rowdot = torch.linalg.vecdot(d_out.to(stat), out.to(stat)) * inv_pq   # dO·out / p_i
            dq = dk = dv = colsum = None
        d_pq = d_pk = None
        if need_pq:
            if index is not None:                                           # null receivers' o′
                picked = d_out.gather(2, index[..., None].expand(*rows.shape))
                rowdot.scatter_(2, index.expand(*rows.shape[:3]),
                                (picked * rows).sum(-1, dtype=rowdot.dtype))
            d_pq = rowdot.sum(1) if p_q.dim() == 2 else rowdot
        if need_pk:
            inv_pk = torch.where(p_k != 0, 1 / p_k, 0.0)
            d_pk = (colsum.sum(1) if p_k.dim() == 2 else colsum) * inv_pk
        return (dq if need_q else None, dk if need_k else None, dv if need_v else None,
                d_pq, d_pk, None, None, None, None, None)


def tiled_backward(backend: Backend, d_out: Tensor, q: Tensor, k: Tensor, v: Tensor,
                   bias: Tensor, out: Tensor, inv_pq: Tensor, lse2: Tensor, scale: float,
                   want_colsum: bool, want_rowdot: bool, expand_kv: bool,
                   ) -> tuple[Tensor, Tensor, Tensor, Tensor | None, Tensor | None]:
    """``(dq, dk, dv, colsum, rowdot)`` by query × key tiles of ``backend.backward``.

    ``o′ = out · inv_pq`` per query tile; ``rowdot_i = dO_i·o′_i`` ``(B, H, Nq)``; with
    ``want_colsum`` the calls are augmented and ``colsum_j = Σ_i dS_ij`` ``(B, Hk, Nk)``, Hk the
    KV heads, or the query heads with ``expand_kv`` (per-query-head source presences under GQA:
    k′/v′ tiles are built per query head and their gradients summed back per KV head). The
    augmented tiles live in buffers allocated once and refilled per tile. ``rowdot`` and
    ``colsum`` are in :func:`_stat_dtype` (fp32 for half-precision inputs).
    """
    (b, heads, n_q, d), (kv_heads, n_k) = q.shape, k.shape[1:3]
    tile_q, tile_k = BACKWARD_TILE if backend.tiled else (n_q, n_k)
    stat = _stat_dtype(q.dtype)
    width = -(-(d + 1) // backend.width_multiple) * backend.width_multiple if want_colsum else d
    k_heads = heads if expand_kv else kv_heads
    # tile starts by tile counts: a range to a traced length would fix the length in the graph
    q_tiles, k_tiles = (range(0, -(-n // tile) * tile, tile)
                        for n, tile in ((n_q, tile_q), (n_k, tile_k)))
    single = len(q_tiles) * len(k_tiles) == 1
    rowdot = q.new_empty(b, heads, n_q, dtype=stat) if want_rowdot else None
    colsum = q.new_zeros(b, k_heads, n_k, dtype=stat) if want_colsum else None
    if not single:
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    if want_colsum:
        q_buf, g_buf, o_buf = (_padded(q, min(tile_q, n_q), heads, width) for _ in range(3))
        k_buf, v_buf = (_padded(q, min(tile_k, n_k), k_heads, width) for _ in range(2))
        column = 2.0 ** round(-math.log2(scale))    # ≈ 1/scale, held exactly by every dtype
        q_buf[..., d] = column
    for i in q_tiles:
        rq = slice(i, i + tile_q)
        g_rows, o_rows, inv_rows = d_out[:, :, rq], out[:, :, rq], inv_pq[:, :, rq, None]
        if want_colsum:
            q_t, g_t = _fill(q_buf, q[:, :, rq]), _fill(g_buf, g_rows)
            o_t = o_buf[:, :, :o_rows.shape[2]]
            o_t[..., :d] = o_rows * inv_rows                                # o′ of the tile
        else:
            q_t, g_t, o_t = q[:, :, rq], _bnhd(g_rows), (o_rows * inv_rows).to(q.dtype)
        if want_rowdot:
            rowdot[:, :, rq] = torch.linalg.vecdot(g_rows.to(stat), o_t[..., :d].to(stat))
        for j in k_tiles:
            rk = slice(j, j + tile_k)
            k_t, v_t = k[:, :, rk], v[:, :, rk]
            if want_colsum:
                k_t, v_t = _fill(k_buf, k_t), _fill(v_buf, v_t)
            b_t = bias[:, :, rq if bias.shape[2] > 1 else slice(None), rk]
            gq, gk, gv = backend.backward(g_t, q_t, k_t, v_t, b_t, o_t, lse2[:, :, rq], scale)
            if want_colsum:
                colsum[:, :, rk].add_(gk[..., d], alpha=1 / (scale * column))
                gq, gk, gv = gq[..., :d], _sum_groups(gk[..., :d], kv_heads), \
                    _sum_groups(gv[..., :d], kv_heads)
            if single:
                return gq, gk, gv, colsum, rowdot
            _accumulate(dq[:, :, rq], gq, first=j == 0)
            _accumulate(dk[:, :, rk], gk, first=i == 0)
            _accumulate(dv[:, :, rk], gv, first=i == 0)
    return dq, dk, dv, colsum, rowdot


def _stat_dtype(dtype: torch.dtype) -> torch.dtype:
    """The dtype of the presence statistics (row dots, column sums): at least fp32."""
    return torch.promote_types(dtype, torch.float32)


def _accumulate(total: Tensor, part: Tensor, first: bool) -> None:
    """``total = part`` for the first tile of a sum, ``total += part`` after."""
    if first:
        total.copy_(part)
    else:
        total.add_(part)


def _padded(like: Tensor, rows: int, heads: int, width: int) -> Tensor:
    """A zero ``(B, heads, rows, width)`` buffer stored as (B, rows, heads, width) (see
    :func:`_bnhd`)."""
    return like.new_zeros(like.shape[0], rows, heads, width).transpose(1, 2)


def _fill(buffer: Tensor, t: Tensor) -> Tensor:
    """``t`` written into the first columns and rows of ``buffer`` (its other columns kept):
    ``[t, buffer's extra columns]``, t's heads repeated to the buffer's (each KV head for its
    group of query heads)."""
    b, h, n, d = t.shape
    wide = buffer[:, :, :n]
    wide.view(b, h, -1, *wide.shape[2:])[..., :d] = t[:, :, None]     # heads (h, group)
    return wide


def _bnhd(t: Tensor) -> Tensor:
    """``t`` (B, H, N, w) stored as (B, N, H, w), the layout the kernels read their output
    gradient in (the CPU kernel copies any other); a copy only when it is not so already."""
    if t.transpose(1, 2).is_contiguous():
        return t
    return t.transpose(1, 2).contiguous().transpose(1, 2)
