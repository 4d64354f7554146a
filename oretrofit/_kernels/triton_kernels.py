"""The fused Triton OAttention kernels (forward, dq, dk/dv) and their per-head-dim configurations;
the launcher and autograd are :mod:`oretrofit._kernels.triton`.

q, k and v stay in their dtype (bf16, fp16; fp32 and fp64 too, for the tests); the softmax
statistics are fp32. With ``t_ij = s_ij + b_ij + log p_j`` (``s_ij = scale·q_i·k_j``, or
``c·tanh(scale·q_i·k_j / c)`` with a softcap ``c``; ``b_ij`` the caller's finite bias; a masked or
null source gets ``_NULL_LOGIT``), the forward keeps per query row a running maximum ``m_i`` and
sum ``l_i`` that *start as the ε sink* (``m_i = log ε``, ``l_i = 1``: the sink is a key of score
``log ε`` and value 0), so that after the last key block

    l_i e^{m_i} = ε + Σ_j e^{t_ij},    acc_i e^{m_i} = Σ_j δ_ij e^{t_ij} v_j,
    out_i = p_i · acc_i / l_i,         lse_i = m_i + log l_i = log(ε + Z_i),

``δ_ij`` the attention-weight dropout (``ξ_ij / (1 − dropout_p)``, ``ξ`` from Philox on the
kernel's seed; 1 without dropout; ``log ε`` is ``sink_logit(ε)``, finite for ε = 0). Empty support
keeps ``m_i = log ε`` and every ``e^{t − m}`` is exactly 0: an exact zero row, with no special case. A null receiver (``p_i = 0``) emits an exact 0.

Backward, from the kernel's own quantities, with ``W_ij = e^{t_ij − lse_i}`` (eq. 6's weight):
``out_i = p_i Σ_j δ_ij W_ij v_j``, ``∂W_ij/∂t_il = W_ij (1[j=l] − W_il)`` (ε is a constant), so

    dS_ij = ∂loss/∂t_ij = W_ij (p_i δ_ij dO_i·v_j − D_i),     D_i = dO_i·out_i,
    dq_i = scale Σ_j dS′_ij k_j,   dk_j = scale Σ_i dS′_ij q_i,   dv_j = Σ_i p_i δ_ij W_ij dO_i,
    ∂/∂p_i = dO_i·Σ_j δ_ij W_ij v_j,     ∂/∂p_j = Σ_i dS_ij / p_j,

``dS′ = dS ⊙ (1 − (s/c)²)`` under a softcap (``dS`` without). No division by ``p_i`` appears, so
null receivers need no special case; a null source has ``W = 0`` and gradient 0, as on the
reference path. The dq kernel (one program per query block and head) also stores ``D`` and the
presence row-dot ``dO_i·o″_i``; the dk/dv kernel (one per key block and KV head, looping over the
heads of its group: GQA without repeated k/v) stores the column sums ``Σ_i dS_ij`` per query head.

Masks: ``visible`` (bool) and ``bias`` (float) are read tile by tile through broadcast strides
(stride 0 on a broadcast axis), so a ``(B, 1, 1, Nk)`` padding mask costs one row per tile and no
``(Nq, Nk)`` tensor is built for it.

``TRITON_INTERPRET=1`` runs these kernels on CPU tensors (the tests). Triton's interpreter
computes bf16 matrix products wrongly (numpy has no bf16), so under it the tiles are upcast to
fp32 before ``tl.dot`` (the only difference from the GPU code); P and dS are still rounded to
q's dtype before their products (:func:`_operand`), so the tests see the half-precision error
the compiled kernel makes.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import triton
import triton.language as tl

_INTERPRET = os.environ.get("TRITON_INTERPRET") == "1"
# A launch's grid: axis 1 (batch × heads) is CUDA's y axis; offsets within one (batch, head)
# slice are int32 in the kernels, the batch and head offsets int64.
GRID_Y_LIMIT = 65_535
# The kernels' scores are in base 2 (``exp2``, log2 e folded into the scale); LSE stays natural.
LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)
INT32_LIMIT = 2**31


@dataclass(frozen=True)
class KernelConfig:
    """One kernel's tile (``bm`` query rows × ``bn`` key columns) and launch settings."""

    bm: int
    bn: int
    warps: int = 4
    stages: int = 3


@dataclass(frozen=True)
class Configs:
    """The configurations of the forward, the dq and the dk/dv kernels for one head-dim bucket."""

    forward: KernelConfig
    dq: KernelConfig
    dkdv: KernelConfig


# Per padded head dim (``BD``), chosen by their static metrics on sm_90a (benchmarks/
# kernel_static.py, results/kernel_static.md): no register spills and at least two 4-warp
# CTAs (or one 8-warp CTA: two warpgroups) per SM within the 227 KB of shared memory a CTA may
# use. The forward at d ≤ 64 takes 128 query rows (half the K/V traffic of 64); at d = 128 a
# 128-row tile needs 202 registers a thread (one CTA per SM), so it keeps 64. The backward's
# dq/dk/dv accumulators are what spill at d = 128 on 4 warps: dq takes 64 × 64 and dk/dv 32 × 64
# on 8 warps (dk/dv on 4 warps spill under GQA, where the loop over the group's heads holds more
# live values; dq in 64 × 32 on 4 warps spills 40 B). At d = 256 the tiles shrink again to stay within shared memory.
_INTERPRETER_CONFIGS = Configs(*(KernelConfig(16, 16, 1, 1),) * 3)
_SMALL_HEADS = Configs(KernelConfig(128, 64, 8, 3), KernelConfig(64, 64, 4, 3),
                       KernelConfig(32, 64, 4, 3))
_CONFIGS: dict[int, Configs] = {
    16: _SMALL_HEADS, 32: _SMALL_HEADS, 64: _SMALL_HEADS,
    128: Configs(KernelConfig(64, 64, 4, 3), KernelConfig(64, 64, 8, 2),
                 KernelConfig(32, 64, 8, 2)),
    256: Configs(KernelConfig(64, 32, 4, 2), KernelConfig(32, 64, 8, 2),
                 KernelConfig(32, 64, 8, 2)),
}


def padded_head_dim(d: int) -> int:
    """``BD``: the head dim padded to a power of two of at least 16 (the kernels' tile width)."""
    return max(16, triton.next_power_of_2(d))


def configs_for(d: int) -> Configs:
    """The kernels' configurations at head dim ``d`` (ValueError above 256)."""
    if _INTERPRET:
        return _INTERPRETER_CONFIGS
    bd = padded_head_dim(d)
    if bd not in _CONFIGS:
        raise ValueError(f"the Triton OAttention kernels take head dims up to 256, not {d}; "
                         "use attn_precision='fp32' for this host")
    return _CONFIGS[bd]


@triton.jit
def _dot(a, b, IEEE: tl.constexpr):
    """``a @ b`` accumulated in fp32; ``IEEE``: full fp32 products (no TF32) for fp32 inputs."""
    if IEEE:
        return tl.dot(a, b, input_precision="ieee")
    return tl.dot(a, b)


@triton.jit
def _rounded(x, PTR, UPCAST: tl.constexpr):
    """``x`` (fp32) as the compiled kernel rounds it to ``PTR``'s element type (P and dS before
    ``tl.dot``, the outputs at their store), kept in fp32: under the interpreter (``UPCAST``)
    rounded here, bf16 to nearest even on the bits (the interpreter's bf16 cast truncates);
    compiled, ``x`` itself (the cast after it rounds)."""
    y = x
    if UPCAST:
        if PTR.dtype.element_ty == tl.bfloat16:
            bits = x.to(tl.uint32, bitcast=True)
            y = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).to(tl.float32, bitcast=True)
        else:
            y = x.to(PTR.dtype.element_ty).to(tl.float32)
    return y


@triton.jit
def _stored(x, PTR, UPCAST: tl.constexpr):
    """``x`` in ``PTR``'s element type, rounded to nearest as on the GPU (:func:`_rounded`)."""
    return _rounded(x, PTR, UPCAST).to(PTR.dtype.element_ty)


@triton.jit
def _row_pointers(LOGP, VIS, BIAS, b, h, m_idx, slb, slh, smb, smh, smq, sbb, sbh, sbq):
    """Pointers to head ``h``'s key logits and to the mask and bias rows of queries ``m_idx``."""
    return (LOGP + b * slb + h * slh, VIS + b * smb + h * smh + m_idx * smq,
            BIAS + b * sbb + h * sbh + m_idx * sbq)


@triton.jit
def _tile_scores(q, k_head, start, d_idx, d_ok, skn, skd, logp_row, vis_row, bias_row, m_idx,
                 m_ok, NK,
                 scale, softcap, smk, sbk, BN: tl.constexpr,
                 HAS_VIS: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
                 UPCAST: tl.constexpr, IEEE: tl.constexpr):
    """``(t, tanh, n_idx, n_ok)`` of the tile of queries ``m_idx`` × keys ``start…start+BN``
    of the KV head at ``k_head``: ``t = (s + b + log p_j)·log2 e`` in base 2 for ``exp2``
    (masked and padded keys at about ``_NULL_LOGIT``; the host gives ``log2 p_j``),
    ``tanh = s / c`` under a softcap, both fp32 ``(BM, BN)``; the row pointers as
    :func:`_row_pointers` gives them."""
    n_idx = start + tl.arange(0, BN)
    n_ok = n_idx < NK
    kt = tl.load(k_head + n_idx[None, :] * skn + d_idx[:, None] * skd,
                 mask=n_ok[None, :] & d_ok[:, None], other=0.0)              # (BD, BN)
    if UPCAST:
        kt = kt.to(tl.float32)
    raw = _dot(q, kt, IEEE) * (scale * LOG2E)
    s = raw
    tanh = raw
    if HAS_SOFTCAP:
        cap = softcap * LOG2E
        tanh = 2.0 * tl.sigmoid(2.0 * raw / cap) - 1.0                    # tanh(raw / c)
        s = cap * tanh
    # A padded key has k = 0, so s = 0, bias 0 and log p = -1e30: t = -1e30 with no select.
    logp = tl.load(logp_row + n_idx, mask=n_ok, other=-1e30)
    t = s + logp[None, :]
    ok = m_ok[:, None] & n_ok[None, :]
    if HAS_BIAS:
        t += tl.load(bias_row[:, None] + n_idx[None, :] * sbk, mask=ok,
                     other=0.0).to(tl.float32) * LOG2E
    if HAS_VIS:
        vis = tl.load(vis_row[:, None] + n_idx[None, :] * smk, mask=ok, other=0)
        t = tl.where(vis != 0, t, -1e30)
    return t, tanh, n_idx, n_ok


@triton.jit
def _keep_scale(seed, bh, m_idx, n_idx, NQ, NK, dropout_p, HAS_DROPOUT: tl.constexpr):
    """δ of a tile: ``ξ / (1 − dropout_p)`` with ``ξ ~ Bernoulli(1 − dropout_p)`` from Philox at
    offset ``(bh·Nq + i)·Nk + j`` (the same numbers in the forward and the backward)."""
    if HAS_DROPOUT:
        offsets = (bh.to(tl.int64) * NQ + m_idx[:, None].to(tl.int64)) * NK + n_idx[None, :]
        keep = tl.rand(seed, offsets) >= dropout_p
        return tl.where(keep, 1.0 / (1.0 - dropout_p), 0.0)
    return 1.0


@triton.jit
def _query_block(bh, H, GROUP, NQ, D, BM: tl.constexpr, BD: tl.constexpr):
    """``(b, h, hk, m_idx, d_idx, m_ok, d_ok)`` of this program's query block: batch, query
    head, its KV head, the query rows and head columns and which of them exist."""
    b, h = bh // H, bh % H
    m_idx = tl.program_id(0) * BM + tl.arange(0, BM)
    d_idx = tl.arange(0, BD)
    return b, h, h // GROUP, m_idx, d_idx, m_idx < NQ, d_idx < D


@triton.jit
def _forward_kernel(Q, K, V, LOGP, VIS, BIAS, PQ, OUT, LSE,
                    sqb, sqh, sqn, sqd, skb, skh, skn, skd, svb, svh, svn, svd,
                    slb, slh, sln, smb, smh, smq, smk, sbb, sbh, sbq, sbk, spb, sph, spn,
                    sob, soh, son, sod,
                    H, GROUP, NQ, NK, D, scale, log_eps, softcap, dropout_p, seed,
                    HAS_VIS: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
                    HAS_DROPOUT: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr,
                    BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr):
    bh = tl.program_id(1).to(tl.int64)                                   # see _check_limits
    b, h, hk, m_idx, d_idx, m_ok, d_ok = _query_block(bh, H, GROUP, NQ, D, BM, BD)
    q = tl.load(Q + b * sqb + h * sqh + m_idx[:, None] * sqn + d_idx[None, :] * sqd,
                mask=m_ok[:, None] & d_ok[None, :], other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    logp_row, vis_row, bias_row = _row_pointers(LOGP, VIS, BIAS, b, h, m_idx, slb, slh, smb, smh,
                                                smq, sbb, sbh, sbq)
    m_i = tl.zeros([BM], dtype=tl.float32) + log_eps                     # the ε sink
    l_i = tl.zeros([BM], dtype=tl.float32) + 1.0
    acc = tl.zeros([BM, BD], dtype=tl.float32)
    for start in range(0, NK, BN):
        t, tanh, n_idx, n_ok = _tile_scores(q, K + b * skb + hk * skh, start, d_idx, d_ok, skn, skd,
                                         logp_row, vis_row, bias_row, m_idx, m_ok, NK, scale,
                                         softcap, smk, sbk, BN,
                                         HAS_VIS, HAS_BIAS, HAS_SOFTCAP, UPCAST, IEEE)
        m_new = tl.maximum(m_i, tl.max(t, 1))
        alpha = tl.exp2(m_i - m_new)
        w = tl.exp2(t - m_new[:, None])
        l_i = l_i * alpha + tl.sum(w, 1)
        w = w * _keep_scale(seed, bh, m_idx, n_idx, NQ, NK, dropout_p, HAS_DROPOUT)
        v = tl.load(V + b * svb + hk * svh + n_idx[:, None] * svn + d_idx[None, :] * svd,
                    mask=n_ok[:, None] & d_ok[None, :], other=0.0)
        if UPCAST:
            v = v.to(tl.float32)
        acc = acc * alpha[:, None] + _dot(_rounded(w, Q, UPCAST).to(v.dtype), v, IEEE)
        m_i = m_new
    p_i = tl.load(PQ + b * spb + h * sph + m_idx * spn, mask=m_ok, other=0.0).to(tl.float32)
    out = acc * (p_i / l_i)[:, None]
    tl.store(OUT + b * sob + h * soh + m_idx[:, None] * son + d_idx[None, :] * sod,
             _stored(out, OUT, UPCAST), mask=m_ok[:, None] & d_ok[None, :])
    tl.store(LSE + bh * NQ + m_idx, m_i * LN2 + tl.log(l_i), mask=m_ok)


@triton.jit
def _backward_dq_kernel(Q, K, V, LOGP, VIS, BIAS, PQ, OUT, DO, LSE, DELTA, DQ, ROWDOT,
                        sqb, sqh, sqn, sqd, skb, skh, skn, skd, svb, svh, svn, svd,
                        slb, slh, sln, smb, smh, smq, smk, sbb, sbh, sbq, sbk, spb, sph, spn,
                        H, GROUP, NQ, NK, D, scale, softcap, dropout_p, seed,
                        HAS_VIS: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
                        HAS_DROPOUT: tl.constexpr, NEED_ROWDOT: tl.constexpr,
                        UPCAST: tl.constexpr, IEEE: tl.constexpr,
                        BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr):
    """dq, ``D_i = dO_i·out_i`` and (``NEED_ROWDOT``) ``dO_i·Σ_j δ W v`` of one query block.
    OUT, DO and DQ are laid out like q (its strides ``sq*``)."""
    bh = tl.program_id(1).to(tl.int64)                                   # see _check_limits
    b, h, hk, m_idx, d_idx, m_ok, d_ok = _query_block(bh, H, GROUP, NQ, D, BM, BD)
    rows = m_idx[:, None] * sqn + d_idx[None, :] * sqd
    row_mask = m_ok[:, None] & d_ok[None, :]
    q = tl.load(Q + b * sqb + h * sqh + rows, mask=row_mask, other=0.0)
    d_o = tl.load(DO + b * sqb + h * sqh + rows, mask=row_mask, other=0.0)
    out = tl.load(OUT + b * sqb + h * sqh + rows, mask=row_mask, other=0.0)
    delta = tl.sum(d_o.to(tl.float32) * out.to(tl.float32), 1)
    tl.store(DELTA + bh * NQ + m_idx, delta, mask=m_ok)
    if UPCAST:
        q, d_o = q.to(tl.float32), d_o.to(tl.float32)
    lse = tl.load(LSE + bh * NQ + m_idx, mask=m_ok, other=1e30)
    p_i = tl.load(PQ + b * spb + h * sph + m_idx * spn, mask=m_ok, other=0.0).to(tl.float32)
    logp_row, vis_row, bias_row = _row_pointers(LOGP, VIS, BIAS, b, h, m_idx, slb, slh, smb, smh,
                                                smq, sbb, sbh, sbq)
    dq = tl.zeros([BM, BD], dtype=tl.float32)
    o_free = tl.zeros([BM, BD], dtype=tl.float32)
    for start in range(0, NK, BN):
        t, tanh, n_idx, n_ok = _tile_scores(q, K + b * skb + hk * skh, start, d_idx, d_ok, skn, skd,
                                         logp_row, vis_row, bias_row, m_idx, m_ok, NK, scale,
                                         softcap, smk, sbk, BN,
                                         HAS_VIS, HAS_BIAS, HAS_SOFTCAP, UPCAST, IEEE)
        w = tl.exp2(t - lse[:, None] * LOG2E)
        delta_keep = _keep_scale(seed, bh, m_idx, n_idx, NQ, NK, dropout_p, HAS_DROPOUT)
        vt = tl.load(V + b * svb + hk * svh + n_idx[None, :] * svn + d_idx[:, None] * svd,
                     mask=n_ok[None, :] & d_ok[:, None], other=0.0)          # (BD, BN)
        k = tl.load(K + b * skb + hk * skh + n_idx[:, None] * skn + d_idx[None, :] * skd,
                    mask=n_ok[:, None] & d_ok[None, :], other=0.0)           # (BN, BD)
        if UPCAST:
            vt, k = vt.to(tl.float32), k.to(tl.float32)
        dov = _dot(d_o, vt, IEEE)
        ds = w * (p_i[:, None] * delta_keep * dov - delta[:, None])
        if HAS_SOFTCAP:
            ds = ds * (1.0 - tanh * tanh)
        dq += _dot(_rounded(ds, Q, UPCAST).to(k.dtype), k, IEEE)
        if NEED_ROWDOT:
            o_free += _dot(_rounded(w * delta_keep, Q, UPCAST).to(vt.dtype),
                           tl.trans(vt), IEEE)
    tl.store(DQ + b * sqb + h * sqh + rows, _stored(dq * scale, DQ, UPCAST), mask=row_mask)
    if NEED_ROWDOT:
        tl.store(ROWDOT + bh * NQ + m_idx, tl.sum(d_o.to(tl.float32) * o_free, 1), mask=m_ok)


@triton.jit
def _backward_dkdv_kernel(Q, K, V, LOGP, VIS, BIAS, PQ, DO, LSE, DELTA, DK, DV, COLSUM,
                          sqb, sqh, sqn, sqd, skb, skh, skn, skd, svb, svh, svn, svd,
                          slb, slh, sln, smb, smh, smq, smk, sbb, sbh, sbq, sbk, spb, sph, spn,
                          H, GROUP, NQ, NK, D, scale, softcap, dropout_p, seed,
                          HAS_VIS: tl.constexpr, HAS_BIAS: tl.constexpr,
                          HAS_SOFTCAP: tl.constexpr, HAS_DROPOUT: tl.constexpr,
                          NEED_COLSUM: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr,
                          BM: tl.constexpr, BN: tl.constexpr, BD: tl.constexpr):
    """dk, dv of one key block of one KV head (summed over its group of query heads) and the
    column sums ``Σ_i dS_ij`` per query head. DO is laid out like q; DK, DV like k."""
    pid_n, bhk = tl.program_id(0), tl.program_id(1).to(tl.int64)
    HK = H // GROUP
    b, hk = bhk // HK, bhk % HK
    n_idx = pid_n * BN + tl.arange(0, BN)
    d_idx = tl.arange(0, BD)
    n_ok, d_ok = n_idx < NK, d_idx < D
    key_mask = n_ok[:, None] & d_ok[None, :]
    vt = tl.load(V + b * svb + hk * svh + n_idx[None, :] * svn + d_idx[:, None] * svd,
                 mask=n_ok[None, :] & d_ok[:, None], other=0.0)              # (BD, BN)
    if UPCAST:
        vt = vt.to(tl.float32)
    dk = tl.zeros([BN, BD], dtype=tl.float32)
    dv = tl.zeros([BN, BD], dtype=tl.float32)
    for g in range(0, GROUP):
        h = hk * GROUP + g
        bh = b * H + h
        colsum = tl.zeros([BN], dtype=tl.float32)
        for start in range(0, NQ, BM):
            m_idx = start + tl.arange(0, BM)
            m_ok = m_idx < NQ
            rows = m_idx[:, None] * sqn + d_idx[None, :] * sqd
            row_mask = m_ok[:, None] & d_ok[None, :]
            q = tl.load(Q + b * sqb + h * sqh + rows, mask=row_mask, other=0.0)
            d_o = tl.load(DO + b * sqb + h * sqh + rows, mask=row_mask, other=0.0)
            if UPCAST:
                q, d_o = q.to(tl.float32), d_o.to(tl.float32)
            logp_row, vis_row, bias_row = _row_pointers(LOGP, VIS, BIAS, b, h, m_idx, slb, slh,
                                                        smb, smh, smq, sbb, sbh, sbq)
            t, tanh, _, _ = _tile_scores(q, K + b * skb + hk * skh, pid_n * BN, d_idx, d_ok, skn,
                                      skd, logp_row, vis_row, bias_row, m_idx, m_ok, NK, scale,
                                      softcap, smk, sbk, BN, HAS_VIS, HAS_BIAS, HAS_SOFTCAP,
                                      UPCAST, IEEE)
            lse = tl.load(LSE + bh * NQ + m_idx, mask=m_ok, other=1e30)
            delta = tl.load(DELTA + bh * NQ + m_idx, mask=m_ok, other=0.0)
            p_i = tl.load(PQ + b * spb + h * sph + m_idx * spn, mask=m_ok, other=0.0).to(tl.float32)
            w = tl.exp2(t - lse[:, None] * LOG2E)
            gated = w * (p_i[:, None] * _keep_scale(seed, bh, m_idx, n_idx, NQ, NK, dropout_p,
                                                    HAS_DROPOUT))
            dov = _dot(d_o, vt, IEEE)
            dv += _dot(tl.trans(_rounded(gated, Q, UPCAST).to(d_o.dtype)), d_o, IEEE)
            ds = gated * dov - w * delta[:, None]
            if NEED_COLSUM:
                colsum += tl.sum(ds, 0)
            if HAS_SOFTCAP:
                ds = ds * (1.0 - tanh * tanh)
            dk += _dot(tl.trans(_rounded(ds, Q, UPCAST).to(q.dtype)), q, IEEE)
        if NEED_COLSUM:
            tl.store(COLSUM + bh * NK + n_idx, colsum, mask=n_ok)
    k_rows = n_idx[:, None] * skn + d_idx[None, :] * skd
    tl.store(DK + b * skb + hk * skh + k_rows, _stored(dk * scale, DK, UPCAST), mask=key_mask)
    tl.store(DV + b * skb + hk * skh + k_rows, _stored(dv, DV, UPCAST), mask=key_mask)


@triton.jit
def _dropout_kernel(KEEP, NQ, NK, dropout_p, seed, BN: tl.constexpr):
    bh, i = tl.program_id(0), tl.program_id(1)
    for start in range(0, NK, BN):
        n_idx = start + tl.arange(0, BN)
        m_idx = tl.zeros([1], dtype=tl.int32) + i
        keep = _keep_scale(seed, bh, m_idx, n_idx, NQ, NK, dropout_p, True)
        tl.store(KEEP + (bh * NQ + i) * NK + n_idx[None, :], keep, mask=n_idx[None, :] < NK)
