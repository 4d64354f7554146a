"""cuDNN attention as a :class:`oretrofit._kernels.lse.Backend`, in the inputs' dtype.

``aten::_scaled_dot_product_cudnn_attention`` with the key bias ``log p_j`` (the caller's finite
bias and masks folded in, as :func:`oretrofit._kernels.lse.score_bias` gives it) and
``compute_log_sumexp`` returns ``o_i = Σ_j e^{t_ij − L_i} v_j`` and ``L_i``; its ``_backward``
takes ``(dO, q, k, v, out, L)`` and returns ``dq, dk, dv``. OAttention is then composed from them
by :func:`oretrofit._kernels.lse.o_attention_lse` (``out_i = p_i σ(L_i − log ε) o_i`` and
its backward, shared with every kernel route).

The op's backward returns no bias gradient, so ``∂/∂p_j = Σ_i dS_ij / p_j`` comes, as on the fp32
route, from one augmented backward call (``q′ = [q, 1/scale]``, ``k′ = [k, 0]``; head size padded
to a multiple of 8), made only when ``p_k`` requires grad; with :attr:`Backend.tiled` False it
is one call, not tiles.

Adaptation (taken from the ops' meta functions in torch 2.13; the route's check confirms it on
the device before use): the LSE comes as ``(B, H, Nq, 1)`` fp32 and goes back in that shape;
the bias is 4-D with 16-aligned strides (as for the memory-efficient kernel); GQA repeats k/v;
no dropout, so the Philox seed and offset are unused zeros and the sequence offsets ``None``
(dense, not nested, inputs).
"""

from __future__ import annotations

from typing import Callable

import torch
from torch import Tensor

from .lse import Backend, _efficient_bias, _repeat_kv, _sum_groups

__all__ = ["cudnn_backend", "cuda_cudnn_backend"]


def cudnn_backend(forward_op: Callable, backward_op: Callable) -> Backend:
    """A :class:`Backend` on ops with the signatures of
    ``aten::_scaled_dot_product_cudnn_attention`` and its ``_backward`` (module docstring).
    Taking the ops as arguments lets the tests check this adaptation on the CPU against an
    emulation of the ops' contract."""

    def forward(q: Tensor, k: Tensor, v: Tensor, bias: Tensor, scale: float
                ) -> tuple[Tensor, Tensor]:
        (b, heads, n_q, _), n_k = q.shape, k.shape[2]
        result = forward_op(q, _repeat_kv(k, heads), _repeat_kv(v, heads),
                            _efficient_bias(bias, (b, heads, n_q, n_k)), True, 0.0, False, False,
                            scale=scale)
        return result[0], result[1].reshape(b, heads, n_q)

    def backward(d_out: Tensor, q: Tensor, k: Tensor, v: Tensor, bias: Tensor, out: Tensor,
                 lse: Tensor, scale: float) -> tuple[Tensor, Tensor, Tensor]:
        (b, heads, n_q, _), (kv_heads, n_k) = q.shape, k.shape[1:3]
        if d_out.stride() != out.stride():                  # the gradient in the output's layout
            d_out = torch.empty_like(out).copy_(d_out)
        zero = torch.zeros((), dtype=torch.long, device=q.device)          # no dropout: unused
        dq, dk, dv = backward_op(d_out, q, _repeat_kv(k, heads), _repeat_kv(v, heads), out,
                                 lse.reshape(b, heads, n_q, 1), zero, zero,
                                 _efficient_bias(bias, (b, heads, n_q, n_k)), None, None, n_q, n_k,
                                 0.0, False, scale=scale)
        return dq, _sum_groups(dk, kv_heads), _sum_groups(dv, kv_heads)

    return Backend("cuda-cudnn", forward, backward, head_multiple=8, width_multiple=8,
                   tiled=False)


def cuda_cudnn_backend() -> Backend | None:
    """:func:`cudnn_backend` on this torch's ops, or None where it lacks them."""
    aten = torch.ops.aten
    if not (hasattr(aten, "_scaled_dot_product_cudnn_attention")
            and hasattr(aten, "_scaled_dot_product_cudnn_attention_backward")):
        return None
    return cudnn_backend(aten._scaled_dot_product_cudnn_attention,
                         aten._scaled_dot_product_cudnn_attention_backward)
