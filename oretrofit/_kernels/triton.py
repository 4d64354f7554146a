"""OAttention as one fused Triton kernel pair: the half-precision CUDA route.

The launcher and autograd of the kernels in :mod:`oretrofit._kernels.triton_kernels` (whose
docstring gives the forward and backward formulas): one call's tensors, strides and flags
(:class:`_Launch`), the presence gradients reduced to the callers' shapes, and
:func:`o_attention_triton`, the route's entry point.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

import torch
import triton
from torch import Tensor

from .lse import _NULL_LOGIT, sink_logit
from .triton_configs import _INTERPRET, Configs, KernelConfig, configs_for, padded_head_dim
from .triton_kernels import (GRID_Y_LIMIT, INT32_LIMIT, LOG2E, _backward_dkdv_kernel,
                             _backward_dq_kernel, _dropout_kernel, _forward_kernel)

__all__ = ["o_attention_triton", "dropout_keep"]

def _dense(t: Tensor) -> Tensor:
    """``t`` if its storage is dense in (B, H, N, d) or (B, N, H, d) order (``empty_like`` then
    keeps its strides), else a contiguous copy."""
    return t if t.is_contiguous() or t.transpose(1, 2).is_contiguous() else t.contiguous()


def _row_strides(p: Tensor) -> tuple[int, int, int]:
    """(batch, head, position) element strides of a ``(B, N)`` (head stride 0) or ``(B, H, N)``
    presence-shaped tensor."""
    strides = p.stride()
    return (strides[0], 0, strides[1]) if len(strides) == 2 else strides


def _mask_strides(t: Tensor | None) -> tuple[int | None, ...]:
    """Element strides of a mask broadcast to (B, H, Nq, Nk): 0 on its size-1 axes; ``None``
    for an absent mask (the kernels take no mask arguments then)."""
    if t is None:
        return (None,) * 4
    pad = (0,) * (4 - t.dim())
    return pad + tuple(0 if n == 1 else s for n, s in zip(t.shape, t.stride()))


def _key_logits(p_k: Tensor) -> Tensor:
    """``log2 p_j`` in fp32 (the kernels' scores are in base 2), ``_NULL_LOGIT`` where
    ``p_j = 0`` (log2 0 = −inf clamped; NaN stays NaN), in p_k's shape: the forward and dq
    kernels index it as they would p_k, so a per-KV-head or shared p_k is not repeated."""
    p = p_k.detach() if p_k.requires_grad else p_k        # the kernels' constants: no graph
    return torch.log2(p if p.dtype == torch.float32 else p.float()).clamp_min_(_NULL_LOGIT)


def _check_limits(q: Tensor, k: Tensor, batch_heads: int) -> None:
    """ValueError, naming the limit, for a call the kernels' grid or int32 offsets cannot take
    (q and k are dense: a slice spans fewer elements than the tensor holds, so only a tensor of
    2**31 elements or more is measured)."""
    if batch_heads > GRID_Y_LIMIT:
        raise ValueError(f"the Triton OAttention kernels take batch × heads up to {GRID_Y_LIMIT:,} "
                         f"(CUDA's grid), not {batch_heads:,}; split the batch or use "
                         "precision='fp32'")
    for name, t in (("q", q), ("k", k)):
        if t.numel() < INT32_LIMIT:
            continue
        span = sum((n - 1) * abs(s) for n, s in zip(t.shape[2:], t.stride()[2:])) + 1
        if span >= INT32_LIMIT:
            raise ValueError(f"the Triton OAttention kernels address one (batch, head) slice with "
                             f"int32 offsets; {name}'s spans {span:,} elements (limit 2**31); "
                             "use shorter sequences or precision='fp32'")


@dataclass(frozen=True)
class _Settings:
    """The kernels' configurations and keyword arguments (constexpr flags, tile, warps, stages)
    for one (dtype, head dim, flags): ``dq`` and ``dkdv`` without and with the presence
    reductions (``NEED_ROWDOT``, ``NEED_COLSUM``). ``PK_PER_HEAD``: p_k has a row per query
    head (else per KV head or shared), which also sets the dk/dv kernel's presence gradient to
    one row per query head (else per KV head)."""

    configs: Configs
    forward: dict
    dq: tuple[dict, dict]
    dkdv: tuple[dict, dict]


@cache
def _settings(dtype: torch.dtype, d: int, has_vis: bool, has_bias: bool, has_softcap: bool,
              has_dropout: bool, causal: bool, pk_per_head: bool) -> _Settings:
    """The launch settings of every call of this (dtype, head dim, flags), built once."""
    configs = configs_for(d)
    flags = dict(HAS_VIS=has_vis, HAS_BIAS=has_bias, HAS_SOFTCAP=has_softcap,
                 HAS_DROPOUT=has_dropout,
                 UPCAST=_INTERPRET and dtype in (torch.bfloat16, torch.float16),
                 IEEE=dtype == torch.float32, CAUSAL=causal, PK_PER_HEAD=pk_per_head,
                 BD=padded_head_dim(d))

    def kwargs(config: KernelConfig, **more: bool) -> dict:
        return dict(flags, **more, BM=config.bm, BN=config.bn, num_warps=config.warps,
                    num_stages=config.stages)

    return _Settings(configs, kwargs(configs.forward),
                     tuple(kwargs(configs.dq, NEED_ROWDOT=need) for need in (False, True)),
                     tuple(kwargs(configs.dkdv, NEED_COLSUM=need) for need in (False, True)))


class _Launch:
    """One call's launch arguments, shared by the forward and the backward kernels: its tensors
    (an absent mask and its strides are ``None``) and the strides, sizes and scalars after
    them; the flags and configurations come from :func:`_settings`."""

    def __init__(self, q: Tensor, k: Tensor, v: Tensor, p_q: Tensor, p_k: Tensor,
                 visible: Tensor | None, bias: Tensor | None, eps: float, scale: float,
                 softcap: float | None, dropout_p: float, seed: int, causal: bool = False) -> None:
        q, k, v = _dense(q), _dense(k), _dense(v)
        (b, h, n_q, d), (h_kv, n_k) = q.shape, k.shape[1:3]
        _check_limits(q, k, b * h)
        vis = None if visible is None else visible.view(torch.uint8)
        self.q, self.k, self.d, self.group = q, k, d, h // h_kv
        self.shape = (b, h, n_q, n_k)
        self.pk_heads = h if p_k.dim() == 3 and p_k.shape[1] == h else h_kv
        self.settings = _settings(q.dtype, d, vis is not None, bias is not None,
                                  softcap is not None, dropout_p > 0, causal,
                                  self.pk_heads != h_kv)
        self.logp, self.p_k = _key_logits(p_k), p_k
        self.around = ((q, k, v), (vis, bias, p_q))
        self.around_strides = ((*q.stride(), *k.stride(), *v.stride()),
                               (*_mask_strides(vis), *_mask_strides(bias), *_row_strides(p_q)))
        self.sizes = (h, self.group, n_q, n_k, d, scale)
        self.log_eps = sink_logit(eps) * LOG2E.value
        self.tail = (softcap or 1.0, dropout_p, seed)

    def arguments(self, keys: Tensor) -> tuple[tuple, tuple]:
        """The kernels' leading tensors and their strides, with ``keys`` the key logits (forward,
        dq) or the key presences (dk/dv, which divides by them)."""
        (qkv, rest), (qkv_strides, rest_strides) = self.around, self.around_strides
        return (*qkv, keys, *rest), (*qkv_strides, *_row_strides(keys), *rest_strides)

    def launch(self, kernel, grid: tuple[int, int], args: tuple, kwargs: dict) -> None:
        """``kernel`` on ``grid`` with ``args`` and ``kwargs`` (its flags and configuration), on
        q's device (the current CUDA device may be another)."""
        if self.q.is_cuda:
            with torch.cuda.device(self.q.device):
                kernel.run(*args, grid=grid, warmup=False, **kwargs)
        else:
            kernel.run(*args, grid=grid, warmup=False, **kwargs)

    def forward(self) -> tuple[Tensor, Tensor]:
        """``(out, lse)``: out like q, lse ``(B, H, Nq)`` fp32 = log(ε + Z_i)."""
        b, h, n_q, _ = self.shape
        out = torch.empty_like(self.q)
        lse = self.q.new_empty((b, h, n_q), dtype=torch.float32)
        settings = self.settings
        inputs, strides = self.arguments(self.logp)
        self.launch(_forward_kernel, (-(-n_q // settings.configs.forward.bm), b * h),
                    (*inputs, out, lse, *strides, *out.stride(), *self.sizes,
                     self.log_eps, *self.tail), settings.forward)
        return out, lse

    def backward(self, out: Tensor, lse: Tensor, d_out: Tensor, need_colsum: bool,
                 need_rowdot: bool) -> tuple[Tensor, Tensor, Tensor, Tensor | None,
                                             Tensor | None]:
        """``(dq, dk, dv, dp_k or None, rowdot (B, H, Nq) or None)``, dp_k = Σ_i dS_ij / p_j
        ``(B, H, Nk)`` for p_k per query head, else ``(B, Hkv, Nk)`` (summed over each group)."""
        b, h, n_q, n_k = self.shape
        if d_out.stride() != out.stride():
            d_out = torch.empty_like(out).copy_(d_out)                       # q's layout
        settings, scalars = self.settings, (*self.sizes, *self.tail)
        inputs, strides = self.arguments(self.logp)
        rowdot = torch.empty_like(lse) if need_rowdot else lse
        delta, dq = torch.empty_like(lse), torch.empty_like(self.q)
        self.launch(_backward_dq_kernel, (-(-n_q // settings.configs.dq.bm), b * h),
                    (*inputs, out, d_out, lse, delta, dq, rowdot, *strides, *scalars),
                    settings.dq[need_rowdot])
        dk, dv = torch.empty_like(self.k), torch.empty_like(self.k)          # k's layout
        colsum = lse.new_empty(b, self.pk_heads, n_k) if need_colsum else lse
        inputs, strides = self.arguments(self.p_k)
        self.launch(_backward_dkdv_kernel,
                    (-(-n_k // settings.configs.dkdv.bn), b * (h // self.group)),
                    (*inputs, d_out, lse, delta, dk, dv, colsum, *strides, *scalars),
                    settings.dkdv[need_colsum])
        return (dq, dk, dv, colsum if need_colsum else None, rowdot if need_rowdot else None)


def _presence_grad(per_head: Tensor, p: Tensor) -> Tensor:
    """A ``(B, H, N)`` per-head gradient reduced to ``p``'s shape (heads summed)."""
    if p.dim() == 2:
        return per_head.sum(1)
    if p.shape[1] != per_head.shape[1]:
        return per_head.unflatten(1, (p.shape[1], -1)).sum(2)
    return per_head


def _in_dtype(grad: Tensor | None, p: Tensor) -> Tensor | None:
    """A presence gradient (fp32) in ``p``'s dtype."""
    return grad if grad is None or grad.dtype == p.dtype else grad.to(p.dtype)


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
        d_pq = _presence_grad(rowdot, p_q) if need_pq else None
        d_pk = _presence_grad(colsum, p_k) if need_pk else None
        return (dq, dk, dv, _in_dtype(d_pq, p_q), _in_dtype(d_pk, p_k), None)


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
    if torch.is_grad_enabled() and (q.requires_grad or k.requires_grad or v.requires_grad
                                    or p_q.requires_grad or p_k.requires_grad):
        return _TritonOAttention.apply(q, k, v, p_q, p_k, launch)
    return launch.forward()[0]
