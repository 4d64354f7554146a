"""The fused Triton OAttention kernels (forward, dq, dk/dv); their per-head-dim configurations are
:mod:`oretrofit._kernels.triton_configs`, the launcher and autograd :mod:`oretrofit._kernels.triton`.

q, k and v stay in their dtype (bf16, fp16; fp32 and fp64 too, for the tests); the softmax
statistics are fp32. With ``t_ij = s_ij + b_ij + log p_j`` (``s_ij = scale·q_i·k_j``, or
``c·tanh(scale·q_i·k_j / c)`` with a softcap ``c``; ``b_ij`` the caller's finite bias;
``log p_j`` the host's fp32 key logits, which the dk/dv kernel, dividing by p_j, takes
from p_k once per key block instead; a masked or null source gets ``_NULL_LOGIT``), the
forward keeps per query row a running maximum ``m_i`` and sum ``l_i`` that *start as the ε
sink* (``m_i = log ε``, ``l_i = 1``: the sink is a key of score ``log ε`` and value 0), so
that after the last key block

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
presence row dot ``dO_i·Σ_j δ_ij W_ij v_j = Σ_j δ_ij W_ij (dO_i·v_j)``, summed from the ``dO·vᵀ``
tile dS needs anyway (no matmul of its own, no division by ``p_i``: exact for null receivers);
the dk/dv kernel (one per key block and KV head, looping over the heads of its group: GQA
without repeated k/v) works on key-row tiles ``(BN, BM)`` so that its products need no
transposes, and stores ``Σ_i dS_ij / p_j`` (0 where ``p_j = 0``) per query head for presences
per query head, else summed over the group's heads.

Causal (``CAUSAL``): key j is visible to query i iff ``j ≤ i + Nk − Nq`` (bottom-right aligned,
as with a KV cache), on top of any mask and bias. Each program loops first over the tiles every
row of its block sees in full (no key masks, no predicates), then over the tiles that need the
masks (a ragged last tile, the causal diagonal); tiles no row of the block sees are skipped.

Masks: ``visible`` (bool) and ``bias`` (float) are read tile by tile through broadcast strides
(stride 0 on a broadcast axis), so a ``(B, 1, 1, Nk)`` padding mask costs one row per tile and no
``(Nq, Nk)`` tensor is built for it. An absent mask and its strides are ``None`` (constexprs
for Triton: the mask-free kernels take no mask arguments).

``TRITON_INTERPRET=1`` runs these kernels on CPU tensors (the tests). Triton's interpreter
computes bf16 matrix products wrongly (numpy has no bf16), so under it the tiles are upcast to
fp32 before ``tl.dot`` (the only difference from the GPU code); P and dS are still rounded to
q's dtype before their products (:func:`_operand`), so the tests see the half-precision error
the compiled kernel makes.
"""

from __future__ import annotations

import triton
import triton.language as tl

from .lse import _NULL_LOGIT

# A launch's grid: axis 1 (batch × heads) is CUDA's y axis; offsets within one (batch, head)
# slice are int32 in the kernels, the batch and head offsets int64.
GRID_Y_LIMIT = 65_535
# The kernels' scores are in base 2 (``exp2``, log2 e folded into the scale); LSE stays natural.
LOG2E = tl.constexpr(1.4426950408889634)
LN2 = tl.constexpr(0.6931471805599453)
INT32_LIMIT = 2**31
# The score of a masked or null key (p_j = 0): the host paths' null logit.
NULL_LOGIT = tl.constexpr(_NULL_LOGIT)


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
def _mask_rows(VIS, BIAS, b, h, m_idx, smb, smh, smq, sbb, sbh, sbq, HAS_VIS: tl.constexpr,
               HAS_BIAS: tl.constexpr):
    """Pointers to head ``h``'s mask and bias rows of queries ``m_idx`` (an absent one stays
    ``None``)."""
    vis_row, bias_row = VIS, BIAS
    if HAS_VIS:
        vis_row = VIS + b * smb + h * smh + m_idx * smq
    if HAS_BIAS:
        bias_row = BIAS + b * sbb + h * sbh + m_idx * sbq
    return vis_row, bias_row


@triton.jit
def _presence_row(PK, b, h, hk, spkb, spkh, PK_PER_HEAD: tl.constexpr):
    """Pointer to the key presences (or their logits, laid out alike) of query head ``h``: its
    own row (``PK_PER_HEAD``), else its KV head's (a ``(B, Nk)`` p_k has head stride 0)."""
    if PK_PER_HEAD:
        return PK + b * spkb + h * spkh
    return PK + b * spkb + hk * spkh


@triton.jit
def _key_logits(pk_row, n_idx, spkn, NK):
    """``(p_j, log2 p_j)`` of keys ``n_idx`` in fp32, ``NULL_LOGIT`` where ``p_j = 0`` or past
    ``NK``; NaN stays NaN (the dk/dv kernel's, once per key block: it divides by p_j)."""
    pk = tl.load(pk_row + n_idx * spkn, mask=n_idx < NK, other=0.0).to(tl.float32)
    return pk, tl.maximum(tl.log2(pk), NULL_LOGIT, propagate_nan=tl.PropagateNan.ALL)


@triton.jit
def _logp_tile(logp_row, n_idx, slpn, NK, MASKED: tl.constexpr):
    """The host's key logits ``log2 p_j`` of keys ``n_idx``, ``NULL_LOGIT`` past ``NK``
    (``MASKED``): a load, no logarithm in the forward's and dq's inner loops."""
    if MASKED:
        return tl.load(logp_row + n_idx * slpn, mask=n_idx < NK, other=NULL_LOGIT)
    return tl.load(logp_row + n_idx * slpn)


@triton.jit
def _tile(PTR, idx, d_idx, sn, sd, N, D: tl.constexpr, BD: tl.constexpr, MASKED: tl.constexpr,
          UPCAST: tl.constexpr):
    """Rows ``idx`` × head columns of the q, k, v, out or dO head at ``PTR``, ``(len(idx), BD)``
    zero-filled past ``N`` rows (``MASKED``) and ``D`` columns; fp32 under ``UPCAST``. A tile of
    whole rows at a power-of-two head dim is an unmasked load (no predicates in the loop)."""
    ptrs = PTR + idx[:, None] * sn + d_idx[None, :] * sd
    if MASKED:
        if D < BD:
            x = tl.load(ptrs, mask=(idx[:, None] < N) & (d_idx[None, :] < D), other=0.0)
        else:
            x = tl.load(ptrs, mask=idx[:, None] < N, other=0.0)
    elif D < BD:
        x = tl.load(ptrs, mask=d_idx[None, :] < D, other=0.0)
    else:
        x = tl.load(ptrs)
    if UPCAST:
        x = x.to(tl.float32)
    return x


@triton.jit
def _tile_scores(q, k, m_idx, n_idx, logp, vis_row, bias_row, NQ, NK, scale, softcap, smk,
                 sbk, HAS_VIS: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
                 IEEE: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
                 KEY_ROWS: tl.constexpr):
    """``(t, tanh)`` of queries ``m_idx`` × keys ``n_idx`` (k their ``(BN, BD)`` rows):
    ``t = (s + b)·log2 e + log2 p_j`` in base 2 for ``exp2`` (``logp``: :func:`_logp_tile` or :func:`_key_logits`;
    masked keys at about ``NULL_LOGIT``), ``tanh = s / c`` under a softcap, both fp32 ``(BM, BN)``, or
    ``(BN, BM)`` with ``KEY_ROWS`` (the dk/dv kernel's orientation, whose products then need no
    transposes). ``MASKED``: the tile may hold keys past ``NK`` or, under ``CAUSAL``, keys
    ``j > i + NK − NQ``; without it every key of the tile exists and every row sees it."""
    if KEY_ROWS:
        raw = _dot(k, tl.trans(q), IEEE) * (scale * LOG2E)
    else:
        raw = _dot(q, tl.trans(k), IEEE) * (scale * LOG2E)
    s = raw
    tanh = raw
    if HAS_SOFTCAP:
        cap = softcap * LOG2E
        tanh = 2.0 * tl.sigmoid(2.0 * raw / cap) - 1.0                    # tanh(raw / c)
        s = cap * tanh
    # A padded key has k = 0, so s = 0, bias 0 and log p = NULL_LOGIT: no select.
    queries, keys = _axes(m_idx, n_idx, KEY_ROWS)
    if MASKED:
        ok = (queries < NQ) & (keys < NK)
    else:
        ok = (queries < NQ) & (keys >= 0)
    t = s + _axes(logp, logp, KEY_ROWS)[1]
    if HAS_BIAS:
        t += tl.load(_axes(bias_row, n_idx, KEY_ROWS)[0] + keys * sbk, mask=ok,
                     other=0.0).to(tl.float32) * LOG2E
    if HAS_VIS:
        vis = tl.load(_axes(vis_row, n_idx, KEY_ROWS)[0] + keys * smk, mask=ok, other=0)
        t = tl.where(vis != 0, t, NULL_LOGIT)
    if CAUSAL:
        if MASKED:
            t = tl.where(keys <= queries + (NK - NQ), t, NULL_LOGIT)
    return t, tanh


@triton.jit
def _axes(per_query, per_key, KEY_ROWS: tl.constexpr):
    """``(per_query, per_key)`` expanded to broadcast over a score tile: queries on its rows
    and keys on its columns, or the other way round with ``KEY_ROWS``."""
    if KEY_ROWS:
        queries, keys = per_query[None, :], per_key[:, None]
    else:
        queries, keys = per_query[:, None], per_key[None, :]
    return queries, keys


@triton.jit
def _keep_scale(seed, bh, m_idx, n_idx, NQ, NK, dropout_p, HAS_DROPOUT: tl.constexpr,
                KEY_ROWS: tl.constexpr):
    """δ of a tile (oriented as :func:`_tile_scores`): ``ξ / (1 − dropout_p)`` with
    ``ξ ~ Bernoulli(1 − dropout_p)`` from Philox at offset ``(bh·Nq + i)·Nk + j`` (the same
    numbers in the forward and the backward)."""
    if HAS_DROPOUT:
        queries, keys = _axes(m_idx.to(tl.int64), n_idx, KEY_ROWS)
        offsets = (bh.to(tl.int64) * NQ + queries) * NK + keys
        keep = tl.rand(seed, offsets) >= dropout_p
        return tl.where(keep, 1.0 / (1.0 - dropout_p), 0.0)
    return 1.0


@triton.jit
def _query_block(bh, H, GROUP, BM: tl.constexpr, BD: tl.constexpr):
    """``(b, h, hk, m_idx, d_idx)`` of this program's query block: batch, query head, its KV
    head, the query rows and the head columns."""
    b, h = bh // H, bh % H
    return b, h, h // GROUP, tl.program_id(0) * BM + tl.arange(0, BM), tl.arange(0, BD)


@triton.jit
def _key_tiles(m_start, NQ, NK, BM: tl.constexpr, BN: tl.constexpr, CAUSAL: tl.constexpr,
               PART: tl.constexpr):
    """The keys ``[lo, hi)`` of ``PART`` 0 or 1 for the query block of rows
    ``m_start…m_start+BM``: part 0 the whole tiles every row sees (no key masks), part 1 the
    tiles that need them; under ``CAUSAL`` (key j visible to row i iff ``j ≤ i + NK − NQ``)
    the keys past part 1 are visible to no row of the block, and their tiles are skipped."""
    if CAUSAL:
        end = tl.minimum(NK, tl.maximum(m_start + BM + NK - NQ, 0))
        full = tl.maximum(tl.minimum(NK, m_start + 1 + NK - NQ), 0) // BN * BN
    else:
        end = NK
        full = NK // BN * BN
    if PART == 0:
        lo, hi = 0, full
    else:
        lo, hi = full, end
    return lo, hi


@triton.jit
def _query_tiles(n_start, NQ, NK, BM: tl.constexpr, BN: tl.constexpr, CAUSAL: tl.constexpr,
                 PART: tl.constexpr):
    """The queries ``[lo, hi)`` of ``PART`` 0 or 1 for the key block ``n_start…n_start+BN``:
    part 0 the query tiles that see only some of the block (key masks), part 1 those that see
    all of it (none; a block past ``NK`` has none such); under ``CAUSAL`` the query tiles before
    part 0 see no key of the block and are skipped."""
    nq_end = (NQ + BM - 1) // BM * BM
    if CAUSAL:
        first = tl.maximum(n_start - (NK - NQ), 0) // BM * BM
        full = (tl.maximum(n_start + BN - 1 - (NK - NQ), 0) + BM - 1) // BM * BM
    else:
        first = 0
        full = 0
    full = tl.where(n_start + BN <= NK, full, nq_end)
    if PART == 0:
        lo, hi = first, full
    else:
        lo, hi = full, NQ
    return lo, hi


@triton.jit
def _forward_tile(m_i, l_i, acc, q, Q, K_head, V_head, start, m_idx, d_idx, logp_row, vis_row,
                  bias_row, skn, skd, svn, svd, slpn, smk, sbk, NQ, NK, scale, softcap, dropout_p, seed,
                  bh, HAS_VIS: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
                  HAS_DROPOUT: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr,
                  MASKED: tl.constexpr, CAUSAL: tl.constexpr, BN: tl.constexpr, D: tl.constexpr,
                  BD: tl.constexpr):
    """The online-softmax state ``(m_i, l_i, acc)`` after the key tile at ``start``."""
    n_idx = start + tl.arange(0, BN)
    k = _tile(K_head, n_idx, d_idx, skn, skd, NK, D, BD, MASKED, UPCAST)
    logp = _logp_tile(logp_row, n_idx, slpn, NK, MASKED)
    t, _ = _tile_scores(q, k, m_idx, n_idx, logp, vis_row, bias_row, NQ, NK, scale, softcap,
                        smk, sbk, HAS_VIS, HAS_BIAS, HAS_SOFTCAP, IEEE, MASKED, CAUSAL, False)
    m_new = tl.maximum(m_i, tl.max(t, 1))
    alpha = tl.exp2(m_i - m_new)
    w = tl.exp2(t - m_new[:, None])
    l_i = l_i * alpha + tl.sum(w, 1)
    w = w * _keep_scale(seed, bh, m_idx, n_idx, NQ, NK, dropout_p, HAS_DROPOUT, False)
    v = _tile(V_head, n_idx, d_idx, svn, svd, NK, D, BD, MASKED, UPCAST)
    acc = acc * alpha[:, None] + _dot(_rounded(w, Q, UPCAST).to(v.dtype), v, IEEE)
    return m_new, l_i, acc


@triton.jit
def _forward_kernel(Q, K, V, LOGP, VIS, BIAS, PQ, OUT, LSE,
                    sqb, sqh, sqn, sqd, skb, skh, skn, skd, svb, svh, svn, svd,
                    slpb, slph, slpn, smb, smh, smq, smk, sbb, sbh, sbq, sbk, spb, sph, spn,
                    sob, soh, son, sod,
                    H, GROUP, NQ, NK, D: tl.constexpr, scale, log_eps, softcap, dropout_p, seed,
                    HAS_VIS: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
                    HAS_DROPOUT: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr,
                    CAUSAL: tl.constexpr, PK_PER_HEAD: tl.constexpr, BM: tl.constexpr,
                    BN: tl.constexpr, BD: tl.constexpr):
    bh = tl.program_id(1).to(tl.int64)                                   # see _check_limits
    b, h, hk, m_idx, d_idx = _query_block(bh, H, GROUP, BM, BD)
    m_ok = m_idx < NQ
    q = _tile(Q + b * sqb + h * sqh, m_idx, d_idx, sqn, sqd, NQ, D, BD, True, UPCAST)
    logp_row = _presence_row(LOGP, b, h, hk, slpb, slph, PK_PER_HEAD)
    vis_row, bias_row = _mask_rows(VIS, BIAS, b, h, m_idx, smb, smh, smq, sbb, sbh, sbq, HAS_VIS,
                                   HAS_BIAS)
    k_head, v_head = K + b * skb + hk * skh, V + b * svb + hk * svh
    m_i = tl.zeros([BM], dtype=tl.float32) + log_eps                     # the ε sink
    l_i = tl.zeros([BM], dtype=tl.float32) + 1.0
    acc = tl.zeros([BM, BD], dtype=tl.float32)
    for part in tl.static_range(2):                        # the unmasked tiles, then the others
        lo, hi = _key_tiles(tl.program_id(0) * BM, NQ, NK, BM, BN, CAUSAL, part)
        for start in range(lo, hi, BN):
            m_i, l_i, acc = _forward_tile(
                m_i, l_i, acc, q, Q, k_head, v_head, start, m_idx, d_idx, logp_row, vis_row,
                bias_row, skn, skd, svn, svd, slpn, smk, sbk, NQ, NK, scale, softcap, dropout_p, seed,
                bh, HAS_VIS, HAS_BIAS, HAS_SOFTCAP, HAS_DROPOUT, UPCAST, IEEE, part == 1, CAUSAL,
                BN, D, BD)
    p_i = tl.load(PQ + b * spb + h * sph + m_idx * spn, mask=m_ok, other=0.0).to(tl.float32)
    out = acc * (p_i / l_i)[:, None]
    tl.store(OUT + b * sob + h * soh + m_idx[:, None] * son + d_idx[None, :] * sod,
             _stored(out, OUT, UPCAST), mask=m_ok[:, None] & (d_idx < D)[None, :])
    tl.store(LSE + bh * NQ + m_idx, m_i * LN2 + tl.log(l_i), mask=m_ok)


@triton.jit
def _dq_tile(dq, rowdot, q, d_o, lse, delta, p_i, Q, K_head, V_head, start, m_idx, d_idx,
             logp_row, vis_row, bias_row, skn, skd, svn, svd, slpn, smk, sbk, NQ, NK, scale,
             softcap, dropout_p, seed, bh, HAS_VIS: tl.constexpr, HAS_BIAS: tl.constexpr,
             HAS_SOFTCAP: tl.constexpr, HAS_DROPOUT: tl.constexpr, NEED_ROWDOT: tl.constexpr,
             UPCAST: tl.constexpr, IEEE: tl.constexpr, MASKED: tl.constexpr,
             CAUSAL: tl.constexpr, BN: tl.constexpr, D: tl.constexpr, BD: tl.constexpr):
    """``(dq, rowdot)`` after the key tile at ``start``: ``dq += dS′·k`` and the row dot
    ``dO_i·Σ_j δ W v_j = Σ_j δ_ij W_ij (dO_i·v_j)`` from the ``dO·vᵀ`` tile dS needs anyway."""
    n_idx = start + tl.arange(0, BN)
    k = _tile(K_head, n_idx, d_idx, skn, skd, NK, D, BD, MASKED, UPCAST)
    v = _tile(V_head, n_idx, d_idx, svn, svd, NK, D, BD, MASKED, UPCAST)
    logp = _logp_tile(logp_row, n_idx, slpn, NK, MASKED)
    t, tanh = _tile_scores(q, k, m_idx, n_idx, logp, vis_row, bias_row, NQ, NK, scale,
                           softcap, smk, sbk, HAS_VIS, HAS_BIAS, HAS_SOFTCAP, IEEE, MASKED,
                           CAUSAL, False)
    w = tl.exp2(t - lse[:, None] * LOG2E)
    kept = w * _keep_scale(seed, bh, m_idx, n_idx, NQ, NK, dropout_p, HAS_DROPOUT, False)
    dov = _dot(d_o, tl.trans(v), IEEE)
    ds = p_i[:, None] * kept * dov - w * delta[:, None]
    if NEED_ROWDOT:
        rowdot += tl.sum(kept * dov, 1)
    if HAS_SOFTCAP:
        ds = ds * (1.0 - tanh * tanh)
    dq += _dot(_rounded(ds, Q, UPCAST).to(k.dtype), k, IEEE)
    return dq, rowdot


@triton.jit
def _backward_dq_kernel(Q, K, V, LOGP, VIS, BIAS, PQ, OUT, DO, LSE, DELTA, DQ, ROWDOT,
                        sqb, sqh, sqn, sqd, skb, skh, skn, skd, svb, svh, svn, svd,
                        slpb, slph, slpn, smb, smh, smq, smk, sbb, sbh, sbq, sbk, spb, sph, spn,
                        H, GROUP, NQ, NK, D: tl.constexpr, scale, softcap, dropout_p, seed,
                        HAS_VIS: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
                        HAS_DROPOUT: tl.constexpr, NEED_ROWDOT: tl.constexpr,
                        UPCAST: tl.constexpr, IEEE: tl.constexpr, CAUSAL: tl.constexpr,
                        PK_PER_HEAD: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                        BD: tl.constexpr):
    """dq, ``D_i = dO_i·out_i`` and (``NEED_ROWDOT``) ``dO_i·Σ_j δ W v`` of one query block.
    OUT, DO and DQ are laid out like q (its strides ``sq*``)."""
    bh = tl.program_id(1).to(tl.int64)                                   # see _check_limits
    b, h, hk, m_idx, d_idx = _query_block(bh, H, GROUP, BM, BD)
    m_ok = m_idx < NQ
    head = b * sqb + h * sqh
    q = _tile(Q + head, m_idx, d_idx, sqn, sqd, NQ, D, BD, True, UPCAST)
    d_o = _tile(DO + head, m_idx, d_idx, sqn, sqd, NQ, D, BD, True, UPCAST)
    out = _tile(OUT + head, m_idx, d_idx, sqn, sqd, NQ, D, BD, True, False)
    delta = tl.sum(d_o.to(tl.float32) * out.to(tl.float32), 1)
    tl.store(DELTA + bh * NQ + m_idx, delta, mask=m_ok)
    lse = tl.load(LSE + bh * NQ + m_idx, mask=m_ok, other=1e30)
    p_i = tl.load(PQ + b * spb + h * sph + m_idx * spn, mask=m_ok, other=0.0).to(tl.float32)
    logp_row = _presence_row(LOGP, b, h, hk, slpb, slph, PK_PER_HEAD)
    vis_row, bias_row = _mask_rows(VIS, BIAS, b, h, m_idx, smb, smh, smq, sbb, sbh, sbq, HAS_VIS,
                                   HAS_BIAS)
    k_head, v_head = K + b * skb + hk * skh, V + b * svb + hk * svh
    dq = tl.zeros([BM, BD], dtype=tl.float32)
    rowdot = tl.zeros([BM], dtype=tl.float32)
    for part in tl.static_range(2):                        # the unmasked tiles, then the others
        lo, hi = _key_tiles(tl.program_id(0) * BM, NQ, NK, BM, BN, CAUSAL, part)
        for start in range(lo, hi, BN):
            dq, rowdot = _dq_tile(
                dq, rowdot, q, d_o, lse, delta, p_i, Q, k_head, v_head, start, m_idx, d_idx,
                logp_row, vis_row, bias_row, skn, skd, svn, svd, slpn, smk, sbk, NQ, NK, scale,
                softcap, dropout_p, seed, bh, HAS_VIS, HAS_BIAS, HAS_SOFTCAP, HAS_DROPOUT,
                NEED_ROWDOT, UPCAST, IEEE, part == 1, CAUSAL, BN, D, BD)
    row_mask = m_ok[:, None] & (d_idx < D)[None, :]
    tl.store(DQ + head + m_idx[:, None] * sqn + d_idx[None, :] * sqd,
             _stored(dq * scale, DQ, UPCAST), mask=row_mask)
    if NEED_ROWDOT:
        tl.store(ROWDOT + bh * NQ + m_idx, rowdot, mask=m_ok)


@triton.jit
def _dkdv_tile(dk, dv, colsum, k, v, Q, q_head, do_head, logp, vis_head, bias_head, pq_head,
               lse_head, delta_head, bh, start, n_idx, d_idx, sqn, sqd, smq, smk, sbq, sbk, spn,
               NQ, NK, scale, softcap, dropout_p, seed,
               HAS_VIS: tl.constexpr, HAS_BIAS: tl.constexpr, HAS_SOFTCAP: tl.constexpr,
               HAS_DROPOUT: tl.constexpr, NEED_COLSUM: tl.constexpr, UPCAST: tl.constexpr,
               IEEE: tl.constexpr, MASKED: tl.constexpr, CAUSAL: tl.constexpr,
               BM: tl.constexpr, D: tl.constexpr, BD: tl.constexpr):
    """``(dk, dv, colsum)`` after the query tile at ``start`` of the query head whose q, dO,
    mask and bias rows, presences, LSE and D start at the ``*_head`` pointers (``logp``: the
    block's :func:`_key_logits`)."""
    m_idx = start + tl.arange(0, BM)
    m_ok = m_idx < NQ
    q = _tile(q_head, m_idx, d_idx, sqn, sqd, NQ, D, BD, True, UPCAST)
    d_o = _tile(do_head, m_idx, d_idx, sqn, sqd, NQ, D, BD, True, UPCAST)
    vis_row, bias_row = _mask_rows(vis_head, bias_head, 0, 0, m_idx, 0, 0, smq, 0, 0, sbq,
                                   HAS_VIS, HAS_BIAS)
    t, tanh = _tile_scores(q, k, m_idx, n_idx, logp, vis_row, bias_row, NQ, NK, scale, softcap,
                           smk, sbk, HAS_VIS, HAS_BIAS, HAS_SOFTCAP, IEEE, MASKED, CAUSAL,
                           True)                                                 # (BN, BM)
    lse = tl.load(lse_head + m_idx, mask=m_ok, other=1e30)
    delta = tl.load(delta_head + m_idx, mask=m_ok, other=0.0)
    p_i = tl.load(pq_head + m_idx * spn, mask=m_ok, other=0.0).to(tl.float32)
    w = tl.exp2(t - lse[None, :] * LOG2E)
    gated = w * (p_i[None, :] * _keep_scale(seed, bh, m_idx, n_idx, NQ, NK, dropout_p,
                                            HAS_DROPOUT, True))
    dov = _dot(v, tl.trans(d_o), IEEE)
    dv += _dot(_rounded(gated, Q, UPCAST).to(d_o.dtype), d_o, IEEE)
    ds = gated * dov - w * delta[None, :]
    if NEED_COLSUM:
        colsum += tl.sum(ds, 1)
    if HAS_SOFTCAP:
        ds = ds * (1.0 - tanh * tanh)
    dk += _dot(_rounded(ds, Q, UPCAST).to(q.dtype), q, IEEE)
    return dk, dv, colsum


@triton.jit
def _per_presence(colsum, pk):
    """``Σ_i dS_ij / p_j``, 0 where ``p_j = 0`` (a null source's ``Σ_i dS_ij`` is 0; NaN stays
    NaN)."""
    return tl.where(pk != 0, colsum / pk, 0.0)


@triton.jit
def _backward_dkdv_kernel(Q, K, V, PK, VIS, BIAS, PQ, DO, LSE, DELTA, DK, DV, COLSUM,
                          sqb, sqh, sqn, sqd, skb, skh, skn, skd, svb, svh, svn, svd,
                          spkb, spkh, spkn, smb, smh, smq, smk, sbb, sbh, sbq, sbk, spb, sph, spn,
                          H, GROUP, NQ, NK, D: tl.constexpr, scale, softcap, dropout_p, seed,
                          HAS_VIS: tl.constexpr, HAS_BIAS: tl.constexpr,
                          HAS_SOFTCAP: tl.constexpr, HAS_DROPOUT: tl.constexpr,
                          NEED_COLSUM: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr,
                          CAUSAL: tl.constexpr, PK_PER_HEAD: tl.constexpr, BM: tl.constexpr,
                          BN: tl.constexpr, BD: tl.constexpr):
    """dk, dv of one key block of one KV head (summed over its group of query heads) and
    ``∂/∂p_j = Σ_i dS_ij / p_j`` (0 where ``p_j = 0``): per query head (``PK_PER_HEAD``, COLSUM
    ``(B, H, Nk)``), else summed over the group (``(B, H / GROUP, Nk)``). DO is laid out like
    q; DK, DV like k."""
    pid_n, bhk = tl.program_id(0), tl.program_id(1).to(tl.int64)
    HK = H // GROUP
    b, hk = bhk // HK, bhk % HK
    n_idx = pid_n * BN + tl.arange(0, BN)
    d_idx = tl.arange(0, BD)
    k = _tile(K + b * skb + hk * skh, n_idx, d_idx, skn, skd, NK, D, BD, True, UPCAST)
    v = _tile(V + b * svb + hk * svh, n_idx, d_idx, svn, svd, NK, D, BD, True, UPCAST)
    dk = tl.zeros([BN, BD], dtype=tl.float32)
    dv = tl.zeros([BN, BD], dtype=tl.float32)
    pk, logp = _key_logits(_presence_row(PK, b, hk, hk, spkb, spkh, False), n_idx, spkn, NK)
    colsum = tl.zeros([BN], dtype=tl.float32)
    for g in range(0, GROUP):
        h = hk * GROUP + g
        bh = b * H + h
        q_head, do_head = Q + b * sqb + h * sqh, DO + b * sqb + h * sqh
        if PK_PER_HEAD:
            pk, logp = _key_logits(_presence_row(PK, b, h, hk, spkb, spkh, True), n_idx, spkn,
                                   NK)
            colsum = tl.zeros([BN], dtype=tl.float32)
        vis_head, bias_head = _mask_rows(VIS, BIAS, b, h, 0, smb, smh, smq, sbb, sbh, sbq,
                                         HAS_VIS, HAS_BIAS)
        lse_head, delta_head, pq_head = LSE + bh * NQ, DELTA + bh * NQ, PQ + b * spb + h * sph
        for part in tl.static_range(2):                     # the masked tiles, then the others
            lo, hi = _query_tiles(pid_n * BN, NQ, NK, BM, BN, CAUSAL, part)
            for start in range(lo, hi, BM):
                dk, dv, colsum = _dkdv_tile(
                    dk, dv, colsum, k, v, Q, q_head, do_head, logp, vis_head, bias_head,
                    pq_head, lse_head, delta_head, bh, start, n_idx, d_idx, sqn, sqd, smq, smk,
                    sbq, sbk, spn, NQ, NK, scale, softcap, dropout_p, seed, HAS_VIS, HAS_BIAS,
                    HAS_SOFTCAP, HAS_DROPOUT, NEED_COLSUM, UPCAST, IEEE, part == 0, CAUSAL, BM,
                    D, BD)
        if NEED_COLSUM and PK_PER_HEAD:
            tl.store(COLSUM + bh * NK + n_idx, _per_presence(colsum, pk), mask=n_idx < NK)
    if NEED_COLSUM and not PK_PER_HEAD:
        tl.store(COLSUM + bhk * NK + n_idx, _per_presence(colsum, pk), mask=n_idx < NK)
    key_mask = (n_idx < NK)[:, None] & (d_idx < D)[None, :]
    k_rows = n_idx[:, None] * skn + d_idx[None, :] * skd
    tl.store(DK + b * skb + hk * skh + k_rows, _stored(dk * scale, DK, UPCAST), mask=key_mask)
    tl.store(DV + b * skb + hk * skh + k_rows, _stored(dv, DV, UPCAST), mask=key_mask)


@triton.jit
def _dropout_kernel(KEEP, NQ, NK, dropout_p, seed, BN: tl.constexpr):
    bh, i = tl.program_id(0), tl.program_id(1)
    for start in range(0, NK, BN):
        n_idx = start + tl.arange(0, BN)
        m_idx = tl.zeros([1], dtype=tl.int32) + i
        keep = _keep_scale(seed, bh, m_idx, n_idx, NQ, NK, dropout_p, True, False)
        tl.store(KEEP + (bh * NQ + i) * NK + n_idx[None, :], keep, mask=n_idx[None, :] < NK)
