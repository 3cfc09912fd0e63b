"""attention_decode_window (sliding-window decode with optional attention sinks) as one Triton kernel.

Grid (B, Hk): a program takes one sequence and one KV head with its G = Hq/Hk query heads (each K/V tile is
read once for the group) and runs an online softmax over the last ``window`` cached tokens only (all of them
for window 0), BLOCK_T tokens at a time through the block table; a head's sink logit joins the final
denominator (exp(sink - m)). Bytes: min(window, context) x Hk x (Dh + Dv) elements per sequence, q and the
output once: for a 128-token window that is independent of the context length.
"""

import torch
import triton
import triton.language as tl

from agents.templates.kernels.shared_attention import _sa_group_q, _sa_paged_kv, _sa_softmax_init, _sa_softmax_step

# ---- section ----
ATTW_BLOCK_T = 16
ATTW_NUM_WARPS = 4
ATTW_NUM_STAGES = 2


@triton.jit
def _attw_kernel(q_ptr, k_ptr, v_ptr, bt_ptr, cl_ptr, sink_ptr, out_ptr, scale, window,
                 stride_qb, stride_qh, stride_kn, stride_kt, stride_kh, stride_vn, stride_vt, stride_vh,
                 stride_bt, stride_ob, stride_oh, DH, DV,
                 G: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_DH: tl.constexpr, BLOCK_DV: tl.constexpr,
                 PAGE: tl.constexpr, BLOCK_T: tl.constexpr, SINKS: tl.constexpr):
    b = tl.program_id(0)
    hk = tl.program_id(1)
    ctx = tl.load(cl_ptr + b)
    start = tl.maximum(ctx - window, 0) if window > 0 else 0
    heads, gmask, dh, q = _sa_group_q(q_ptr, b, hk, stride_qb, stride_qh, scale, DH, G, BLOCK_G, BLOCK_DH)
    dv = tl.arange(0, BLOCK_DV)
    m, l, acc = _sa_softmax_init(BLOCK_G, BLOCK_DV)
    for t0 in range(start, ctx, BLOCK_T):
        offs_t = t0 + tl.arange(0, BLOCK_T)
        tmask = offs_t < ctx
        kk, vv = _sa_paged_kv(k_ptr, v_ptr, bt_ptr, b, hk, offs_t, tmask, dh, dv, stride_bt, stride_kn, stride_kt,
                              stride_kh, stride_vn, stride_vt, stride_vh, DH, DV, PAGE)
        sc = tl.sum(q[:, None, :] * kk[None, :, :], axis=2)                     # [BLOCK_G, BLOCK_T]
        p, alpha, m_new, l = _sa_softmax_step(sc, tmask, m, l)
        acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * vv[None, :, :], axis=1)
        m = m_new
    if SINKS:
        sink = tl.load(sink_ptr + heads, mask=gmask, other=0.0).to(tl.float32)
        l = l + tl.exp(sink - m)
    o = acc / tl.where(l > 0, l, 1.0)[:, None]
    tl.store(out_ptr + b * stride_ob + heads[:, None] * stride_oh + dv[None, :], o.to(out_ptr.dtype.element_ty),
             mask=gmask[:, None] & (dv[None, :] < DV))


def attention_decode_window_triton(q, k_cache, v_cache, block_tables, context_lens, scale, window, sinks):
    B, Hq, DH = q.shape
    _, PAGE, Hk, _ = k_cache.shape
    DV = v_cache.shape[-1]
    q = q if q.stride(-1) == 1 else q.contiguous()
    out = torch.empty((B, Hq, DV), dtype=q.dtype, device=q.device)
    if B == 0:
        return out
    _attw_kernel[(B, Hk)](
        q, k_cache, v_cache, block_tables, context_lens, sinks if sinks is not None else q, out, float(scale),
        int(window), q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2),
        v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), block_tables.stride(0), out.stride(0), out.stride(1),
        DH, DV, G=Hq // Hk, BLOCK_G=triton.next_power_of_2(Hq // Hk), BLOCK_DH=triton.next_power_of_2(DH),
        BLOCK_DV=triton.next_power_of_2(DV), PAGE=PAGE, BLOCK_T=ATTW_BLOCK_T, SINKS=sinks is not None,
        num_warps=ATTW_NUM_WARPS, num_stages=ATTW_NUM_STAGES)
    return out
