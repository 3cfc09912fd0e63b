"""tkcc composed plan: 5 accepted optimization(s): seed:seed:offline-kernel-0-add_rms_norm_qkv_rotary-190-add_rms_norm_qkv_rotary-1-add_rms_norm_qkv_rotary-1, seed:offline-kernel-0-fused_add_rms_norm-23-fused_add_rms_norm-2, seed:seed:seed:offline-kernel-2-add_rms_norm_linear-4-add_rms_norm_linear-1-add_rms_norm_linear-3-add_rms_norm_linear-4, seed:offline-kernel-2-attention_decode-46-attention_decode-3, offline-kernel-0-silu_mul_linear-18. Generated; do not edit."""
import math
import torch
import triton
import triton.language as tl
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
def _qkvr_gemv(x_ptr, r_ptr, g_ptr, w_ptr, res_ptr, ws_ptr, ss_ptr, M, N, K, stride_xm, stride_rm, stride_wn, stride_res, K_PER_SPLIT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    nmask = offs_n < N
    mmask = offs_m < M
    k_begin = pid_k * K_PER_SPLIT
    w_rows = w_ptr + offs_n[:, None].to(tl.int64) * stride_wn
    rows64 = offs_m[:, None].to(tl.int64)
    resmask = offs_m < tl.where(pid_n == 0, M, 0)
    ss = tl.zeros([BLOCK_M], dtype=tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K_PER_SPLIT, BLOCK_K):
        offs_k = tl.max_contiguous(tl.multiple_of(k_begin + k0 + tl.arange(0, BLOCK_K), BLOCK_K), BLOCK_K)
        kmask = offs_k < K
        xmask = mmask[:, None] & kmask[None, :]
        xv = tl.load(x_ptr + rows64 * stride_xm + offs_k[None, :], mask=xmask, other=0.0)
        rv = tl.load(r_ptr + rows64 * stride_rm + offs_k[None, :], mask=xmask, other=0.0)
        s = xv.to(tl.float32) + rv.to(tl.float32)
        tl.store(res_ptr + rows64 * stride_res + offs_k[None, :], s.to(res_ptr.dtype.element_ty), mask=resmask[:, None] & kmask[None, :])
        ss += tl.sum(s * s, axis=1)
        g = tl.load(g_ptr + offs_k, mask=kmask, other=0.0).to(tl.float32)
        a = s * g[None, :]
        w = tl.load(w_rows + offs_k[None, :], mask=nmask[:, None] & kmask[None, :], other=0.0, eviction_policy='evict_first').to(tl.float32)
        acc += tl.sum(a[:, None, :] * w[None, :, :], axis=2)
    tl.store(ws_ptr + (pid_k * M + rows64) * N + offs_n[None, :], acc, mask=mmask[:, None] & nmask[None, :])
    tl.store(ss_ptr + pid_k * M + offs_m, ss, mask=resmask)

@triton.jit
def _qkvr_partial(ws_ptr, m, M, N, col, mask, SPLIT_K: tl.constexpr):
    acc = tl.zeros(col.shape, dtype=tl.float32)
    for s in range(SPLIT_K):
        acc += tl.load(ws_ptr + (s * M + m) * N + col, mask=mask, other=0.0)
    return acc

@triton.jit
def _qkvr_reduce(ws_ptr, ss_ptr, b_ptr, pos_ptr, cs_ptr, q_ptr, k_ptr, v_ptr, M, N, K, Hq, Hk, Dh, stride_cs, eps, HALF, R, HAS_BIAS: tl.constexpr, SPLIT_K: tl.constexpr, SPLIT_P2: tl.constexpr, HEADS: tl.constexpr, BLOCK_D: tl.constexpr):
    m = tl.program_id(1).to(tl.int64)
    heads = tl.program_id(0) * HEADS + tl.arange(0, HEADS)
    d = tl.arange(0, BLOCK_D)
    hmask = heads < Hq + 2 * Hk
    mask = hmask[:, None] & (d[None, :] < Dh)
    rot = (heads < Hq + Hk)[:, None] & (d[None, :] < R)
    partner = tl.where(d < HALF, d + HALF, d - HALF)
    sp = tl.arange(0, SPLIT_P2)
    scale = tl.rsqrt(tl.sum(tl.load(ss_ptr + sp * M + m, mask=sp < SPLIT_K, other=0.0), axis=0) / K + eps)
    col = heads[:, None] * Dh + d[None, :]
    pcol = heads[:, None] * Dh + partner[None, :]
    y = _qkvr_partial(ws_ptr, m, M, N, col, mask, SPLIT_K) * scale
    yp = _qkvr_partial(ws_ptr, m, M, N, pcol, rot, SPLIT_K) * scale
    if HAS_BIAS:
        y += tl.load(b_ptr + col, mask=mask, other=0.0).to(tl.float32)
        yp += tl.load(b_ptr + pcol, mask=rot, other=0.0).to(tl.float32)
    pos = tl.load(pos_ptr + m)
    j = tl.where(d < HALF, d, d - HALF)
    cmask = d < R
    cos = tl.load(cs_ptr + pos * stride_cs + j, mask=cmask, other=1.0).to(tl.float32)
    sin = tl.load(cs_ptr + pos * stride_cs + HALF + j, mask=cmask, other=0.0).to(tl.float32)
    sign = tl.where(d < HALF, -1.0, 1.0)
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
    s = x2.float() + r2.float()
    normed = torch.nn.functional.rms_norm(s, (H,), norm_weight.float(), eps).to(x2.dtype)
    qkv = torch.nn.functional.linear(normed, weight, bias)
    dh = qkv.shape[1] // (hq + 2 * hk)
    heads = qkv.view(T, hq + 2 * hk, dh)
    half = rotary_dim // 2
    cos, sin = cos_sin_cache[positions].float().chunk(2, dim=-1)
    qk = heads[:, :hq + hk].float()
    x1, x2_ = (qk[..., :half], qk[..., half:rotary_dim])
    c, sn = (cos[:, None, :], sin[:, None, :])
    qk = torch.cat([x1 * c - x2_ * sn, x2_ * c + x1 * sn, qk[..., rotary_dim:]], dim=-1).to(qkv.dtype)
    return (qk[:, :hq], qk[:, hq:], heads[:, hq + hk:], s.to(x2.dtype))

def add_rms_norm_qkv_rotary_triton(x, residual, norm_weight, eps, qkv_weight, qkv_bias, positions, cos_sin_cache, rotary_dim, num_heads, num_kv_heads):
    H = x.shape[-1]
    N = qkv_weight.shape[0]
    hq, hk = (int(num_heads), int(num_kv_heads))
    dh = N // (hq + 2 * hk)
    x2, r2 = (x.reshape(-1, H), residual.reshape(-1, H))
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
    ws = torch.empty((split, M, N), dtype=torch.float32, device=x.device)
    ss = torch.empty((split, M), dtype=torch.float32, device=x.device)
    grid = (triton.cdiv(N, QKVR_BLOCK_N), split, triton.cdiv(M, QKVR_BLOCK_M))
    _qkvr_gemv[grid](x2, r2, norm_weight, w, res, ws, ss, M, N, H, x2.stride(0), r2.stride(0), w.stride(0), res.stride(0), K_PER_SPLIT=k_per_split, BLOCK_M=QKVR_BLOCK_M, BLOCK_N=QKVR_BLOCK_N, BLOCK_K=QKVR_BLOCK_K, num_warps=QKVR_NUM_WARPS, num_stages=QKVR_NUM_STAGES)
    b = qkv_bias if qkv_bias is not None else ws
    _qkvr_reduce[triton.cdiv(hq + 2 * hk, QKVR_HEADS), M](ws, ss, b, positions, cs, q, k, v, M, N, H, hq, hk, dh, cs.stride(0), eps, rotary_dim // 2, rotary_dim, HAS_BIAS=qkv_bias is not None, SPLIT_K=split, SPLIT_P2=triton.next_power_of_2(split), HEADS=QKVR_HEADS, BLOCK_D=triton.next_power_of_2(dh), num_warps=QKVR_REDUCE_WARPS)
    return (q, k, v, res.reshape(x.shape))
_c0_DESCRIPTION = 'add_rms_norm_qkv_rotary.triton_fused{QKVR_BLOCK_K=512,QKVR_BLOCK_M=2,QKVR_BLOCK_N=4,QKVR_HEADS=2,QKVR_MAX_T=4,QKVR_NUM_STAGES=4,QKVR_NUM_WARPS=1,QKVR_REDUCE_WARPS=2,QKVR_SPLIT_K=8}'
FARN_BLOCK_D = 2048
FARN_ROWS = 1
FARN_NUM_WARPS = 8

@triton.jit
def _farn_kernel(x_ptr, r_ptr, w_ptr, out_ptr, res_ptr, M, D, stride_xm, stride_rm, stride_om, eps, BLOCK_D: tl.constexpr, ROWS: tl.constexpr, SINGLE: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    rmask = rows < M
    cols = tl.arange(0, BLOCK_D)
    if SINGLE:
        mask = rmask[:, None] & (cols[None, :] < D)
        x = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :], mask=mask, other=0.0)
        r = tl.load(r_ptr + rows[:, None] * stride_rm + cols[None, :], mask=mask, other=0.0)
        s = (x.to(tl.float32) + r.to(tl.float32)).to(res_ptr.dtype.element_ty)
        tl.store(res_ptr + rows[:, None] * stride_om + cols[None, :], s, mask=mask)
        sf = s.to(tl.float32)
        rstd = tl.rsqrt(tl.sum(sf * sf, axis=1) / D + eps)
        w = tl.load(w_ptr + cols, mask=cols < D, other=0.0).to(tl.float32)
        y = sf * rstd[:, None] * w[None, :]
        tl.store(out_ptr + rows[:, None] * stride_om + cols[None, :], y.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        acc = tl.zeros([ROWS, BLOCK_D], dtype=tl.float32)
        for d0 in range(0, D, BLOCK_D):
            c = d0 + cols
            mask = rmask[:, None] & (c[None, :] < D)
            x = tl.load(x_ptr + rows[:, None] * stride_xm + c[None, :], mask=mask, other=0.0)
            r = tl.load(r_ptr + rows[:, None] * stride_rm + c[None, :], mask=mask, other=0.0)
            s = (x.to(tl.float32) + r.to(tl.float32)).to(res_ptr.dtype.element_ty)
            tl.store(res_ptr + rows[:, None] * stride_om + c[None, :], s, mask=mask)
            sf = s.to(tl.float32)
            acc += sf * sf
        rstd = tl.rsqrt(tl.sum(acc, axis=1) / D + eps)
        for d0 in range(0, D, BLOCK_D):
            c = d0 + cols
            mask = rmask[:, None] & (c[None, :] < D)
            sf = tl.load(res_ptr + rows[:, None] * stride_om + c[None, :], mask=mask, other=0.0).to(tl.float32)
            w = tl.load(w_ptr + c, mask=c < D, other=0.0).to(tl.float32)
            y = sf * rstd[:, None] * w[None, :]
            tl.store(out_ptr + rows[:, None] * stride_om + c[None, :], y.to(out_ptr.dtype.element_ty), mask=mask)

def fused_add_rms_norm_triton(x, residual, weight, eps):
    D = x.shape[-1]
    x2, r2 = (x.reshape(-1, D), residual.reshape(-1, D))
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    if r2.stride(-1) != 1:
        r2 = r2.contiguous()
    M = x2.shape[0]
    out = torch.empty((M, D), dtype=x.dtype, device=x.device)
    res = torch.empty((M, D), dtype=x.dtype, device=x.device)
    if M > 0:
        _farn_kernel[triton.cdiv(M, FARN_ROWS),](x2, r2, weight, out, res, M, D, x2.stride(0), r2.stride(0), out.stride(0), float(eps), BLOCK_D=FARN_BLOCK_D, ROWS=FARN_ROWS, SINGLE=FARN_BLOCK_D >= D, num_warps=FARN_NUM_WARPS)
    return (out.reshape(x.shape), res.reshape(x.shape))
_c1_DESCRIPTION = 'fused_add_rms_norm.triton_rows{FARN_BLOCK_D=2048,FARN_NUM_WARPS=8,FARN_ROWS=1}'
ARNL_BLOCK_N = 32
ARNL_BLOCK_K = 512
ARNL_BLOCK_M = 1
ARNL_SPLIT_K = 1
ARNL_NUM_WARPS = 4
ARNL_NUM_STAGES = 3
ARNL_MAX_T = 16
ARNL_TILED = 0
ARNL_TILE_M = 64
ARNL_TILE_N = 64
ARNL_TILE_K = 64
ARNL_TILE_WARPS = 4
ARNL_TILE_STAGES = 3

@triton.jit
def _arnl_gemv(x_ptr, r_ptr, g_ptr, w_ptr, b_ptr, out_ptr, res_ptr, ws_ptr, ss_ptr, M, N, K, stride_xm, stride_rm, stride_wn, stride_om, stride_res, eps, K_PER_SPLIT: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    nmask = offs_n < N
    mmask = offs_m < M
    k_begin = pid_k * K_PER_SPLIT
    w_rows = w_ptr + offs_n[:, None].to(tl.int64) * stride_wn
    rows64 = offs_m[:, None].to(tl.int64)
    res_m = tl.where(pid_n == 0, M, 0)
    resmask = offs_m < res_m
    ss = tl.zeros([BLOCK_M], dtype=tl.float32)
    if BLOCK_M == 1:
        acc2 = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K_PER_SPLIT, BLOCK_K):
        offs_k = tl.max_contiguous(tl.multiple_of(k_begin + k0 + tl.arange(0, BLOCK_K), BLOCK_K), BLOCK_K)
        kmask = offs_k < K
        xmask = mmask[:, None] & kmask[None, :]
        xv = tl.load(x_ptr + rows64 * stride_xm + offs_k[None, :], mask=xmask, other=0.0)
        rv = tl.load(r_ptr + rows64 * stride_rm + offs_k[None, :], mask=xmask, other=0.0)
        s = xv.to(tl.float32) + rv.to(tl.float32)
        tl.store(res_ptr + rows64 * stride_res + offs_k[None, :], s.to(res_ptr.dtype.element_ty), mask=resmask[:, None] & kmask[None, :])
        ss += tl.sum(s * s, axis=1)
        g = tl.load(g_ptr + offs_k, mask=kmask, other=0.0).to(tl.float32)
        a = s * g[None, :]
        w = tl.load(w_rows + offs_k[None, :], mask=nmask[:, None] & kmask[None, :], other=0.0, eviction_policy='evict_first').to(tl.float32)
        if BLOCK_M == 1:
            acc2 += w * a
        else:
            acc += tl.sum(a[:, None, :] * w[None, :, :], axis=2)
    if BLOCK_M == 1:
        acc = tl.sum(acc2, axis=1)[None, :]
    omask = mmask[:, None] & nmask[None, :]
    if SPLIT_K == 1:
        y = acc * tl.rsqrt(ss / K + eps)[:, None]
        if HAS_BIAS:
            y += tl.load(b_ptr + offs_n, mask=nmask, other=0.0).to(tl.float32)[None, :]
        tl.store(out_ptr + rows64 * stride_om + offs_n[None, :], y.to(out_ptr.dtype.element_ty), mask=omask)
    else:
        tl.store(ws_ptr + (pid_k * M + rows64) * N + offs_n[None, :], acc, mask=omask)
        tl.store(ss_ptr + pid_k * M + offs_m, ss, mask=resmask)

@triton.jit
def _arnl_reduce(ws_ptr, ss_ptr, b_ptr, out_ptr, M, N, K, stride_om, eps, HAS_BIAS: tl.constexpr, SPLIT_K: tl.constexpr, SPLIT_P2: tl.constexpr, BLOCK: tl.constexpr):
    m = tl.program_id(1).to(tl.int64)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for s in range(SPLIT_K):
        acc += tl.load(ws_ptr + (s * M + m) * N + offs, mask=mask, other=0.0)
    sp = tl.arange(0, SPLIT_P2)
    ss = tl.sum(tl.load(ss_ptr + sp * M + m, mask=sp < SPLIT_K, other=0.0), axis=0)
    y = acc * tl.rsqrt(ss / K + eps)
    if HAS_BIAS:
        y += tl.load(b_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + m * stride_om + offs, y.to(out_ptr.dtype.element_ty), mask=mask)

@triton.jit
def _arnl_tiled(x_ptr, r_ptr, g_ptr, w_ptr, b_ptr, out_ptr, res_ptr, M, N, K, stride_xm, stride_rm, stride_wn, stride_om, stride_res, eps, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr):
    pid = tl.program_id(0)
    grid_m = tl.cdiv(M, BLOCK_M)
    grid_n = tl.cdiv(N, BLOCK_N)
    group = pid // (GROUP_M * grid_n)
    first_m = group * GROUP_M
    size_m = tl.minimum(grid_m - first_m, GROUP_M)
    pid_m = first_m + pid % (GROUP_M * grid_n) % size_m
    pid_n = pid % (GROUP_M * grid_n) // size_m
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mmask = offs_m < M
    nmask = offs_n < N
    rows64 = offs_m[:, None].to(tl.int64)
    resmask = offs_m < tl.where(pid_n == 0, M, 0)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    ss = tl.zeros([BLOCK_M], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = tl.max_contiguous(tl.multiple_of(k0 + tl.arange(0, BLOCK_K), BLOCK_K), BLOCK_K)
        kmask = offs_k < K
        amask = mmask[:, None] & kmask[None, :]
        xv = tl.load(x_ptr + rows64 * stride_xm + offs_k[None, :], mask=amask, other=0.0)
        rv = tl.load(r_ptr + rows64 * stride_rm + offs_k[None, :], mask=amask, other=0.0)
        s = xv.to(tl.float32) + rv.to(tl.float32)
        tl.store(res_ptr + rows64 * stride_res + offs_k[None, :], s.to(res_ptr.dtype.element_ty), mask=resmask[:, None] & kmask[None, :])
        ss += tl.sum(s * s, axis=1)
        g = tl.load(g_ptr + offs_k, mask=kmask, other=0.0).to(tl.float32)
        a = s * g[None, :]
        b = tl.load(w_ptr + offs_n[None, :].to(tl.int64) * stride_wn + offs_k[:, None], mask=nmask[None, :] & kmask[:, None], other=0.0)
        if UPCAST:
            b = b.to(tl.float32)
        else:
            a = a.to(b.dtype)
        if IEEE:
            acc = tl.dot(a, b, acc, input_precision='ieee')
        else:
            acc = tl.dot(a, b, acc)
    y = acc * tl.rsqrt(ss / K + eps)[:, None]
    if HAS_BIAS:
        y += tl.load(b_ptr + offs_n, mask=nmask, other=0.0).to(tl.float32)[None, :]
    tl.store(out_ptr + rows64 * stride_om + offs_n[None, :], y.to(out_ptr.dtype.element_ty), mask=mmask[:, None] & nmask[None, :])

def add_rms_norm_linear_triton(x, residual, norm_weight, eps, weight, bias=None):
    H = x.shape[-1]
    N = weight.shape[0]
    x2, r2 = (x.reshape(-1, H), residual.reshape(-1, H))
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    if r2.stride(-1) != 1:
        r2 = r2.contiguous()
    if weight.stride(-1) != 1:
        weight = weight.contiguous()
    M = x2.shape[0]
    out = torch.empty((M, N), dtype=x.dtype, device=x.device)
    res = torch.empty((M, H), dtype=x.dtype, device=x.device)
    b = bias if bias is not None else out
    eps = float(eps)
    if 0 < M <= ARNL_MAX_T:
        k_per_split = triton.cdiv(triton.cdiv(H, ARNL_SPLIT_K), ARNL_BLOCK_K) * ARNL_BLOCK_K
        split = triton.cdiv(H, k_per_split)
        ws = out if split == 1 else torch.empty((split, M, N), dtype=torch.float32, device=x.device)
        ss = out if split == 1 else torch.empty((split, M), dtype=torch.float32, device=x.device)
        grid = (triton.cdiv(N, ARNL_BLOCK_N), split, triton.cdiv(M, ARNL_BLOCK_M))
        _arnl_gemv[grid](x2, r2, norm_weight, weight, b, out, res, ws, ss, M, N, H, x2.stride(0), r2.stride(0), weight.stride(0), out.stride(0), res.stride(0), eps, K_PER_SPLIT=k_per_split, HAS_BIAS=bias is not None, BLOCK_M=ARNL_BLOCK_M, BLOCK_N=ARNL_BLOCK_N, BLOCK_K=ARNL_BLOCK_K, SPLIT_K=split, num_warps=ARNL_NUM_WARPS, num_stages=ARNL_NUM_STAGES)
        if split > 1:
            _arnl_reduce[triton.cdiv(N, 1024), M](ws, ss, b, out, M, N, H, out.stride(0), eps, HAS_BIAS=bias is not None, SPLIT_K=split, SPLIT_P2=triton.next_power_of_2(split), BLOCK=1024, num_warps=4)
    elif M > ARNL_MAX_T and (not ARNL_TILED):
        s = x2.float() + r2.float()
        normed = torch.nn.functional.rms_norm(s, (H,), norm_weight.float(), eps).to(x.dtype)
        out = torch.nn.functional.linear(normed, weight, bias)
        res = s.to(x.dtype)
    elif M > ARNL_MAX_T:
        grid = (triton.cdiv(M, ARNL_TILE_M) * triton.cdiv(N, ARNL_TILE_N),)
        _arnl_tiled[grid](x2, r2, norm_weight, weight, b, out, res, M, N, H, x2.stride(0), r2.stride(0), weight.stride(0), out.stride(0), res.stride(0), eps, HAS_BIAS=bias is not None, BLOCK_M=ARNL_TILE_M, BLOCK_N=ARNL_TILE_N, BLOCK_K=ARNL_TILE_K, GROUP_M=8, UPCAST=x.device.type != 'cuda', IEEE=x.dtype == torch.float32, num_warps=ARNL_TILE_WARPS, num_stages=ARNL_TILE_STAGES)
    return (out.reshape(*x.shape[:-1], N), res.reshape(x.shape))
_c2_DESCRIPTION = 'add_rms_norm_linear.triton_fused{ARNL_BLOCK_K=512,ARNL_BLOCK_M=1,ARNL_BLOCK_N=32,ARNL_MAX_T=16,ARNL_NUM_STAGES=3,ARNL_NUM_WARPS=4,ARNL_SPLIT_K=1,ARNL_TILED=0,ARNL_TILE_K=64,ARNL_TILE_M=64,ARNL_TILE_N=64,ARNL_TILE_STAGES=3,ARNL_TILE_WARPS=4}'
ATTD_BLOCK_T = 16
ATTD_NUM_SPLITS = 0
ATTD_NUM_WARPS = 4
ATTD_NUM_STAGES = 2
ATTD_DOT = True
ATTD_PDL = 0

def _attd_pdl(q) -> bool:
    """Programmatic dependent launch: asked for, and a GPU that has it (SM90+)."""
    return bool(ATTD_PDL) and q.is_cuda and (torch.cuda.get_device_capability(q.device)[0] >= 9)
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
def _attd_kernel(q_ptr, k_ptr, v_ptr, bt_ptr, cl_ptr, out_ptr, po_ptr, pl_ptr, scale, tokens_per_split, stride_qb, stride_qh, stride_kn, stride_kt, stride_kh, stride_vn, stride_vt, stride_vh, stride_bt, stride_ob, stride_oh, Hq, DH, DV, G: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_DH: tl.constexpr, BLOCK_DV: tl.constexpr, PAGE: tl.constexpr, BLOCK_T: tl.constexpr, NUM_SPLITS: tl.constexpr, DOT: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr, GDC: tl.constexpr):
    if GDC:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    b = tl.program_id(0)
    hk = tl.program_id(1)
    s = tl.program_id(2)
    ctx = tl.load(cl_ptr + b)
    start = s * tokens_per_split
    end = tl.minimum(start + tokens_per_split, ctx)
    offs_g = tl.arange(0, BLOCK_G)
    gmask = offs_g < G
    heads = hk * G + offs_g
    dh = tl.arange(0, BLOCK_DH)
    dv = tl.arange(0, BLOCK_DV)
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + dh[None, :], mask=gmask[:, None] & (dh[None, :] < DH), other=0.0).to(tl.float32) * scale
    m = tl.full([BLOCK_G], -1e+30, dtype=tl.float32)
    l = tl.zeros([BLOCK_G], dtype=tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_DV], dtype=tl.float32)
    for t0 in range(start, end, BLOCK_T):
        offs_t = t0 + tl.arange(0, BLOCK_T)
        tmask = offs_t < end
        page = tl.load(bt_ptr + b * stride_bt + offs_t // PAGE, mask=tmask, other=0).to(tl.int64)
        slot = offs_t % PAGE
        kk = tl.load(k_ptr + page[:, None] * stride_kn + slot[:, None] * stride_kt + hk * stride_kh + dh[None, :], mask=tmask[:, None] & (dh[None, :] < DH), other=0.0).to(tl.float32)
        vv = tl.load(v_ptr + page[:, None] * stride_vn + slot[:, None] * stride_vt + hk * stride_vh + dv[None, :], mask=tmask[:, None] & (dv[None, :] < DV), other=0.0).to(tl.float32)
        if DOT:
            sc = _attd_dot(q, tl.trans(kk), k_ptr, UPCAST, IEEE)
        else:
            sc = tl.sum(q[:, None, :] * kk[None, :, :], axis=2)
        sc = tl.where(tmask[None, :], sc, float('-inf'))
        m_new = tl.maximum(m, tl.max(sc, axis=1))
        p = tl.exp(sc - m_new[:, None])
        alpha = tl.exp(m - m_new)
        l = l * alpha + tl.sum(p, axis=1)
        if DOT:
            pv = _attd_dot(p, vv, v_ptr, UPCAST, IEEE)
        else:
            pv = tl.sum(p[:, :, None] * vv[None, :, :], axis=1)
        acc = acc * alpha[:, None] + pv
        m = m_new
    safe_l = tl.where(l > 0, l, 1.0)
    o = acc / safe_l[:, None]
    omask = gmask[:, None] & (dv[None, :] < DV)
    if NUM_SPLITS == 1:
        tl.store(out_ptr + b * stride_ob + heads[:, None] * stride_oh + dv[None, :], o.to(out_ptr.dtype.element_ty), mask=omask)
    else:
        row = (b * Hq + heads) * NUM_SPLITS + s
        tl.store(po_ptr + row[:, None] * BLOCK_DV + dv[None, :], o, mask=omask)
        lse = tl.where(l > 0, m + tl.log(safe_l), float('-inf'))
        tl.store(pl_ptr + row, lse, mask=gmask)

@triton.jit
def _attd_dot(a, b, kv_ptr, UPCAST: tl.constexpr, IEEE: tl.constexpr):
    """a @ b in fp32: operands in the cache dtype on tensor cores (fp32 in the CPU interpreter,
    whose 16-bit dot is wrong; full fp32 precision for fp32 caches)."""
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32))
    elif IEEE:
        return tl.dot(a, b, input_precision='ieee')
    else:
        return tl.dot(a.to(kv_ptr.dtype.element_ty), b.to(kv_ptr.dtype.element_ty))

@triton.jit
def _attd_merge(po_ptr, pl_ptr, out_ptr, Hq, DV, stride_ob, stride_oh, NUM_SPLITS: tl.constexpr, BLOCK_DV: tl.constexpr, GDC: tl.constexpr):
    if GDC:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    b = tl.program_id(0)
    h = tl.program_id(1)
    sp = tl.arange(0, NUM_SPLITS)
    row = (b * Hq + h) * NUM_SPLITS + sp
    lse = tl.load(pl_ptr + row)
    mx = tl.max(lse, axis=0)
    mx = tl.where(mx > float('-inf'), mx, 0.0)
    w = tl.exp(lse - mx)
    dv = tl.arange(0, BLOCK_DV)
    o = tl.load(po_ptr + row[:, None] * BLOCK_DV + dv[None, :], mask=(w[:, None] > 0) & (dv[None, :] < DV), other=0.0)
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
    launch = {'launch_pdl': True} if pdl else {}
    _attd_kernel[B, Hk, splits](q, k_cache, v_cache, block_tables, context_lens, out, po, pl, float(scale), tokens_per_split, q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), block_tables.stride(0), out.stride(0), out.stride(1), Hq, DH, DV, G=G, BLOCK_G=block_g, BLOCK_DH=max(16, triton.next_power_of_2(DH)), BLOCK_DV=BLOCK_DV, PAGE=PAGE, BLOCK_T=ATTD_BLOCK_T, NUM_SPLITS=splits, DOT=ATTD_DOT, UPCAST=q.device.type != 'cuda', IEEE=q.dtype == torch.float32, GDC=pdl, num_warps=ATTD_NUM_WARPS, num_stages=ATTD_NUM_STAGES, **launch)
    if splits > 1:
        _attd_merge[B, Hq](po, pl, out, Hq, DV, out.stride(0), out.stride(1), NUM_SPLITS=splits, BLOCK_DV=BLOCK_DV, GDC=pdl, num_warps=1, **launch)
    return out
_c3_DESCRIPTION = 'attention_decode.triton_splitkv{ATTD_BLOCK_T=16,ATTD_DOT=True,ATTD_NUM_SPLITS=0,ATTD_NUM_STAGES=2,ATTD_NUM_WARPS=4,ATTD_PDL=0}'
SML_BLOCK_N = 8
SML_BLOCK_K = 512
SML_BLOCK_M = 1
SML_SPLIT_K = 2
SML_NUM_WARPS = 4
SML_NUM_STAGES = 3
SML_MAX_T = 16
SML_TILED = 0
SML_TILE_M = 64
SML_TILE_N = 128
SML_TILE_K = 64
SML_TILE_WARPS = 4
SML_TILE_STAGES = 3
SML_PDL = 0

@triton.jit
def _sml_act(x_ptr, rows64, stride_xm, I, offs_k, mask):
    """silu(gate) * up of the [rows, k] tile in fp32."""
    g = tl.load(x_ptr + rows64 * stride_xm + offs_k[None, :], mask=mask, other=0.0).to(tl.float32)
    u = tl.load(x_ptr + rows64 * stride_xm + I + offs_k[None, :], mask=mask, other=0.0).to(tl.float32)
    return g / (1.0 + tl.exp(-g)) * u

def _sml_pdl(x) -> bool:
    """Programmatic dependent launch: asked for, and a GPU that has it (SM90+)."""
    return bool(SML_PDL) and x.is_cuda and (torch.cuda.get_device_capability(x.device)[0] >= 9)

@triton.jit
def _sml_w(w_rows, offs_k, nmask, kmask):
    """The [BLOCK_N, BLOCK_K] weight tile at ``offs_k`` in fp32 (streamed once: evicted first)."""
    return tl.load(w_rows + offs_k[None, :], mask=nmask[:, None] & kmask[None, :], other=0.0, eviction_policy='evict_first').to(tl.float32)

@triton.jit
def _sml_gemv(x_ptr, w_ptr, out_ptr, ws_ptr, M, N, I, stride_xm, stride_wn, stride_om, K_PER_SPLIT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr, PEEL: tl.constexpr, GDC: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    nmask = offs_n < N
    mmask = offs_m < M
    k_begin = pid_k * K_PER_SPLIT
    w_rows = w_ptr + offs_n[:, None].to(tl.int64) * stride_wn
    rows64 = offs_m[:, None].to(tl.int64)
    if BLOCK_M == 1:
        acc2 = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    k_start = 0
    if PEEL:
        offs_k = tl.max_contiguous(tl.multiple_of(k_begin + tl.arange(0, BLOCK_K), BLOCK_K), BLOCK_K)
        kmask = offs_k < I
        w = _sml_w(w_rows, offs_k, nmask, kmask)
        if GDC:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        a = _sml_act(x_ptr, rows64, stride_xm, I, offs_k, mmask[:, None] & kmask[None, :])
        if BLOCK_M == 1:
            acc2 += w * a
        else:
            acc += tl.sum(a[:, None, :] * w[None, :, :], axis=2)
        k_start = BLOCK_K
    for k0 in range(k_start, K_PER_SPLIT, BLOCK_K):
        offs_k = tl.max_contiguous(tl.multiple_of(k_begin + k0 + tl.arange(0, BLOCK_K), BLOCK_K), BLOCK_K)
        kmask = offs_k < I
        a = _sml_act(x_ptr, rows64, stride_xm, I, offs_k, mmask[:, None] & kmask[None, :])
        w = _sml_w(w_rows, offs_k, nmask, kmask)
        if BLOCK_M == 1:
            acc2 += w * a
        else:
            acc += tl.sum(a[:, None, :] * w[None, :, :], axis=2)
    if BLOCK_M == 1:
        acc = tl.sum(acc2, axis=1)[None, :]
    omask = mmask[:, None] & nmask[None, :]
    if SPLIT_K == 1:
        tl.store(out_ptr + rows64 * stride_om + offs_n[None, :], acc.to(out_ptr.dtype.element_ty), mask=omask)
    else:
        tl.store(ws_ptr + (pid_k * M + rows64) * N + offs_n[None, :], acc, mask=omask)

@triton.jit
def _sml_reduce(ws_ptr, out_ptr, M, N, stride_om, SPLIT_K: tl.constexpr, BLOCK: tl.constexpr, GDC: tl.constexpr):
    if GDC:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    m = tl.program_id(1).to(tl.int64)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for s in range(SPLIT_K):
        acc += tl.load(ws_ptr + (s * M + m) * N + offs, mask=mask, other=0.0)
    tl.store(out_ptr + m * stride_om + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)

@triton.jit
def _sml_tiled(x_ptr, w_ptr, out_ptr, M, N, I, stride_xm, stride_wn, stride_om, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr):
    pid = tl.program_id(0)
    grid_m = tl.cdiv(M, BLOCK_M)
    grid_n = tl.cdiv(N, BLOCK_N)
    group = pid // (GROUP_M * grid_n)
    first_m = group * GROUP_M
    size_m = tl.minimum(grid_m - first_m, GROUP_M)
    pid_m = first_m + pid % (GROUP_M * grid_n) % size_m
    pid_n = pid % (GROUP_M * grid_n) // size_m
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mmask = offs_m < M
    nmask = offs_n < N
    rows64 = offs_m[:, None].to(tl.int64)
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, I, BLOCK_K):
        offs_k = tl.max_contiguous(tl.multiple_of(k0 + tl.arange(0, BLOCK_K), BLOCK_K), BLOCK_K)
        kmask = offs_k < I
        a = _sml_act(x_ptr, rows64, stride_xm, I, offs_k, mmask[:, None] & kmask[None, :])
        b = tl.load(w_ptr + offs_n[None, :].to(tl.int64) * stride_wn + offs_k[:, None], mask=nmask[None, :] & kmask[:, None], other=0.0)
        if UPCAST:
            b = b.to(tl.float32)
        else:
            a = a.to(b.dtype)
        if IEEE:
            acc = tl.dot(a, b, acc, input_precision='ieee')
        else:
            acc = tl.dot(a, b, acc)
    tl.store(out_ptr + rows64 * stride_om + offs_n[None, :], acc.to(out_ptr.dtype.element_ty), mask=mmask[:, None] & nmask[None, :])

def silu_mul_linear_triton(x, weight):
    I = x.shape[-1] // 2
    N = weight.shape[0]
    x2 = x.reshape(-1, 2 * I)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    if weight.stride(-1) != 1:
        weight = weight.contiguous()
    M = x2.shape[0]
    out = torch.empty((M, N), dtype=x.dtype, device=x.device)
    if 0 < M <= SML_MAX_T:
        k_per_split = triton.cdiv(triton.cdiv(I, SML_SPLIT_K), SML_BLOCK_K) * SML_BLOCK_K
        split = triton.cdiv(I, k_per_split)
        ws = out if split == 1 else torch.empty((split, M, N), dtype=torch.float32, device=x.device)
        grid = (triton.cdiv(N, SML_BLOCK_N), split, triton.cdiv(M, SML_BLOCK_M))
        peel, pdl = (bool(SML_PDL), _sml_pdl(x))
        launch = {'launch_pdl': True} if pdl else {}
        _sml_gemv[grid](x2, weight, out, ws, M, N, I, x2.stride(0), weight.stride(0), out.stride(0), K_PER_SPLIT=k_per_split, BLOCK_M=SML_BLOCK_M, BLOCK_N=SML_BLOCK_N, BLOCK_K=SML_BLOCK_K, SPLIT_K=split, PEEL=peel, GDC=pdl, num_warps=SML_NUM_WARPS, num_stages=SML_NUM_STAGES, **launch)
        if split > 1:
            _sml_reduce[triton.cdiv(N, 1024), M](ws, out, M, N, out.stride(0), SPLIT_K=split, BLOCK=1024, GDC=pdl, num_warps=4, **launch)
    elif M > SML_MAX_T and (not SML_TILED):
        gate, up = x2.float().chunk(2, dim=-1)
        out = torch.nn.functional.linear((torch.nn.functional.silu(gate) * up).to(x.dtype), weight)
    elif M > SML_MAX_T:
        grid = (triton.cdiv(M, SML_TILE_M) * triton.cdiv(N, SML_TILE_N),)
        _sml_tiled[grid](x2, weight, out, M, N, I, x2.stride(0), weight.stride(0), out.stride(0), BLOCK_M=SML_TILE_M, BLOCK_N=SML_TILE_N, BLOCK_K=SML_TILE_K, GROUP_M=8, UPCAST=x.device.type != 'cuda', IEEE=x.dtype == torch.float32, num_warps=SML_TILE_WARPS, num_stages=SML_TILE_STAGES)
    return out.reshape(*x.shape[:-1], N)
_c4_DESCRIPTION = 'silu_mul_linear.triton_fused{SML_BLOCK_K=512,SML_BLOCK_M=1,SML_BLOCK_N=8,SML_MAX_T=16,SML_NUM_STAGES=3,SML_NUM_WARPS=4,SML_PDL=0,SML_SPLIT_K=2,SML_TILED=0,SML_TILE_K=64,SML_TILE_M=64,SML_TILE_N=128,SML_TILE_STAGES=3,SML_TILE_WARPS=4}'
OVERRIDES = {'add_rms_norm_qkv_rotary': add_rms_norm_qkv_rotary_triton, 'fused_add_rms_norm': fused_add_rms_norm_triton, 'add_rms_norm_linear': add_rms_norm_linear_triton, 'attention_decode': attention_decode_triton, 'silu_mul_linear': silu_mul_linear_triton}
DESCRIPTION = 'composed: seed:seed:offline-kernel-0-add_rms_norm_qkv_rotary-190-add_rms_norm_qkv_rotary-1-add_rms_norm_qkv_rotary-1; seed:offline-kernel-0-fused_add_rms_norm-23-fused_add_rms_norm-2; seed:seed:seed:offline-kernel-2-add_rms_norm_linear-4-add_rms_norm_linear-1-add_rms_norm_linear-3-add_rms_norm_linear-4; seed:offline-kernel-2-attention_decode-46-attention_decode-3; offline-kernel-0-silu_mul_linear-18'
