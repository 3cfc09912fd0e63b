"""compressed_attention (DeepSeek-V4: shared-KV MQA over the sliding window plus compressed entries, with sinks)
as one Triton kernel.

Grid (T, cdiv(Hq, BLOCK_H), SPLITS): a program takes one query token and BLOCK_H query heads. K = V is one head, so
every head reads the same rows: each key row is loaded once for BLOCK_H heads. The program finds the token's
sequence and position from cu_seqlens_q / context_lens (a compare against the B sequence ends: no host sync,
any chunk, so decode and prefill run the same kernel), then runs an online softmax (tl.dot for q . k and for
p @ k) over

    the window    positions max(p - W + 1, 0) .. p, BLOCK_T at a time through the block table;
    the entries   HCA (entry_ids None): w < n_vis = min((p + 1) // ratio, n_entries[seq], NE), BLOCK_E at a time;
                  CSA: the picked ids, BLOCK_E at a time, masked where -1, >= n_vis, or a repeat of an earlier
                  pick (the reference attends a set: a [BLOCK_E, DEDUP] compare against the earlier ids);
                  ratio 0: none,

and the head's sink logit joins the final denominator (exp(sink - m)). With SPLITS > 1 (flash-decoding: at
decode batch 1 V4-Flash has only 4 head blocks for 132 SMs) a program takes every SPLITS-th tile of the window and
of the entries, writes its normalised output and log-sum-exp to fp32 scratch (T x Hq x SPLITS x (BLOCK_D + 1)
x 4 bytes), and a merge kernel weighs the shares and adds the sink; CSAA_SPLITS 0 splits only when the
(token, head block) programs fill less than half the SMs (one program per SM then). Rows are kept whole (BLOCK_D =
pow2(D), no D tiling): at V4-Flash's D = 512, BLOCK_H 16 and BLOCK_T 32 the live tiles are q and the fp32
accumulator [16, 512] and a [32, 512] row tile, as sparse_mla_decode.triton holds; D-tiling would read every
row twice (scores need the whole dot before p @ k). Bytes per (token, head block): (min(W, p + 1) + k or
n_vis) x D x 2 (V4-Flash decode, CSA: (128 + 512) x 512 x 2 = 640 KiB; HCA at 4K context: (128 + 32) x 1 KiB),
the other Hq / BLOCK_H - 1 head blocks mostly hit L2; q and the output once. On CPU (TRITON_INTERPRET=1) the
dots run in fp32 (the interpreter's 16-bit dot is wrong).
"""

import torch
import triton
import triton.language as tl

from agents.templates.kernels.shared_attention import _sa_softmax_init, _sa_softmax_step

# ---- section ----
CSAA_BLOCK_H = 16
CSAA_BLOCK_T = 32
CSAA_BLOCK_E = 32
CSAA_NUM_WARPS = 8
CSAA_NUM_STAGES = 2
CSAA_SPLITS = 0         # programs sharing one (token, head block)'s key tiles; 0: by the batch (_csaa_splits)
CSAA_DEDUP = 128        # earlier picks compared per step of the repeat check (not a knob: a few int compares)


@triton.jit
def _csaa_tile(q, rows, valid, m, l, acc, scale, UPCAST: tl.constexpr):
    """One tile of key rows [BLOCK_T, BLOCK_D] (K = V, as stored) for q [BLOCK_H, BLOCK_D]: the online softmax's
    update."""
    if UPCAST:
        rows = rows.to(tl.float32)
    else:
        rows = rows.to(q.dtype)
    if UPCAST:                        # fp32 in: IEEE dots (TF32's 10-bit mantissa misses fp32 tolerances)
        sc = tl.dot(q, tl.trans(rows), input_precision="ieee") * scale             # [BLOCK_H, BLOCK_T] fp32
    else:
        sc = tl.dot(q, tl.trans(rows)) * scale
    p, alpha, m_new, l = _sa_softmax_step(sc, valid, m, l)
    if UPCAST:
        acc = acc * alpha[:, None] + tl.dot(p, rows, input_precision="ieee")       # [BLOCK_H, BLOCK_D]
    else:
        acc = acc * alpha[:, None] + tl.dot(p.to(rows.dtype), rows)
    return m_new, l, acc


_CSAA_SMS = {}


def _csaa_splits(q, programs: int) -> int:
    """CSAA_SPLITS, or (0) one program per SM: 1 when the (token, head block) programs fill half the SMs, else a
    power of two up to 16 (host-side, no sync)."""
    if CSAA_SPLITS:
        return CSAA_SPLITS
    if q.device not in _CSAA_SMS:
        _CSAA_SMS[q.device] = torch.cuda.get_device_properties(q.device).multi_processor_count if q.is_cuda else 4
    want = _CSAA_SMS[q.device] // max(programs, 1)
    return 1 if 2 * programs >= _CSAA_SMS[q.device] else min(16, 1 << (want.bit_length() - 1))


@triton.jit
def _csaa_kernel(q_ptr, kv_ptr, bt_ptr, cu_ptr, cl_ptr, ent_ptr, nent_ptr, ids_ptr, sink_ptr, out_ptr, po_ptr,
                 pl_ptr, scale,
                 stride_qt, stride_qh, stride_kvn, stride_kvt, stride_bt, stride_eb, stride_ew, stride_it,
                 stride_ot, stride_oh, B, HQ, NE, K, ratio, window,
                 D: tl.constexpr, PAGE: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_H: tl.constexpr,
                 BLOCK_T: tl.constexpr, BLOCK_E: tl.constexpr, BLOCK_D: tl.constexpr, DEDUP: tl.constexpr,
                 PICKED: tl.constexpr, UPCAST: tl.constexpr, SPLITS: tl.constexpr):
    t = tl.program_id(0)
    s = tl.program_id(2)                  # this program's share: every SPLITS-th tile of the window and the entries
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    hmask = heads < HQ
    dd = tl.arange(0, BLOCK_D)
    dmask = dd < D
    # the token's sequence (the number of sequence ends at or before t) and position: that sequence's queries
    # are its last cu[seq + 1] - cu[seq] positions
    ob = tl.arange(0, BLOCK_B)
    ends = tl.load(cu_ptr + 1 + ob, mask=ob < B, other=2147483647)
    seq = tl.minimum(tl.sum((ends <= t).to(tl.int32), axis=0), B - 1)
    c0 = tl.load(cu_ptr + seq)
    c1 = tl.load(cu_ptr + seq + 1)
    pos = tl.load(cl_ptr + seq) - (c1 - c0) + (t - c0)
    q = tl.load(q_ptr + t.to(tl.int64) * stride_qt + heads[:, None] * stride_qh + dd[None, :],
                mask=hmask[:, None] & dmask[None, :], other=0.0)                   # [BLOCK_H, BLOCK_D]
    if UPCAST:
        q = q.to(tl.float32)
    m, l, acc = _sa_softmax_init(BLOCK_H, BLOCK_D)
    # the window: BLOCK_T cached positions a step through the block table
    for j0 in range(tl.maximum(pos - window + 1, 0) + s * BLOCK_T, pos + 1, SPLITS * BLOCK_T):
        offs = j0 + tl.arange(0, BLOCK_T)
        valid = offs <= pos
        page = tl.load(bt_ptr + seq * stride_bt + offs // PAGE, mask=valid, other=0).to(tl.int64)
        row = page * stride_kvn + (offs % PAGE) * stride_kvt                     # [BLOCK_T]
        rows = tl.load(kv_ptr + row[:, None] + dd[None, :], mask=valid[:, None] & dmask[None, :], other=0.0)
        m, l, acc = _csaa_tile(q, rows, valid, m, l, acc, scale, UPCAST)
    # the compressed entries this token sees: w < n_vis (none on a window-only layer)
    n_vis = tl.minimum(tl.minimum((pos + 1) // tl.maximum(ratio, 1), tl.load(nent_ptr + seq)), NE)
    n_vis = tl.where(ratio > 0, n_vis, 0)
    ent = ent_ptr + seq.to(tl.int64) * stride_eb
    if PICKED:
        for k0 in range(s * BLOCK_E, K, SPLITS * BLOCK_E):
            kk = k0 + tl.arange(0, BLOCK_E)
            ids = tl.load(ids_ptr + t.to(tl.int64) * stride_it + kk, mask=kk < K, other=-1)
            seen = tl.zeros([BLOCK_E], dtype=tl.int32)                            # 1: an earlier pick has this id
            for e0 in range(0, k0 + BLOCK_E, DEDUP):
                ee = e0 + tl.arange(0, DEDUP)
                prev = tl.load(ids_ptr + t.to(tl.int64) * stride_it + ee, mask=ee < K, other=-1)
                same = (prev[None, :] == ids[:, None]) & (ee[None, :] < kk[:, None])   # [BLOCK_E, DEDUP]
                seen = tl.maximum(seen, tl.max(same.to(tl.int32), axis=1))
            valid = (ids >= 0) & (ids < n_vis) & (seen == 0)
            w = tl.where(valid, ids, 0).to(tl.int64)
            rows = tl.load(ent + w[:, None] * stride_ew + dd[None, :], mask=valid[:, None] & dmask[None, :],
                           other=0.0)
            m, l, acc = _csaa_tile(q, rows, valid, m, l, acc, scale, UPCAST)
    else:
        for w0 in range(s * BLOCK_E, n_vis, SPLITS * BLOCK_E):
            w = w0 + tl.arange(0, BLOCK_E)
            valid = w < n_vis
            rows = tl.load(ent + w.to(tl.int64)[:, None] * stride_ew + dd[None, :],
                           mask=valid[:, None] & dmask[None, :], other=0.0)
            m, l, acc = _csaa_tile(q, rows, valid, m, l, acc, scale, UPCAST)
    omask = hmask[:, None] & dmask[None, :]
    if SPLITS == 1:
        sink = tl.load(sink_ptr + heads, mask=hmask, other=0.0).to(tl.float32)
        l = l + tl.exp(sink - m)
        o = acc / tl.where(l > 0, l, 1.0)[:, None]
        tl.store(out_ptr + t.to(tl.int64) * stride_ot + heads[:, None] * stride_oh + dd[None, :],
                 o.to(out_ptr.dtype.element_ty), mask=omask)
    else:                                 # this share's output and log-sum-exp (-inf: it had no key) to scratch
        row = (t.to(tl.int64) * HQ + heads) * SPLITS + s                          # [BLOCK_H]
        tl.store(po_ptr + row[:, None] * BLOCK_D + dd[None, :], acc / tl.where(l > 0, l, 1.0)[:, None], mask=omask)
        tl.store(pl_ptr + row, tl.where(l > 0, m + tl.log(tl.where(l > 0, l, 1.0)), float("-inf")), mask=hmask)


@triton.jit
def _csaa_merge(po_ptr, pl_ptr, sink_ptr, out_ptr, HQ, D, stride_ot, stride_oh, SPLITS: tl.constexpr,
                BLOCK_D: tl.constexpr):
    """One (token, head): the SPLITS shares weighted by exp(lse - M), the sink's exp(sink - M) in the denominator."""
    t = tl.program_id(0)
    h = tl.program_id(1)
    row = (t.to(tl.int64) * HQ + h) * SPLITS + tl.arange(0, SPLITS)                # [SPLITS]
    lse = tl.load(pl_ptr + row)
    sink = tl.load(sink_ptr + h).to(tl.float32)
    mx = tl.maximum(tl.max(lse, axis=0), sink)
    w = tl.exp(lse - mx)                                                          # 0 for shares with no key
    dd = tl.arange(0, BLOCK_D)
    o = tl.load(po_ptr + row[:, None] * BLOCK_D + dd[None, :], mask=(w[:, None] > 0) & (dd[None, :] < D), other=0.0)
    res = tl.sum(o * w[:, None], axis=0) / (tl.sum(w, axis=0) + tl.exp(sink - mx))
    tl.store(out_ptr + t.to(tl.int64) * stride_ot + h * stride_oh + dd, res.to(out_ptr.dtype.element_ty), mask=dd < D)


def compressed_attention_triton(q, kv_cache, block_tables, cu_seqlens_q, context_lens, entries, n_entries,
                                entry_ids, ratio, window, sinks, scale):
    T, HQ, D = q.shape
    B = context_lens.shape[0]
    out = torch.empty((T, HQ, D), dtype=q.dtype, device=q.device)
    if T == 0:
        return out
    q = q if q.stride(-1) == 1 else q.contiguous()
    kv = kv_cache if kv_cache.stride(-1) == 1 else kv_cache.contiguous()
    ent = entries if entries.stride(-1) == 1 else entries.contiguous()
    picked = entry_ids is not None
    ids = (entry_ids if entry_ids.stride(-1) == 1 else entry_ids.contiguous()) if picked else n_entries
    K = ids.shape[1] if picked else 0
    hblocks = triton.cdiv(HQ, CSAA_BLOCK_H)
    splits = _csaa_splits(q, T * hblocks)
    BLOCK_D = max(16, triton.next_power_of_2(D))
    if splits > 1:                        # fp32 scratch: T x Hq x splits rows of BLOCK_D, and their lse
        po = torch.empty((T * HQ * splits, BLOCK_D), dtype=torch.float32, device=q.device)
        pl = torch.empty((T * HQ * splits,), dtype=torch.float32, device=q.device)
    else:
        po = pl = out
    _csaa_kernel[(T, hblocks, splits)](
        q, kv, block_tables, cu_seqlens_q, context_lens, ent, n_entries, ids, sinks, out, po, pl, float(scale),
        q.stride(0), q.stride(1), kv.stride(0), kv.stride(1), block_tables.stride(0), ent.stride(0), ent.stride(1),
        ids.stride(0) if picked else 0, out.stride(0), out.stride(1), B, HQ, ent.shape[1], K, int(ratio),
        int(window), D=D, PAGE=kv.shape[1], BLOCK_B=max(16, triton.next_power_of_2(B)), BLOCK_H=CSAA_BLOCK_H,
        BLOCK_T=CSAA_BLOCK_T, BLOCK_E=CSAA_BLOCK_E, BLOCK_D=BLOCK_D, DEDUP=CSAA_DEDUP,
        PICKED=picked, UPCAST=q.device.type != "cuda" or q.dtype == torch.float32, SPLITS=splits,
        num_warps=CSAA_NUM_WARPS, num_stages=CSAA_NUM_STAGES)
    if splits > 1:
        _csaa_merge[(T, HQ)](po, pl, sinks, out, HQ, D, out.stride(0), out.stride(1), SPLITS=splits,
                             BLOCK_D=BLOCK_D, num_warps=4)
    return out
