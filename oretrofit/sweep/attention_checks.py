"""Per-case measurements of the OAttention contracts (paper Tables 1 and 6).

One case is one module (hidden-carrier or Q/K/V boundary), one seed and one shape. Every error
is an L∞ maximum; "exact" quantities are the largest absolute value where the contract says 0.
Outputs come from both paths (fused: ``need_weights=False``; reference: ``need_weights=True``),
weights from the reference path.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._operators.attention_modules import HiddenCarrierOAttention, QKVOAttention
from .direct import direct_projected
from .measure import insert_zero_rows, linf

__all__ = ["AttentionShape", "attention_case", "interface_case", "MODULES"]

MODULES: dict[str, type[nn.Module]] = {"hidden": HiddenCarrierOAttention, "qkv": QKVOAttention}
_SCALES = torch.logspace(-7, -5, 9, dtype=torch.float64).tolist()       # near-origin sweep


@dataclass(frozen=True)
class AttentionShape:
    """Batch, query heads, key/value heads, query and key lengths, head size."""

    batch: int
    heads: int
    kv_heads: int
    n_q: int
    n_k: int
    head_dim: int

    def label(self) -> str:
        return (f"B{self.batch} H{self.heads}/{self.kv_heads} Nq{self.n_q} Nk{self.n_k} "
                f"d{self.head_dim}")


def _both_paths(module: nn.Module, x: Tensor, context: Tensor | None = None,
                mask: Tensor | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """(fused output, reference output, reference weights)."""
    fused, _ = module(x, context, mask=mask)
    ref, weights = module(x, context, mask=mask, need_weights=True)
    return fused, ref, weights


def _insertion_positions(n: int) -> list[list[int]]:
    """End, start, interior and several at once."""
    return [[n], [0], [n // 2], [0, n // 2 + 1, n + 2]]


def _log_log_slope(module: nn.Module, context: Tensor) -> float:
    """Least-squares slope of log ‖output‖∞ against log s for a receiver s·u, ‖u‖ = 1."""
    u = F.normalize(torch.randn(1, 1, context.shape[-1], device=context.device), dim=-1)
    norms = [float(module(s * u, context[:1])[0].abs().max()) for s in _SCALES]
    xs = [math.log(s) for s in _SCALES]
    ys = [math.log(n) for n in norms]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    return sum((a - mx) * (b - my) for a, b in zip(xs, ys)) / sum((a - mx) ** 2 for a in xs)


def _softmax_reference(module: nn.Module, x: Tensor, context: Tensor) -> Tensor:
    """Ordinary multi-head softmax attention with the module's own projections."""
    b, n, _ = x.shape
    q = module.q_proj(x).view(b, n, module.n_heads, -1).transpose(1, 2)
    k = module.k_proj(context).view(b, context.shape[1], module.n_kv_heads, -1).transpose(1, 2)
    v = module.v_proj(context).view(b, context.shape[1], module.n_kv_heads, -1).transpose(1, 2)
    out = F.scaled_dot_product_attention(q, k, v, enable_gqa=module.n_kv_heads != module.n_heads)
    return module.out_proj(out.transpose(1, 2).reshape(b, n, -1))


@torch.no_grad()
def attention_case(kind: str, shape: AttentionShape, seed: int, tau: float, eps: float,
                   device: str) -> dict[str, float | bool]:
    """Every contract measurement of one (module kind, shape, seed) case, in fp32."""
    torch.manual_seed(seed)
    d_model = shape.heads * shape.head_dim
    module = MODULES[kind](d_model, shape.heads, shape.kv_heads, tau=tau, eps=eps).to(device)
    x = torch.randn(shape.batch, shape.n_q, d_model, device=device)
    context = torch.randn(shape.batch, shape.n_k, d_model, device=device)
    m: dict[str, float | bool] = {}
    values: list[Tensor] = []

    # Canonical equation against the direct fp64 evaluation (cross-attention).
    fused, ref, weights = _both_paths(module, x, context)
    want, want_w = direct_projected(module, x, context, tau)
    m["equation_output"] = max(linf(fused, want), linf(ref, want))
    m["equation_weight"] = linf(weights, want_w)
    values += [fused, ref, weights]

    # Null-source insertion into the context (end, start, interior, several).
    old_out = old_w = inserted_w = 0.0
    for where in _insertion_positions(shape.n_k):
        f2, r2, w2 = _both_paths(module, x, insert_zero_rows(context, where))
        kept = [j for j in range(w2.shape[-1]) if j not in where]
        old_out = max(old_out, linf(f2, fused), linf(r2, ref))
        old_w = max(old_w, linf(w2[..., kept], weights))
        inserted_w = max(inserted_w, linf(w2[..., where]))
        values += [f2, r2, w2]
    m.update(insertion_old_output=old_out, insertion_old_weight=old_w,
             inserted_source_weight=inserted_w)

    # Self-attention insertion: old outputs kept, inserted receivers emit 0.
    f_self, r_self, w_self = _both_paths(module, x)
    old_out = inserted_out = 0.0
    for where in _insertion_positions(shape.n_q):
        f2, r2, w2 = _both_paths(module, insert_zero_rows(x, where))
        kept = [i for i in range(f2.shape[1]) if i not in where]
        old_out = max(old_out, linf(f2[:, kept], f_self), linf(r2[:, kept], r_self))
        inserted_out = max(inserted_out, linf(f2[:, where]), linf(r2[:, where]),
                           linf(w2[..., where]))
        values += [f2, r2, w2]
    m.update(self_insertion_old_output=old_out, inserted_receiver_output=inserted_out)

    # Null receiver, empty support (Nk = 0 and an all-null context), fully masked rows.
    x_null = x.clone()
    x_null[:, 0] = 0.0
    m["null_query_output"] = max(linf(o[:, 0]) for o in _both_paths(module, x_null, context)[:2])
    empty = [_both_paths(module, x, context[:, :0]), _both_paths(module, x, torch.zeros_like(context))]
    m["empty_support"] = max(linf(t) for case in empty for t in case)
    mask = torch.ones(shape.n_q, shape.n_k, dtype=torch.bool, device=device)
    mask[0] = False
    additive = torch.zeros(mask.shape, device=device).masked_fill(~mask, float("-inf"))
    masked = [_both_paths(module, x, context, mask=mk) for mk in (mask, additive)]
    m["fully_masked"] = max(linf(t[:, 0] if t.dim() == 3 else t[:, :, 0])
                            for case in masked for t in case)
    values += [t for case in empty + masked for t in case]

    # Active path against softmax attention, and the near-origin receiver slope.
    softmax = _softmax_reference(module, x, context)
    m["active_relative"] = linf(fused, softmax) / linf(softmax)
    m["near_origin_slope"] = _log_log_slope(module, context)
    m["finite"] = all(bool(torch.isfinite(t).all()) for t in values)
    return m


def interface_case(kind: str, dtype: torch.dtype, kv_heads: int, seed: int, tau: float,
                   eps: float, device: str) -> dict[str, bool]:
    """One dtype–head case: self and cross attention with zero tokens, bool and additive masks,
    outputs finite and in the input dtype, gradients finite (half precision: outputs only)."""
    torch.manual_seed(seed)
    module = MODULES[kind](32, 4, kv_heads, tau=tau, eps=eps).to(device=device, dtype=dtype)
    x = insert_zero_rows(torch.randn(2, 6, 32, device=device), [2]).to(dtype)
    context = insert_zero_rows(torch.randn(2, 9, 32, device=device), [0, 9]).to(dtype)
    mask = torch.rand(7, 11, device=device) > 0.3
    additive = torch.zeros(mask.shape, device=device).masked_fill(~mask, float("-inf"))
    x.requires_grad_(dtype == torch.float32)
    outputs = [t for c in (None, context) for mk in (None, mask, additive)
               for t in _both_paths(module, x, c, mk if c is not None else None)]
    finite = all(bool(torch.isfinite(t).all()) and t.dtype == dtype for t in outputs)
    grads_finite = True
    if dtype == torch.float32:
        sum(t.sum() for t in outputs).backward()
        grads = [x.grad] + [p.grad for p in module.parameters()]
        grads_finite = all(g is not None and bool(torch.isfinite(g).all()) for g in grads)
    return {"finite": finite, "gradients_finite": grads_finite}
