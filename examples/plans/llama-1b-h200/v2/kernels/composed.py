"""tkcc composed plan: 2 accepted optimization(s): offline-kernel-2-add_rms_norm_linear-4, offline-kernel-2-rotary_embedding-12. Generated; do not edit."""
import math
import torch
import triton
import triton.language as tl
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
_c0_DESCRIPTION = 'add_rms_norm_linear.triton_fused{ARNL_BLOCK_K=512,ARNL_BLOCK_M=1,ARNL_BLOCK_N=32,ARNL_MAX_T=16,ARNL_NUM_STAGES=3,ARNL_NUM_WARPS=4,ARNL_SPLIT_K=1,ARNL_TILED=0,ARNL_TILE_K=64,ARNL_TILE_M=64,ARNL_TILE_N=64,ARNL_TILE_STAGES=3,ARNL_TILE_WARPS=4}'
ROPE_HEADS = 2
ROPE_NUM_WARPS = 4

@triton.jit
def _rope_heads(src_ptr, dst_ptr, h0, H, stride_st, stride_sh, t, cos, sin, Dh, HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, PASS: tl.constexpr, BLOCK_PASS: tl.constexpr, HEADS: tl.constexpr):
    heads = h0 + tl.arange(0, HEADS)
    hmask = heads < H
    d = tl.arange(0, BLOCK_HALF)
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
def _rope_kernel(pos_ptr, q_ptr, k_ptr, cs_ptr, qo_ptr, ko_ptr, Hq, Hk, Dh, stride_qt, stride_qh, stride_kt, stride_kh, stride_cs, HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, PASS: tl.constexpr, BLOCK_PASS: tl.constexpr, HEADS: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1)
    nq = tl.cdiv(Hq, HEADS)
    pos = tl.load(pos_ptr + t)
    d = tl.arange(0, BLOCK_HALF)
    cmask = d < HALF
    cos = tl.load(cs_ptr + pos * stride_cs + d, mask=cmask, other=0.0).to(tl.float32)
    sin = tl.load(cs_ptr + pos * stride_cs + HALF + d, mask=cmask, other=0.0).to(tl.float32)
    if j < nq:
        _rope_heads(q_ptr, qo_ptr, j * HEADS, Hq, stride_qt, stride_qh, t, cos, sin, Dh, HALF, BLOCK_HALF, PASS, BLOCK_PASS, HEADS)
    else:
        _rope_heads(k_ptr, ko_ptr, (j - nq) * HEADS, Hk, stride_kt, stride_kh, t, cos, sin, Dh, HALF, BLOCK_HALF, PASS, BLOCK_PASS, HEADS)

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
        _rope_kernel[grid](positions, q, k, cs, qo, ko, Hq, Hk, Dh, q.stride(0), q.stride(1), k.stride(0), k.stride(1), cs.stride(0), HALF=half, BLOCK_HALF=triton.next_power_of_2(half), PASS=npass, BLOCK_PASS=triton.next_power_of_2(max(npass, 1)), HEADS=ROPE_HEADS, num_warps=ROPE_NUM_WARPS)
    return (qo, ko)
_c1_DESCRIPTION = 'rotary_embedding.triton{ROPE_HEADS=2,ROPE_NUM_WARPS=4}'
OVERRIDES = {'add_rms_norm_linear': add_rms_norm_linear_triton, 'rotary_embedding': rotary_embedding_triton}
DESCRIPTION = 'composed: offline-kernel-2-add_rms_norm_linear-4; offline-kernel-2-rotary_embedding-12'
