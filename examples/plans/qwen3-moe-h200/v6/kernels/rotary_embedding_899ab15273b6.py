"""tkcc candidate rendered from the template library: rotary_embedding.triton{ROPE_HEADS=4,ROPE_NUM_WARPS=4}"""

import math
import torch
import triton
import triton.language as tl


# ======== rotary_embedding.triton{ROPE_HEADS=4,ROPE_NUM_WARPS=4}
ROPE_HEADS = 4
ROPE_NUM_WARPS = 4


@triton.jit
def _rope_heads(src_ptr, dst_ptr, h0, H, stride_st, stride_sh, t, cos, sin, Dh,
                HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, PASS: tl.constexpr,
                BLOCK_PASS: tl.constexpr, HEADS: tl.constexpr):
    heads = h0 + tl.arange(0, HEADS)                              # [HEADS]
    hmask = heads < H
    d = tl.arange(0, BLOCK_HALF)                                  # [BLOCK_HALF]
    mask = hmask[:, None] & (d[None, :] < HALF)
    src = src_ptr + t * stride_st + heads[:, None] * stride_sh
    dst = dst_ptr + (t * H + heads[:, None]) * Dh
    x1 = tl.load(src + d[None, :], mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF + d[None, :], mask=mask, other=0.0).to(tl.float32)
    o1 = x1 * cos[None, :] - x2 * sin[None, :]
    o2 = x2 * cos[None, :] + x1 * sin[None, :]
    tl.store(dst + d[None, :], o1.to(dst_ptr.dtype.element_ty), mask=mask)
    tl.store(dst + HALF + d[None, :], o2.to(dst_ptr.dtype.element_ty), mask=mask)
    if PASS > 0:
        p = 2 * HALF + tl.arange(0, BLOCK_PASS)
        pmask = hmask[:, None] & (p[None, :] < Dh)
        xp = tl.load(src + p[None, :], mask=pmask, other=0.0)
        tl.store(dst + p[None, :], xp, mask=pmask)


@triton.jit
def _rope_kernel(pos_ptr, q_ptr, k_ptr, cs_ptr, qo_ptr, ko_ptr, Hq, Hk, Dh,
                 stride_qt, stride_qh, stride_kt, stride_kh, stride_cs,
                 HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, PASS: tl.constexpr,
                 BLOCK_PASS: tl.constexpr, HEADS: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1)
    nq = tl.cdiv(Hq, HEADS)
    pos = tl.load(pos_ptr + t)
    d = tl.arange(0, BLOCK_HALF)
    cmask = d < HALF
    cos = tl.load(cs_ptr + pos * stride_cs + d, mask=cmask, other=0.0).to(tl.float32)
    sin = tl.load(cs_ptr + pos * stride_cs + HALF + d, mask=cmask, other=0.0).to(tl.float32)
    if j < nq:
        _rope_heads(q_ptr, qo_ptr, j * HEADS, Hq, stride_qt, stride_qh, t, cos, sin, Dh,
                    HALF, BLOCK_HALF, PASS, BLOCK_PASS, HEADS)
    else:
        _rope_heads(k_ptr, ko_ptr, (j - nq) * HEADS, Hk, stride_kt, stride_kh, t, cos, sin, Dh,
                    HALF, BLOCK_HALF, PASS, BLOCK_PASS, HEADS)


def rotary_embedding_triton(positions, q, k, cos_sin_cache, rotary_dim):
    T, Hq, Dh = q.shape
    Hk = k.shape[1]
    if q.stride(-1) != 1:
        q = q.contiguous()
    if k.stride(-1) != 1:
        k = k.contiguous()
    cs = cos_sin_cache if cos_sin_cache.stride(-1) == 1 else cos_sin_cache.contiguous()
    qo = torch.empty((T, Hq, Dh), dtype=q.dtype, device=q.device)
    ko = torch.empty((T, Hk, Dh), dtype=k.dtype, device=k.device)
    half = rotary_dim // 2
    npass = Dh - rotary_dim
    if T > 0:
        grid = (T, triton.cdiv(Hq, ROPE_HEADS) + triton.cdiv(Hk, ROPE_HEADS))
        _rope_kernel[grid](
            positions, q, k, cs, qo, ko, Hq, Hk, Dh, q.stride(0), q.stride(1), k.stride(0), k.stride(1),
            cs.stride(0), HALF=half, BLOCK_HALF=triton.next_power_of_2(half), PASS=npass,
            BLOCK_PASS=triton.next_power_of_2(max(npass, 1)), HEADS=ROPE_HEADS, num_warps=ROPE_NUM_WARPS)
    return qo, ko


OVERRIDES = {'rotary_embedding': rotary_embedding_triton}
DESCRIPTION = 'rotary_embedding.triton{ROPE_HEADS=4,ROPE_NUM_WARPS=4}'
