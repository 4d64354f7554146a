"""OTransformerBlock: a pre-norm transformer block closed under zero extension (eq. 22).

    p = ρτ(h);  h ← h + OAttention(ONorm₁(h); presences p)        (eqs. 7, 16)
                h ← h + ρτ(h) · FFN(ONorm₂(h))                     (eq. 15)

Each path is zero-absorbing (local components) or gives zero mass to zero states (attention),
so by Theorem 1, ``block(H ⊕ 0) = block(H) ⊕ 0``. τ defaults to ``TAU_MODULES`` = 1e-6, the
paper's training setting (``retrofit`` uses 1e-8 for pretrained hosts; see :mod:`.presence`).
"""

from __future__ import annotations

from torch import Tensor, nn

from .attention_modules import HiddenCarrierOAttention
from .components import OFFN, ONorm
from .presence import EPS_MODULES, TAU_MODULES, presence

__all__ = ["OTransformerBlock"]


class OTransformerBlock(nn.Module):
    """Pre-norm block of hidden-carrier OAttention, ONorm-wrapped LayerNorms and an OFFN.

    The LayerNorms and the FFN keep their affine parameters and biases: zero-absorption comes
    from the presence gates, not from removing them.
    """

    def __init__(self, d_model: int, n_heads: int, d_ff: int, tau: float = TAU_MODULES,
                 eps: float = EPS_MODULES, n_kv_heads: int | None = None) -> None:
        super().__init__()
        self.tau = tau
        self.norm1 = ONorm(nn.LayerNorm(d_model), tau)
        self.attn = HiddenCarrierOAttention(d_model, n_heads, n_kv_heads, tau=tau, eps=eps)
        self.ffn = OFFN(nn.Sequential(ONorm(nn.LayerNorm(d_model), tau), nn.Linear(d_model, d_ff),
                                      nn.GELU(), nn.Linear(d_ff, d_model)), tau)

    def forward(self, h: Tensor, mask: Tensor | None = None) -> Tensor:
        """h ``(B, N, d)`` -> ``(B, N, d)``; ``mask`` broadcastable to ``(B, H, N, N)``."""
        p = presence(h, self.tau)                                             # (B, N)
        attn, _ = self.attn(self.norm1(h), p_x=p, mask=mask)
        return self.ffn(h + attn)
