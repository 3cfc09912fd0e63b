"""attention_decode over the paged KV cache as a split-KV (flash-decoding) Triton kernel.

Grid (B, Hk, NUM_SPLITS): a program takes one sequence, one KV head with its G = Hq/Hk query heads
(GQA: each K/V tile is read once for the whole group) and one slice of the context, and runs an
online softmax over BLOCK_T-token tiles gathered through the block table. The slice length is
derived from the block-table width (no host sync: CUDA-graph safe); slices past a sequence's length
end at once. With NUM_SPLITS > 1, per-slice outputs and log-sum-exps go to fp32 scratch and a second
kernel merges them. ``ATTD_DOT`` computes QK^T and PV with ``tl.dot`` on tensor cores (the group
padded to 16 rows; worth it for large groups and head dims, e.g. G=8, Dh=128), otherwise as
broadcast products on CUDA cores. Bytes: the context's K and V (ctx * Hk * (Dh + Dv) elements per
sequence). ``ATTD_NUM_SPLITS`` = 0 picks the split count per call: about two programs per SM
(B * Hk * splits ~ 2 * SMs), never more splits than BLOCK_T tiles in the context's block table — at batch 1
that is what keeps a short context from running on a few SMs. ``ATTD_PDL`` = 1 (SM90+ GPUs; ignored
elsewhere) launches both kernels with programmatic dependent launch: each waits (``gdc_wait``) before
its first load, since q and the cache's new K/V come from the kernels just before, so only the launch
overlaps the previous kernel's tail.
"""

import torch
import triton
import triton.language as tl

from agents.templates.kernels.shared_attention import _sa_dot, _sa_group_q, _sa_paged_kv, _sa_softmax_init, _sa_softmax_step

# ---- section ----
ATTD_BLOCK_T = 32
ATTD_NUM_SPLITS = 0     # 0: about two programs per SM
ATTD_NUM_WARPS = 4
ATTD_NUM_STAGES = 2
ATTD_DOT = False        # tensor-core tl.dot for QK^T and PV (the group padded to 16 rows)
ATTD_PDL = 0            # 1: programmatic dependent launch (SM90+)


def _attd_pdl(q) -> bool:
    """Programmatic dependent launch: asked for, and a GPU that has it (SM90+)."""
    return bool(ATTD_PDL) and q.is_cuda and torch.cuda.get_device_capability(q.device)[0] >= 9


_SMS = {}


def _attd_splits(q, B: int, Hk: int, max_tokens: int) -> int:
    """Split count: ATTD_NUM_SPLITS, or (0) enough slices for ~2 programs per SM; a power of 2, at most
    one slice per BLOCK_T tile of the block table's width (host-side, no sync)."""
    want = ATTD_NUM_SPLITS
    if not want:
        if q.device not in _SMS:
            _SMS[q.device] = torch.cuda.get_device_properties(q.device).multi_processor_count if q.is_cuda else 4
        want = triton.cdiv(2 * _SMS[q.device], B * Hk)
    splits = max(1, min(want, 64, triton.cdiv(max_tokens, ATTD_BLOCK_T)))
    return triton.next_power_of_2(splits) if splits > 1 else 1


@triton.jit
def _attd_kernel(q_ptr, k_ptr, v_ptr, bt_ptr, cl_ptr, out_ptr, po_ptr, pl_ptr, scale, tokens_per_split,
                 stride_qb, stride_qh, stride_kn, stride_kt, stride_kh, stride_vn, stride_vt, stride_vh,
                 stride_bt, stride_ob, stride_oh, Hq, DH, DV,
                 G: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_DH: tl.constexpr, BLOCK_DV: tl.constexpr,
                 PAGE: tl.constexpr, BLOCK_T: tl.constexpr, NUM_SPLITS: tl.constexpr,
                 DOT: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr, GDC: tl.constexpr):
    if GDC:     # launched early: every input may come from the kernel just before
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    b = tl.program_id(0)
    hk = tl.program_id(1)
    s = tl.program_id(2)
    ctx = tl.load(cl_ptr + b)
    start = s * tokens_per_split
    end = tl.minimum(start + tokens_per_split, ctx)
    heads, gmask, dh, q = _sa_group_q(q_ptr, b, hk, stride_qb, stride_qh, scale, DH, G, BLOCK_G, BLOCK_DH)
    dv = tl.arange(0, BLOCK_DV)
    m, l, acc = _sa_softmax_init(BLOCK_G, BLOCK_DV)
    for t0 in range(start, end, BLOCK_T):
        offs_t = t0 + tl.arange(0, BLOCK_T)                            # [BLOCK_T]
        tmask = offs_t < end
        kk, vv = _sa_paged_kv(k_ptr, v_ptr, bt_ptr, b, hk, offs_t, tmask, dh, dv, stride_bt, stride_kn, stride_kt,
                              stride_kh, stride_vn, stride_vt, stride_vh, DH, DV, PAGE)
        if DOT:
            sc = _sa_dot(q, tl.trans(kk), k_ptr, UPCAST, IEEE)
        else:
            sc = tl.sum(q[:, None, :] * kk[None, :, :], axis=2)       # [BLOCK_G, BLOCK_T]
        p, alpha, m_new, l = _sa_softmax_step(sc, tmask, m, l)
        if DOT:
            pv = _sa_dot(p, vv, v_ptr, UPCAST, IEEE)
        else:
            pv = tl.sum(p[:, :, None] * vv[None, :, :], axis=1)        # [BLOCK_G, BLOCK_DV]
        acc = acc * alpha[:, None] + pv
        m = m_new
    safe_l = tl.where(l > 0, l, 1.0)
    o = acc / safe_l[:, None]
    omask = gmask[:, None] & (dv[None, :] < DV)
    if NUM_SPLITS == 1:
        tl.store(out_ptr + b * stride_ob + heads[:, None] * stride_oh + dv[None, :],
                 o.to(out_ptr.dtype.element_ty), mask=omask)
    else:
        row = (b * Hq + heads) * NUM_SPLITS + s                        # [BLOCK_G]
        tl.store(po_ptr + row[:, None] * BLOCK_DV + dv[None, :], o, mask=omask)
        lse = tl.where(l > 0, m + tl.log(safe_l), float("-inf"))
        tl.store(pl_ptr + row, lse, mask=gmask)


@triton.jit
def _attd_merge(po_ptr, pl_ptr, out_ptr, Hq, DV, stride_ob, stride_oh,
                NUM_SPLITS: tl.constexpr, BLOCK_DV: tl.constexpr, GDC: tl.constexpr):
    if GDC:     # launched early; the slices are read only once the split kernel has finished
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    b = tl.program_id(0)
    h = tl.program_id(1)
    sp = tl.arange(0, NUM_SPLITS)
    row = (b * Hq + h) * NUM_SPLITS + sp                               # [NUM_SPLITS]
    lse = tl.load(pl_ptr + row)
    mx = tl.max(lse, axis=0)
    mx = tl.where(mx > float("-inf"), mx, 0.0)
    w = tl.exp(lse - mx)                                               # 0 for empty slices
    dv = tl.arange(0, BLOCK_DV)
    o = tl.load(po_ptr + row[:, None] * BLOCK_DV + dv[None, :], mask=(w[:, None] > 0) & (dv[None, :] < DV),
                other=0.0)
    den = tl.sum(w, axis=0)
    res = tl.sum(o * w[:, None], axis=0) / tl.where(den > 0, den, 1.0)
    tl.store(out_ptr + b * stride_ob + h * stride_oh + dv, res.to(out_ptr.dtype.element_ty), mask=dv < DV)


def attention_decode_triton(q, k_cache, v_cache, block_tables, context_lens, scale):
    B, Hq, DH = q.shape
    _, PAGE, Hk, _ = k_cache.shape
    DV = v_cache.shape[-1]
    G = Hq // Hk
    if q.stride(-1) != 1:
        q = q.contiguous()
    out = torch.empty((B, Hq, DV), dtype=q.dtype, device=q.device)
    if B == 0:
        return out
    max_tokens = block_tables.shape[1] * PAGE
    splits = _attd_splits(q, B, Hk, max_tokens)
    tokens_per_split = triton.cdiv(triton.cdiv(max_tokens, splits), ATTD_BLOCK_T) * ATTD_BLOCK_T
    BLOCK_DV = max(16, triton.next_power_of_2(DV))
    if splits > 1:
        po = torch.empty((B * Hq * splits, BLOCK_DV), dtype=torch.float32, device=q.device)
        pl = torch.empty((B * Hq * splits,), dtype=torch.float32, device=q.device)
    else:
        po = pl = out
    block_g = max(16, triton.next_power_of_2(G)) if ATTD_DOT else triton.next_power_of_2(G)
    pdl = _attd_pdl(q)
    launch = {"launch_pdl": True} if pdl else {}
    _attd_kernel[(B, Hk, splits)](
        q, k_cache, v_cache, block_tables, context_lens, out, po, pl, float(scale), tokens_per_split,
        q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), block_tables.stride(0),
        out.stride(0), out.stride(1), Hq, DH, DV, G=G, BLOCK_G=block_g,
        BLOCK_DH=max(16, triton.next_power_of_2(DH)), BLOCK_DV=BLOCK_DV, PAGE=PAGE, BLOCK_T=ATTD_BLOCK_T,
        NUM_SPLITS=splits, DOT=ATTD_DOT, UPCAST=q.device.type != "cuda", IEEE=q.dtype == torch.float32,
        GDC=pdl, num_warps=ATTD_NUM_WARPS, num_stages=ATTD_NUM_STAGES, **launch)
    if splits > 1:
        _attd_merge[(B, Hq)](po, pl, out, Hq, DV, out.stride(0), out.stride(1),
                             NUM_SPLITS=splits, BLOCK_DV=BLOCK_DV, GDC=pdl, num_warps=1, **launch)
    return out
