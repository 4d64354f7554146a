"""Small study hosts assembled from the core O-components (paper appendix B.3, B.6, Table 5).

Every FT-style block is an :class:`oretrofit.OTransformerBlock` (pre-norm; attention receives the
presences of the pre-norm carriers). An arm that is *not* O-closed is made by unwrapping the
block's ONorm/OFFN gates and, for softmax arms, swapping the attention for
:class:`SoftmaxAttention`, which keeps the very same projection parameters. All arms of one
study are therefore built by one deterministic construction and share their initial state
exactly; only the forward rule differs.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from .._operators.attention_modules import HiddenCarrierOAttention
from .._operators.components import OInject, ONorm
from .._operators.transformer import OTransformerBlock

__all__ = ["SoftmaxAttention", "FeatureTokenizer", "Residual", "BlockSpec", "ScalarAdapter",
           "FTHost", "HostSpec", "ARM_SPECS", "build_host"]


class SoftmaxAttention(HiddenCarrierOAttention):
    """Standard softmax attention with HiddenCarrierOAttention's projections (same parameters,
    same names), so a softmax arm and an OAttention arm can share one initial state.
    Presence arguments are accepted and ignored: ``y_i = W_O Σ_j softmax_j(s_ij) v_j``."""

    def forward(self, x: Tensor, context: Tensor | None = None, *, p_x: Tensor | None = None,
                p_context: Tensor | None = None, mask: Tensor | None = None,
                need_weights: bool = False) -> tuple[Tensor, Tensor | None]:
        q, k, v = self._project(x, x if context is None else context)      # (B, H|Hkv, N, hd)
        out = F.scaled_dot_product_attention(q, k, v, attn_mask=mask,
                                             enable_gqa=self.n_kv_heads != self.n_heads)
        return self._merge(out), None

    @classmethod
    def sharing(cls, attn: HiddenCarrierOAttention) -> "SoftmaxAttention":
        """A softmax attention holding ``attn``'s own projection modules (no new parameters)."""
        soft = cls.__new__(cls)
        nn.Module.__init__(soft)
        soft.n_heads, soft.n_kv_heads, soft.head_dim = attn.n_heads, attn.n_kv_heads, attn.head_dim
        soft.tau, soft.eps = attn.tau, attn.eps
        soft.q_proj, soft.k_proj, soft.v_proj, soft.out_proj = (
            attn.q_proj, attn.k_proj, attn.v_proj, attn.out_proj)
        return soft


class FeatureTokenizer(nn.Module):
    """Scalar-feature tokens ``h_j = z_j w_j (+ b_j)``: x ``(B, F)`` -> ``(B, F, d)``.

    Without bias a zero feature gives an exact zero token."""

    def __init__(self, n_features: int, d_model: int, bias: bool) -> None:
        super().__init__()
        bound = 1.0 / math.sqrt(d_model)
        self.weight = nn.Parameter(torch.empty(n_features, d_model).uniform_(-bound, bound))
        self.bias = (nn.Parameter(torch.empty(n_features, d_model).uniform_(-bound, bound))
                     if bias else None)

    def forward(self, x: Tensor) -> Tensor:
        h = x.unsqueeze(-1) * self.weight                                     # (B, F, d)
        return h if self.bias is None else h + self.bias


class Residual(nn.Module):
    """``h + f(h)``: an ungated residual branch (the ordinary-host counterpart of OFFN)."""

    def __init__(self, branch: nn.Module) -> None:
        super().__init__()
        self.branch = branch

    def forward(self, h: Tensor) -> Tensor:
        return h + self.branch(h)


@dataclass(frozen=True)
class BlockSpec:
    """How one host block departs from OTransformerBlock.

    attention: "softmax" or "oattention" (hidden-carrier); o_local: keep the ONorm/OFFN gates;
    affine_norm: LayerNorms with γ, β; ffn_bias: biased FFN linears.
    """

    attention: str
    o_local: bool
    affine_norm: bool
    ffn_bias: bool


def _plain_norm(norm: nn.LayerNorm, affine: bool) -> nn.LayerNorm:
    return norm if affine else nn.LayerNorm(norm.normalized_shape, elementwise_affine=False)


def build_block(spec: BlockSpec, d_model: int, n_heads: int, d_ff: int, tau: float,
                eps: float) -> OTransformerBlock:
    """An OTransformerBlock with the departures of ``spec`` applied (see module docstring)."""
    block = OTransformerBlock(d_model, n_heads, d_ff, tau=tau, eps=eps)
    norm1: ONorm = block.norm1
    ffn_norm: ONorm = block.ffn.ffn[0]
    linears = [m for m in block.ffn.ffn if isinstance(m, nn.Linear)]
    norm1.norm = _plain_norm(norm1.norm, spec.affine_norm)
    ffn_norm.norm = _plain_norm(ffn_norm.norm, spec.affine_norm)
    if not spec.ffn_bias:
        for lin in linears:
            lin.register_parameter("bias", None)
    if not spec.o_local:
        block.norm1 = norm1.norm
        block.ffn = Residual(nn.Sequential(ffn_norm.norm, *list(block.ffn.ffn)[1:]))
    if spec.attention == "softmax":
        block.attn = SoftmaxAttention.sharing(block.attn)
    elif spec.attention != "oattention":
        raise ValueError(f"attention must be 'softmax' or 'oattention', got {spec.attention!r}")
    return block


@dataclass(frozen=True)
class HostSpec:
    """An FT-style CLS host: tokenizer, optional position encoding, blocks, CLS read-out.

    encoding: "none", "additive" (h + e) or "oinject" (h + ρτ(h)·e, OInject).
    """

    block: BlockSpec
    encoding: str = "none"
    tokenizer_bias: bool = False
    d_model: int = 32
    n_heads: int = 4
    d_ff: int = 128
    n_blocks: int = 2
    tau: float = 1e-6
    eps: float = 1e-6
    max_inserted: int = 4

    def as_dict(self) -> dict:
        return asdict(self)


# Table 5 arms. The first three share one construction; the structural control is its own.
ARM_SPECS: dict[str, HostSpec] = {
    "standard": HostSpec(BlockSpec("softmax", False, True, True), encoding="additive",
                         tokenizer_bias=True),
    "oa_only": HostSpec(BlockSpec("oattention", False, True, True), encoding="additive",
                        tokenizer_bias=True),
    "otransformer": HostSpec(BlockSpec("oattention", True, True, True), encoding="oinject",
                             tokenizer_bias=True),
    "structural_control": HostSpec(BlockSpec("oattention", True, False, False), encoding="none",
                                   tokenizer_bias=True),
}


class FTHost(nn.Module):
    """FT-style host: sequence ``[features (F), CLS, zeros (k)]`` -> encoding -> blocks ->
    LayerNorm, ReLU, linear head on the CLS state.

    Exact zero tokens are appended after the ordinary feature and CLS carriers (so old tokens keep
    their positions), after tokenisation and before the position encoding (B.3, B.6).
    """

    def __init__(self, spec: HostSpec, n_features: int, n_outputs: int) -> None:
        super().__init__()
        d = spec.d_model
        self.spec = spec
        self.tokenizer = FeatureTokenizer(n_features, d, spec.tokenizer_bias)
        self.cls = nn.Parameter(torch.empty(d).uniform_(-1 / math.sqrt(d), 1 / math.sqrt(d)))
        n_positions = n_features + 1 + spec.max_inserted
        self.position = (nn.Parameter(torch.empty(n_positions, d).uniform_(
            -1 / math.sqrt(d), 1 / math.sqrt(d))) if spec.encoding != "none" else None)
        self.inject = OInject(spec.tau) if spec.encoding == "oinject" else None
        if spec.encoding not in ("none", "additive", "oinject"):
            raise ValueError(f"encoding must be none, additive or oinject, got {spec.encoding!r}")
        self.blocks = nn.ModuleList(build_block(spec.block, d, spec.n_heads, spec.d_ff, spec.tau,
                                                spec.eps) for _ in range(spec.n_blocks))
        self.head_norm = nn.LayerNorm(d, elementwise_affine=spec.block.affine_norm)
        self.head = nn.Linear(d, n_outputs)

    def states(self, x: Tensor, n_zero: int = 0) -> list[Tensor]:
        """Token states ``(B, F + 1 + n_zero, d)`` after encoding and after each block."""
        if n_zero > self.spec.max_inserted:
            raise ValueError(f"n_zero={n_zero} exceeds the host's max_inserted="
                             f"{self.spec.max_inserted}; build the host with a larger max_inserted")
        tokens = self.tokenizer(x)                                            # (B, F, d)
        b, _, d = tokens.shape
        h = torch.cat([tokens, self.cls.expand(b, 1, d), tokens.new_zeros(b, n_zero, d)], dim=1)
        if self.position is not None:
            e = self.position[: h.shape[1]]                                   # (N, d)
            h = self.inject(h, e) if self.inject is not None else h + e
        out = [h]
        for block in self.blocks:
            h = block(h)
            out.append(h)
        return out

    def readout(self, h: Tensor) -> Tensor:
        """Head on the CLS state: h ``(B, N, d)`` -> ``(B, n_outputs)``."""
        cls = h[:, self.tokenizer.weight.shape[0]]                            # (B, d)
        return self.head(F.relu(self.head_norm(cls)))

    def forward(self, x: Tensor, n_zero: int = 0) -> Tensor:
        return self.readout(self.states(x, n_zero)[-1])


def build_host(spec: HostSpec, n_features: int, n_outputs: int, seed: int,
               zero_columns: int = 0) -> FTHost:
    """An FTHost built under ``torch.manual_seed(seed)``.

    With ``zero_columns`` = k > 0 (the last k input columns are exact zeros), every parameter is
    copied from the host built for the ``n_features - k`` real columns, into the leading slice of
    its counterpart; only the k extra tokenizer rows keep their own draws. Every k then starts
    from the same state for all it shares with k = 0 (Table 10's matched initial states).
    """
    torch.manual_seed(seed)
    host = FTHost(spec, n_features, n_outputs)
    if zero_columns:
        torch.manual_seed(seed)
        real = FTHost(spec, n_features - zero_columns, n_outputs).state_dict()
        with torch.no_grad():
            for name, tensor in host.state_dict().items():
                tensor[tuple(slice(0, n) for n in real[name].shape)].copy_(real[name])
    return host


class ScalarAdapter(nn.Module):
    """Table 8 adapter: ``h_j = z_j w_j`` (no bias), h + Attention(h), mean over feature tokens,
    linear task head. ``attention`` is "softmax" or "oattention" (hidden-carrier, τ)."""

    def __init__(self, n_features: int, n_outputs: int, attention: str, d_model: int = 64,
                 n_heads: int = 4, tau: float = 1e-6, eps: float = 1e-6) -> None:
        super().__init__()
        self.tokenizer = FeatureTokenizer(n_features, d_model, bias=False)
        oa = HiddenCarrierOAttention(d_model, n_heads, tau=tau, eps=eps)
        if attention not in ("softmax", "oattention"):
            raise ValueError(f"attention must be 'softmax' or 'oattention', got {attention!r}")
        self.attn = SoftmaxAttention.sharing(oa) if attention == "softmax" else oa
        self.head = nn.Linear(d_model, n_outputs)

    def forward(self, x: Tensor) -> Tensor:
        h = self.tokenizer(x)                                                 # (B, F, d)
        h = h + self.attn(h)[0]
        return self.head(h.mean(dim=1))
