"""OAttention modules: the canonical hidden-carrier boundary and the Q/K/V-boundary variant.

τ defaults to ``TAU_MODULES`` = 1e-6 (the paper's training setting), not ``retrofit``'s 1e-8:
these modules are built and trained with the gate in place (see :mod:`.presence`).
"""

from __future__ import annotations

from torch import Tensor, nn

from .attention import o_attention
from .presence import EPS_MODULES, TAU_MODULES, check_eps, check_positive, presence

__all__ = ["HiddenCarrierOAttention", "QKVOAttention"]


class _ProjectedAttention(nn.Module):
    """Bias-free Q/K/V/out projections shared by both boundaries (zero-preserving by design)."""

    def __init__(self, d_model: int, n_heads: int, n_kv_heads: int | None = None,
                 tau: float = TAU_MODULES, eps: float = EPS_MODULES, d_context: int | None = None) -> None:
        super().__init__()
        n_kv_heads = n_heads if n_kv_heads is None else n_kv_heads
        if d_model % n_heads != 0:
            raise ValueError(f"d_model={d_model} must be divisible by n_heads={n_heads}")
        if n_heads % n_kv_heads != 0:
            raise ValueError(f"n_heads={n_heads} must be a multiple of n_kv_heads={n_kv_heads} (GQA)")
        self.n_heads, self.n_kv_heads, self.head_dim = n_heads, n_kv_heads, d_model // n_heads
        self.tau, self.eps = check_positive("tau", tau), check_eps(eps)
        d_context = d_model if d_context is None else d_context
        self.q_proj = nn.Linear(d_model, d_model, bias=False)
        self.k_proj = nn.Linear(d_context, n_kv_heads * self.head_dim, bias=False)
        self.v_proj = nn.Linear(d_context, n_kv_heads * self.head_dim, bias=False)
        self.out_proj = nn.Linear(d_model, d_model, bias=False)

    def _heads(self, x: Tensor, heads: int) -> Tensor:
        b, n, _ = x.shape
        return x.view(b, n, heads, self.head_dim).transpose(1, 2)          # (B, H, N, hd)

    def _project(self, x: Tensor, context: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        if x.dim() != 3 or context.dim() != 3 or x.shape[0] != context.shape[0]:
            raise ValueError(f"x and context must be (B, N, d) with the same B; got "
                             f"{tuple(x.shape)} and {tuple(context.shape)}")
        return (self._heads(self.q_proj(x), self.n_heads),
                self._heads(self.k_proj(context), self.n_kv_heads),
                self._heads(self.v_proj(context), self.n_kv_heads))

    def _merge(self, out: Tensor) -> Tensor:
        b, h, n, hd = out.shape
        return self.out_proj(out.transpose(1, 2).reshape(b, n, h * hd))   # (B, N, d)


class HiddenCarrierOAttention(_ProjectedAttention):
    """Canonical OAttention (eq. 7): one presence per token, read from its hidden carrier and
    shared across heads; ``y_i = W_O · p_i Σ_j m_ij p_j e^{s_ij} v_j / (ε + Σ_j m_ij p_j e^{s_ij})``.

    ``forward(x)`` is self-attention; ``forward(x, context)`` cross-attention. A host that feeds
    normalised inputs passes the presences of the pre-norm carriers as ``p_x`` / ``p_context``.
    """

    def forward(self, x: Tensor, context: Tensor | None = None, *, p_x: Tensor | None = None,
                p_context: Tensor | None = None, mask: Tensor | None = None,
                need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        """x ``(B, Nq, d)``, context ``(B, Nk, d_context)`` -> ``(B, Nq, d)``, weights or None."""
        self_attention = context is None
        context = x if self_attention else context
        p_x = presence(x, self.tau) if p_x is None else p_x                      # (B, Nq)
        if p_context is None:
            p_context = p_x if self_attention else presence(context, self.tau)   # (B, Nk)
        q, k, v = self._project(x, context)
        out, weights = o_attention(q, k, v, p_x, p_context, mask=mask, eps=self.eps,
                                   need_weights=need_weights)
        return self._merge(out), weights


class QKVOAttention(_ProjectedAttention):
    """Q/K/V-boundary OAttention (A.1, eq. 23): presence per head from the projected query and
    key, ``p^Q_ia = ρτ(q_ia)``, ``p^K_ja = ρτ(k_ja)``; the key presence follows the KV-head repeat."""

    def forward(self, x: Tensor, context: Tensor | None = None, *, mask: Tensor | None = None,
                need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        """x ``(B, Nq, d)``, context ``(B, Nk, d_context)`` -> ``(B, Nq, d)``, weights or None."""
        q, k, v = self._project(x, x if context is None else context)
        p_q, p_k = presence(q, self.tau), presence(k, self.tau)                 # (B, H, Nq), (B, Hkv, Nk)
        out, weights = o_attention(q, k, v, p_q, p_k, mask=mask, eps=self.eps,
                                   need_weights=need_weights)
        return self._merge(out), weights
