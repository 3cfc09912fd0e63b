"""tkcc candidate rendered from the template library: add_rms_norm_qkv_rotary.triton_fused{QKVR_BLOCK_K=512,QKVR_BLOCK_M=2,QKVR_BLOCK_N=4,QKVR_HEADS=2,QKVR_MAX_T=4,QKVR_NUM_STAGES=4,QKVR_NUM_WARPS=1,QKVR_REDUCE_WARPS=2,QKVR_SPLIT_K=8}"""

import math
import torch
import triton
import triton.language as tl


# ======== add_rms_norm_qkv_rotary.triton_fused{QKVR_BLOCK_K=512,QKVR_BLOCK_M=2,QKVR_BLOCK_N=4,QKVR_HEADS=2,QKVR_MAX_T=4,QKVR_NUM_STAGES=4,QKVR_NUM_WARPS=1,QKVR_REDUCE_WARPS=2,QKVR_SPLIT_K=8}
QKVR_BLOCK_N = 4
QKVR_BLOCK_K = 512
QKVR_BLOCK_M = 2
QKVR_SPLIT_K = 8
QKVR_NUM_WARPS = 1
QKVR_NUM_STAGES = 4
QKVR_MAX_T = 4
QKVR_HEADS = 2
QKVR_REDUCE_WARPS = 2


@triton.jit
def _qkvr_gemv(x_ptr, r_ptr, g_ptr, w_ptr, res_ptr, ws_ptr, ss_ptr, M, N, K,
               stride_xm, stride_rm, stride_wn, stride_res,
               K_PER_SPLIT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)             # [BLOCK_N]
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)             # [BLOCK_M]
    nmask = offs_n < N
    mmask = offs_m < M
    k_begin = pid_k * K_PER_SPLIT
    w_rows = w_ptr + offs_n[:, None].to(tl.int64) * stride_wn
    rows64 = offs_m[:, None].to(tl.int64)
    resmask = offs_m < tl.where(pid_n == 0, M, 0)                # only the pid_n == 0 column writes s
    ss = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K_PER_SPLIT, BLOCK_K):
        offs_k = tl.max_contiguous(tl.multiple_of(k_begin + k0 + tl.arange(0, BLOCK_K), BLOCK_K), BLOCK_K)
        kmask = offs_k < K
        xmask = mmask[:, None] & kmask[None, :]
        xv = tl.load(x_ptr + rows64 * stride_xm + offs_k[None, :], mask=xmask, other=0.0)
        rv = tl.load(r_ptr + rows64 * stride_rm + offs_k[None, :], mask=xmask, other=0.0)
        s = xv.to(tl.float32) + rv.to(tl.float32)                 # [BLOCK_M, BLOCK_K]
        tl.store(res_ptr + rows64 * stride_res + offs_k[None, :], s.to(res_ptr.dtype.element_ty),
                 mask=resmask[:, None] & kmask[None, :])
        ss += tl.sum(s * s, axis=1)
        g = tl.load(g_ptr + offs_k, mask=kmask, other=0.0).to(tl.float32)
        a = s * g[None, :]
        w = tl.load(w_rows + offs_k[None, :], mask=nmask[:, None] & kmask[None, :], other=0.0,
                    eviction_policy="evict_first").to(tl.float32)  # [BLOCK_N, BLOCK_K]
        acc += tl.sum(a[:, None, :] * w[None, :, :], axis=2)
    tl.store(ws_ptr + (pid_k * M + rows64) * N + offs_n[None, :], acc, mask=mmask[:, None] & nmask[None, :])
    tl.store(ss_ptr + pid_k * M + offs_m, ss, mask=resmask)


@triton.jit
def _qkvr_partial(ws_ptr, m, M, N, col, mask, SPLIT_K: tl.constexpr):
    acc = tl.zeros(col.shape, dtype=tl.float32)
    for s in range(SPLIT_K):                                      # fixed order: deterministic
        acc += tl.load(ws_ptr + (s * M + m) * N + col, mask=mask, other=0.0)
    return acc


@triton.jit
def _qkvr_reduce(ws_ptr, ss_ptr, b_ptr, pos_ptr, cs_ptr, q_ptr, k_ptr, v_ptr, M, N, K, Hq, Hk, Dh, stride_cs, eps,
                 HALF, R, HAS_BIAS: tl.constexpr, SPLIT_K: tl.constexpr, SPLIT_P2: tl.constexpr,
                 HEADS: tl.constexpr, BLOCK_D: tl.constexpr):
    m = tl.program_id(1).to(tl.int64)
    heads = tl.program_id(0) * HEADS + tl.arange(0, HEADS)       # [HEADS] of the Hq + 2 Hk heads
    d = tl.arange(0, BLOCK_D)                                     # [BLOCK_D]
    hmask = heads < Hq + 2 * Hk
    mask = hmask[:, None] & (d[None, :] < Dh)
    rot = (heads < Hq + Hk)[:, None] & (d[None, :] < R)          # q and k heads, first R dims
    partner = tl.where(d < HALF, d + HALF, d - HALF)              # the other element of d's rotary pair
    sp = tl.arange(0, SPLIT_P2)
    scale = tl.rsqrt(tl.sum(tl.load(ss_ptr + sp * M + m, mask=sp < SPLIT_K, other=0.0), axis=0) / K + eps)
    col = heads[:, None] * Dh + d[None, :]                        # [HEADS, BLOCK_D] columns of qkv
    pcol = heads[:, None] * Dh + partner[None, :]
    y = _qkvr_partial(ws_ptr, m, M, N, col, mask, SPLIT_K) * scale
    yp = _qkvr_partial(ws_ptr, m, M, N, pcol, rot, SPLIT_K) * scale
    if HAS_BIAS:
        y += tl.load(b_ptr + col, mask=mask, other=0.0).to(tl.float32)
        yp += tl.load(b_ptr + pcol, mask=rot, other=0.0).to(tl.float32)
    pos = tl.load(pos_ptr + m)
    j = tl.where(d < HALF, d, d - HALF)                           # frequency index of the pair
    cmask = d < R
    cos = tl.load(cs_ptr + pos * stride_cs + j, mask=cmask, other=1.0).to(tl.float32)
    sin = tl.load(cs_ptr + pos * stride_cs + HALF + j, mask=cmask, other=0.0).to(tl.float32)
    sign = tl.where(d < HALF, -1.0, 1.0)                          # x1 c - x2 s | x2 c + x1 s
    out = tl.where(rot, y * cos[None, :] + sign[None, :] * yp * sin[None, :], y)
    hq = heads[:, None]
    tl.store(q_ptr + (m * Hq + hq) * Dh + d[None, :], out.to(q_ptr.dtype.element_ty), mask=mask & (hq < Hq))
    kmask = mask & (hq >= Hq) & (hq < Hq + Hk)
    tl.store(k_ptr + (m * Hk + hq - Hq) * Dh + d[None, :], out.to(k_ptr.dtype.element_ty), mask=kmask)
    vmask = mask & (hq >= Hq + Hk)
    tl.store(v_ptr + (m * Hk + hq - Hq - Hk) * Dh + d[None, :], out.to(v_ptr.dtype.element_ty), mask=vmask)


def _qkvr_torch(x2, r2, norm_weight, eps, weight, bias, positions, cos_sin_cache, rotary_dim, hq, hk):
    """T > MAX_T: fp32 add, one rms_norm kernel, cuBLAS projection, rotary in fp32 on the q/k views."""
    T, H = x2.shape
    s = x2.float() + r2.float()                                           # [T, H] fp32
    normed = torch.nn.functional.rms_norm(s, (H,), norm_weight.float(), eps).to(x2.dtype)
    qkv = torch.nn.functional.linear(normed, weight, bias)                # [T, (Hq + 2 Hk) Dh]
    dh = qkv.shape[1] // (hq + 2 * hk)
    heads = qkv.view(T, hq + 2 * hk, dh)
    half = rotary_dim // 2
    cos, sin = cos_sin_cache[positions].float().chunk(2, dim=-1)          # [T, R/2] each
    qk = heads[:, :hq + hk].float()
    x1, x2_ = qk[..., :half], qk[..., half:rotary_dim]
    c, sn = cos[:, None, :], sin[:, None, :]
    qk = torch.cat([x1 * c - x2_ * sn, x2_ * c + x1 * sn, qk[..., rotary_dim:]], dim=-1).to(qkv.dtype)
    return qk[:, :hq], qk[:, hq:], heads[:, hq + hk:], s.to(x2.dtype)


def add_rms_norm_qkv_rotary_triton(x, residual, norm_weight, eps, qkv_weight, qkv_bias, positions, cos_sin_cache,
                                   rotary_dim, num_heads, num_kv_heads):
    H = x.shape[-1]
    N = qkv_weight.shape[0]
    hq, hk = int(num_heads), int(num_kv_heads)
    dh = N // (hq + 2 * hk)
    x2, r2 = x.reshape(-1, H), residual.reshape(-1, H)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    if r2.stride(-1) != 1:
        r2 = r2.contiguous()
    w = qkv_weight if qkv_weight.stride(-1) == 1 else qkv_weight.contiguous()
    M = x2.shape[0]
    eps = float(eps)
    if M > QKVR_MAX_T or M == 0:
        return _qkvr_torch(x2, r2, norm_weight, eps, w, qkv_bias, positions, cos_sin_cache, rotary_dim, hq, hk)
    cs = cos_sin_cache if cos_sin_cache.stride(-1) == 1 else cos_sin_cache.contiguous()
    q = torch.empty((M, hq, dh), dtype=x.dtype, device=x.device)
    k = torch.empty((M, hk, dh), dtype=x.dtype, device=x.device)
    v = torch.empty((M, hk, dh), dtype=x.dtype, device=x.device)
    res = torch.empty((M, H), dtype=x.dtype, device=x.device)
    k_per_split = triton.cdiv(triton.cdiv(H, QKVR_SPLIT_K), QKVR_BLOCK_K) * QKVR_BLOCK_K
    split = triton.cdiv(H, k_per_split)
    ws = torch.empty((split, M, N), dtype=torch.float32, device=x.device)       # fp32 partial products
    ss = torch.empty((split, M), dtype=torch.float32, device=x.device)          # partial sums of squares
    grid = (triton.cdiv(N, QKVR_BLOCK_N), split, triton.cdiv(M, QKVR_BLOCK_M))
    _qkvr_gemv[grid](x2, r2, norm_weight, w, res, ws, ss, M, N, H, x2.stride(0), r2.stride(0), w.stride(0),
                     res.stride(0), K_PER_SPLIT=k_per_split, BLOCK_M=QKVR_BLOCK_M, BLOCK_N=QKVR_BLOCK_N,
                     BLOCK_K=QKVR_BLOCK_K, num_warps=QKVR_NUM_WARPS, num_stages=QKVR_NUM_STAGES)
    b = qkv_bias if qkv_bias is not None else ws
    _qkvr_reduce[(triton.cdiv(hq + 2 * hk, QKVR_HEADS), M)](
        ws, ss, b, positions, cs, q, k, v, M, N, H, hq, hk, dh, cs.stride(0), eps, rotary_dim // 2, rotary_dim,
        HAS_BIAS=qkv_bias is not None, SPLIT_K=split, SPLIT_P2=triton.next_power_of_2(split), HEADS=QKVR_HEADS,
        BLOCK_D=triton.next_power_of_2(dh), num_warps=QKVR_REDUCE_WARPS)
    return q, k, v, res.reshape(x.shape)


OVERRIDES = {'add_rms_norm_qkv_rotary': add_rms_norm_qkv_rotary_triton}
DESCRIPTION = 'add_rms_norm_qkv_rotary.triton_fused{QKVR_BLOCK_K=512,QKVR_BLOCK_M=2,QKVR_BLOCK_N=4,QKVR_HEADS=2,QKVR_MAX_T=4,QKVR_NUM_STAGES=4,QKVR_NUM_WARPS=1,QKVR_REDUCE_WARPS=2,QKVR_SPLIT_K=8}'
