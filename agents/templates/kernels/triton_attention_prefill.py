"""attention_prefill over the paged KV cache: varlen causal flash attention for chunked prefill and mixed batches.

One call serves what the serving engine batches: several sequences' prompt chunks, each over its cached
prefix, and decodes as one-token chunks. Grid (T // BLOCK_Q + B, Hk): sequence b's query blocks are the grid
rows cu[b] // BLOCK_Q + b onward (a program finds its sequence by a binary search over cu_seqlens_q, no host
sync: CUDA-graph safe); a block past its sequence's last query does no work. A program takes BLOCK_Q queries
of one sequence and the G query heads that share KV head hk (GQA: each K/V tile is read once for the group),
as BLOCK_Q * BLOCK_G rows of one tensor-core tile, and runs an online softmax over BLOCK_T-token key tiles
gathered through the block table, up to the block's last query position (causal: later keys are never read).
Query i of a sequence of n queries and context c sits at position c - n + i and sees keys 0..c - n + i.

Reads: q [T, Hq, Dh]; per query block, the sequence's K and V up to its position (ctx * Hk * (Dh + Dv)
elements per block row of the grid); writes out [T, Hq, Dv]. FLOPs: 2 * T * Hq * (Dh + Dv) * ctx / 2
(causal half) per chunk over its prefix, rounded up to whole BLOCK_Q x BLOCK_T tiles. The reference
(``persistent_engine.ops.attention.attention_prefill``) scores every sequence's queries against every
sequence's keys (B times this work); a decode row in a mixed batch fills G of BLOCK_Q * BLOCK_G tile rows.
"""

import torch
import triton
import triton.language as tl

from agents.templates.kernels.shared_attention import _sa_dot, _sa_paged_kv, _sa_softmax_init, _sa_softmax_step

# ---- section ----
ATTP_BLOCK_Q = 16       # queries per program (times the padded GQA group: the tile's rows)
ATTP_BLOCK_T = 64       # keys per tile
ATTP_NUM_WARPS = 8
ATTP_NUM_STAGES = 2


@triton.jit
def _attp_seq_of(cu_ptr, block, B, BLOCK_Q: tl.constexpr):
    """The sequence grid row ``block`` belongs to: the last b with cu[b] // BLOCK_Q + b <= block (binary search
    over cu_seqlens_q [B+1]). Sequence b's rows start at cu[b] // BLOCK_Q + b and its cdiv(n_b, BLOCK_Q) blocks
    fit before sequence b+1's first row."""
    lo = 0
    hi = B
    while lo < hi:
        mid = (lo + hi) // 2
        if tl.load(cu_ptr + mid) // BLOCK_Q + mid <= block:
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


@triton.jit
def _attp_kernel(q_ptr, k_ptr, v_ptr, bt_ptr, cu_ptr, cl_ptr, out_ptr, scale, B,
                 stride_qt, stride_qh, stride_kn, stride_kt, stride_kh, stride_vn, stride_vt, stride_vh,
                 stride_bt, stride_ot, stride_oh, DH, DV,
                 G: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_DH: tl.constexpr,
                 BLOCK_DV: tl.constexpr, PAGE: tl.constexpr, BLOCK_T: tl.constexpr,
                 UPCAST: tl.constexpr, IEEE: tl.constexpr):
    row_block = tl.program_id(0)
    hk = tl.program_id(1)
    b = _attp_seq_of(cu_ptr, row_block, B, BLOCK_Q)
    q0 = tl.load(cu_ptr + b)
    n = tl.load(cu_ptr + b + 1) - q0                                   # the sequence's queries
    ctx = tl.load(cl_ptr + b)
    first = (row_block - (q0 // BLOCK_Q + b)) * BLOCK_Q                # this block's first query (of n)
    rows = tl.arange(0, BLOCK_Q * BLOCK_G)                             # row = query * BLOCK_G + group member
    qi = first + rows // BLOCK_G                                       # [M] query index in the sequence
    g = rows % BLOCK_G
    rmask = (qi < n) & (g < G)
    tok = (q0 + qi).to(tl.int64)                                       # [M] row of q / out
    head = hk * G + g                                                  # [M] query head
    pos = ctx - n + qi                                                 # [M] the query's position
    dh = tl.arange(0, BLOCK_DH)
    dv = tl.arange(0, BLOCK_DV)
    q = tl.load(q_ptr + tok[:, None] * stride_qt + head[:, None] * stride_qh + dh[None, :],
                mask=rmask[:, None] & (dh[None, :] < DH), other=0.0).to(tl.float32) * scale     # [M, BLOCK_DH]
    m, l, acc = _sa_softmax_init(BLOCK_Q * BLOCK_G, BLOCK_DV)
    last = tl.where(first < n, tl.minimum(ctx - n + first + BLOCK_Q, ctx), 0)   # keys the block's queries see
    for t0 in range(0, last, BLOCK_T):
        offs_t = t0 + tl.arange(0, BLOCK_T)                            # [BLOCK_T] key positions
        tmask = offs_t < last
        kk, vv = _sa_paged_kv(k_ptr, v_ptr, bt_ptr, b, hk, offs_t, tmask, dh, dv, stride_bt, stride_kn, stride_kt,
                              stride_kh, stride_vn, stride_vt, stride_vh, DH, DV, PAGE)
        sc = _sa_dot(q, tl.trans(kk), k_ptr, UPCAST, IEEE)             # [M, BLOCK_T]
        sc = tl.where(offs_t[None, :] <= pos[:, None], sc, float("-inf"))     # causal
        p, alpha, m_new, l = _sa_softmax_step(sc, tmask, m, l)
        acc = acc * alpha[:, None] + _sa_dot(p, vv, v_ptr, UPCAST, IEEE)     # [M, BLOCK_DV]
        m = m_new
    o = acc / tl.where(l > 0, l, 1.0)[:, None]
    tl.store(out_ptr + tok[:, None] * stride_ot + head[:, None] * stride_oh + dv[None, :],
             o.to(out_ptr.dtype.element_ty), mask=rmask[:, None] & (dv[None, :] < DV))


def _attp_block_g(G: int) -> int:
    """GQA group rows per query, padded to a power of 2 and so that a tile has >= 16 rows (tl.dot's minimum)."""
    return max(triton.next_power_of_2(G), 16 // ATTP_BLOCK_Q)


def attention_prefill_triton(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale):
    T, Hq, DH = q.shape
    B = block_tables.shape[0]
    _, PAGE, Hk, _ = k_cache.shape
    DV = v_cache.shape[-1]
    G = Hq // Hk
    if q.stride(-1) != 1:
        q = q.contiguous()
    out = torch.empty((T, Hq, DV), dtype=q.dtype, device=q.device)
    if T == 0 or B == 0:
        return out
    _attp_kernel[(T // ATTP_BLOCK_Q + B, Hk)](
        q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, out, float(scale), B,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), block_tables.stride(0),
        out.stride(0), out.stride(1), DH, DV, G=G, BLOCK_G=_attp_block_g(G), BLOCK_Q=ATTP_BLOCK_Q,
        BLOCK_DH=max(16, triton.next_power_of_2(DH)), BLOCK_DV=max(16, triton.next_power_of_2(DV)), PAGE=PAGE,
        BLOCK_T=ATTP_BLOCK_T, UPCAST=q.device.type != "cuda", IEEE=q.dtype == torch.float32,
        num_warps=ATTP_NUM_WARPS, num_stages=ATTP_NUM_STAGES)
    return out
