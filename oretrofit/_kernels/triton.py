"""OAttention as one fused Triton kernel pair: the half-precision CUDA route.

The launcher and autograd of the kernels in :mod:`oretrofit._kernels.triton_kernels` (whose
docstring gives the forward and backward formulas): one call's tensors, strides and flags
(:class:`_Launch`), the presence gradients reduced to the callers' shapes, and
:func:`o_attention_triton`, the route's entry point.
"""

from __future__ import annotations

import torch
import triton
from torch import Tensor

from .lse import _NULL_LOGIT, sink_logit
from .triton_kernels import (_INTERPRET, GRID_Y_LIMIT, INT32_LIMIT, LOG2E, KernelConfig,
                             _backward_dkdv_kernel, _backward_dq_kernel, _dropout_kernel,
                             _forward_kernel, configs_for, padded_head_dim)

__all__ = ["o_attention_triton", "dropout_keep"]

def _dense(t: Tensor) -> Tensor:
    """``t`` if its storage is dense in (B, H, N, d) or (B, N, H, d) order (``empty_like`` then
    keeps its strides), else a contiguous copy."""
    return t if t.is_contiguous() or t.transpose(1, 2).is_contiguous() else t.contiguous()


def _strides4(t: Tensor | None, shape: tuple[int, int, int, int]) -> tuple[int, ...]:
    """Element strides of ``t`` broadcast to ``shape`` (0 on broadcast axes); zeros for None."""
    return (0, 0, 0, 0) if t is None else t.expand(shape).stride()


def _per_head(p: Tensor, batch: int, heads: int, n: int) -> Tensor:
    """A presence-shaped ``(B, N)``, ``(B, Hkv, N)`` or ``(B, H, N)`` tensor as a ``(B, H, N)``
    view or copy (shared ones by stride 0; per-KV-head ones repeated, N-sized)."""
    if p.dim() == 2:
        return p[:, None].expand(batch, heads, n)
    return p if p.shape[1] == heads else p.repeat_interleave(heads // p.shape[1], dim=1)


def _key_logits(p_k: Tensor, batch: int, heads: int) -> Tensor:
    """``log2 p_j`` in fp32 (the kernels' scores are in base 2), ``_NULL_LOGIT`` where
    ``p_j = 0`` (NaN stays NaN): ``(B, H, Nk)``."""
    pk = p_k.float()
    logit = torch.where(pk != 0, torch.log2(pk), _NULL_LOGIT)
    return _per_head(logit, batch, heads, p_k.shape[-1])


def _check_limits(q: Tensor, k: Tensor, batch_heads: int) -> None:
    """ValueError, naming the limit, for a call the kernels' grid or int32 offsets cannot take."""
    if batch_heads > GRID_Y_LIMIT:
        raise ValueError(f"the Triton OAttention kernels take batch × heads up to {GRID_Y_LIMIT:,} "
                         f"(CUDA's grid), not {batch_heads:,}; split the batch or use "
                         "precision='fp32'")
    for name, t in (("q", q), ("k", k)):
        span = sum((n - 1) * abs(s) for n, s in zip(t.shape[2:], t.stride()[2:])) + 1
        if span >= INT32_LIMIT:
            raise ValueError(f"the Triton OAttention kernels address one (batch, head) slice with "
                             f"int32 offsets; {name}'s spans {span:,} elements (limit 2**31); "
                             "use shorter sequences or precision='fp32'")


class _Launch:
    """One call's tensors, strides and flags, shared by the forward and the backward kernels."""

    def __init__(self, q: Tensor, k: Tensor, v: Tensor, p_q: Tensor, p_k: Tensor,
                 visible: Tensor | None, bias: Tensor | None, eps: float, scale: float,
                 softcap: float | None, dropout_p: float, seed: int, causal: bool = False) -> None:
        self.q, self.k, self.v = _dense(q), _dense(k), _dense(v)
        (b, h, n_q, d), (h_kv, n_k) = q.shape, k.shape[1:3]
        _check_limits(self.q, self.k, b * h)
        self.shape = (b, h, n_q, n_k)
        self.d, self.group = d, h // h_kv
        self.configs = configs_for(d)
        self.logp = _key_logits(p_k, b, h)
        self.pq = _per_head(p_q, b, h, n_q)
        self.visible = None if visible is None else visible.to(torch.uint8)
        self.bias = bias
        self.eps, self.scale, self.softcap, self.dropout_p, self.seed = (
            eps, scale, softcap, dropout_p, seed)
        self.causal = causal

    def common(self) -> tuple[list, dict]:
        """Positional tensors/strides after the per-kernel pointers, and the constexpr flags."""
        dummy = self.logp
        args = [*self.q.stride(), *self.k.stride(), *self.v.stride(), *self.logp.stride(),
                *_strides4(self.visible, self.shape), *_strides4(self.bias, self.shape),
                *self.pq.stride()]
        flags = dict(HAS_VIS=self.visible is not None, HAS_BIAS=self.bias is not None,
                     HAS_SOFTCAP=self.softcap is not None, HAS_DROPOUT=self.dropout_p > 0,
                     UPCAST=_INTERPRET and self.q.dtype in (torch.bfloat16, torch.float16),
                     IEEE=self.q.dtype == torch.float32, CAUSAL=self.causal,
                     BD=padded_head_dim(self.d))
        self.masks = (dummy if self.visible is None else self.visible,
                      dummy if self.bias is None else self.bias)
        return args, flags

    def launch(self, kernel, config: KernelConfig, blocks: int, heads: int, *args,
               **flags) -> None:
        """``kernel`` on the grid ``(blocks, heads)`` with ``config``'s tile, warps and stages,
        on q's device (the current CUDA device may be another)."""
        run = kernel[(blocks, heads)]
        settings = dict(BM=config.bm, BN=config.bn, num_warps=config.warps,
                        num_stages=config.stages)
        if self.q.is_cuda:
            with torch.cuda.device(self.q.device):
                run(*args, **flags, **settings)
        else:
            run(*args, **flags, **settings)

    def forward(self) -> tuple[Tensor, Tensor]:
        """``(out, lse)``: out like q, lse ``(B, H, Nq)`` fp32 = log(ε + Z_i)."""
        b, h, n_q, n_k = self.shape
        out = torch.empty_like(self.q)
        lse = torch.empty(b, h, n_q, device=self.q.device, dtype=torch.float32)
        args, flags = self.common()
        config = self.configs.forward
        self.launch(_forward_kernel, config, triton.cdiv(n_q, config.bm), b * h,
                    self.q, self.k, self.v, self.logp, *self.masks, self.pq, out, lse,
                    *args, *out.stride(), h, self.group, n_q, n_k, self.d, self.scale,
                    sink_logit(self.eps) * LOG2E.value, self.softcap or 1.0, self.dropout_p, self.seed,
                    **flags)
        return out, lse

    def backward(self, out: Tensor, lse: Tensor, d_out: Tensor, need_colsum: bool,
                 need_rowdot: bool) -> tuple[Tensor, Tensor, Tensor, Tensor | None,
                                             Tensor | None]:
        """``(dq, dk, dv, colsum (B, H, Nk) or None, rowdot (B, H, Nq) or None)``."""
        b, h, n_q, n_k = self.shape
        if d_out.stride() != out.stride():
            d_out = torch.empty_like(out).copy_(d_out)                       # q's layout
        args, flags = self.common()
        rowdot = torch.empty_like(lse) if need_rowdot else lse
        delta, dq = torch.empty_like(lse), torch.empty_like(self.q)
        config = self.configs.dq
        self.launch(_backward_dq_kernel, config, triton.cdiv(n_q, config.bm), b * h,
                    self.q, self.k, self.v, self.logp, *self.masks, self.pq, out, d_out, lse,
                    delta, dq, rowdot, *args, h, self.group, n_q, n_k, self.d, self.scale,
                    self.softcap or 1.0, self.dropout_p, self.seed, NEED_ROWDOT=need_rowdot,
                    **flags)
        dk, dv = torch.empty_like(self.k), torch.empty_like(self.k)          # k's layout
        colsum = lse.new_empty(b, h, n_k) if need_colsum else lse
        config = self.configs.dkdv
        self.launch(_backward_dkdv_kernel, config, triton.cdiv(n_k, config.bn),
                    b * (h // self.group), self.q, self.k, self.v, self.logp, *self.masks,
                    self.pq, d_out, lse, delta, dk, dv, colsum, *args, h, self.group, n_q, n_k,
                    self.d, self.scale, self.softcap or 1.0, self.dropout_p, self.seed,
                    NEED_COLSUM=need_colsum, **flags)
        return (dq, dk, dv, colsum if need_colsum else None, rowdot if need_rowdot else None)


def _presence_grad(per_head: Tensor, p: Tensor) -> Tensor:
    """A ``(B, H, N)`` per-query-head gradient reduced to ``p``'s shape (heads summed)."""
    if p.dim() == 2:
        return per_head.sum(1)
    if p.shape[1] != per_head.shape[1]:
        return per_head.unflatten(1, (p.shape[1], -1)).sum(2)
    return per_head


class _TritonOAttention(torch.autograd.Function):
    """Autograd of :func:`o_attention_triton` (formulas in the module docstring)."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, p_q: Tensor, p_k: Tensor,
                launch: _Launch) -> Tensor:
        out, lse = launch.forward()
        ctx.save_for_backward(out, lse, p_q, p_k)
        ctx.launch = launch
        return out

    @staticmethod
    @torch.autograd.function.once_differentiable
    def backward(ctx, d_out: Tensor) -> tuple[Tensor | None, ...]:
        out, lse, p_q, p_k = ctx.saved_tensors
        launch = ctx.launch
        need_pq, need_pk = ctx.needs_input_grad[3:5]
        dq, dk, dv, colsum, rowdot = launch.backward(out, lse, d_out, need_pk, need_pq)
        d_pq = _presence_grad(rowdot, p_q).to(p_q.dtype) if need_pq else None
        d_pk = None
        if need_pk:
            inv = torch.where(p_k != 0, 1 / p_k.float(), 0.0)
            d_pk = (_presence_grad(colsum, p_k) * inv).to(p_k.dtype)
        return dq, dk, dv, d_pq, d_pk, None


def dropout_keep(seed: int, shape: tuple[int, int, int, int], dropout_p: float,
                 device: torch.device | str = "cpu") -> Tensor:
    """The kernels' δ ``(B, H, Nq, Nk)`` for ``seed`` (``ξ / (1 − dropout_p)``): what the
    forward applied to the weights, for reproducing a dropout call outside the kernel."""
    b, h, n_q, n_k = shape
    keep = torch.empty(shape, device=device, dtype=torch.float32)
    _dropout_kernel[(b * h, n_q)](keep, n_q, n_k, dropout_p, seed, BN=configs_for(16).forward.bn)
    return keep


def o_attention_triton(q: Tensor, k: Tensor, v: Tensor, p_q: Tensor, p_k: Tensor,
                       visible: Tensor | None, bias: Tensor | None, eps: float, scale: float,
                       softcap: float | None = None, dropout_p: float = 0.0,
                       seed: int | None = None, causal: bool = False) -> Tensor:
    """OAttention ``(B, H, Nq, d)`` in q's dtype on the fused kernels (module docstring).

    q ``(B, H, Nq, d)``, k/v ``(B, Hkv, Nk, d)`` in one dtype; presences as
    :func:`oretrofit._operators.attention.o_attention` takes them (any float dtype); ``visible`` (bool) and
    ``bias`` (float, finite) broadcastable to ``(B, H, Nq, Nk)``, neither requiring grad.
    ``seed`` fixes the dropout draw (default: one from torch's generator, so ``torch.manual_seed``
    reproduces a call). ``causal``: key j is visible to query i only if ``j ≤ i + Nk − Nq``
    (bottom-right aligned, as with a KV cache), on top of ``visible`` and ``bias``; the kernels
    skip the tiles no query of a block sees.
    """
    if dropout_p > 0 and seed is None:
        seed = int(torch.randint(0, 2**31 - 1, (), device="cpu"))
    launch = _Launch(q, k, v, p_q, p_k, visible, bias, eps, scale, softcap, dropout_p, seed or 0,
                     causal)
    if torch.is_grad_enabled() and any(t.requires_grad for t in (q, k, v, p_q, p_k)):
        return _TritonOAttention.apply(q, k, v, p_q, p_k, launch)
    return launch.forward()[0]
