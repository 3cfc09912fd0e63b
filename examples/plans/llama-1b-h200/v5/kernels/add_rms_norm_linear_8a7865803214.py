"""tkcc candidate rendered from the template library: add_rms_norm_linear.triton_fused{ARNL_BLOCK_K=512,ARNL_BLOCK_M=1,ARNL_BLOCK_N=32,ARNL_MAX_T=16,ARNL_NUM_STAGES=3,ARNL_NUM_WARPS=4,ARNL_SPLIT_K=1,ARNL_TILED=0,ARNL_TILE_K=64,ARNL_TILE_M=64,ARNL_TILE_N=64,ARNL_TILE_STAGES=3,ARNL_TILE_WARPS=4}"""

import math
import torch
import triton
import triton.language as tl


# ======== add_rms_norm_linear.triton_fused{ARNL_BLOCK_K=512,ARNL_BLOCK_M=1,ARNL_BLOCK_N=32,ARNL_MAX_T=16,ARNL_NUM_STAGES=3,ARNL_NUM_WARPS=4,ARNL_SPLIT_K=1,ARNL_TILED=0,ARNL_TILE_K=64,ARNL_TILE_M=64,ARNL_TILE_N=64,ARNL_TILE_STAGES=3,ARNL_TILE_WARPS=4}
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
def _arnl_gemv(x_ptr, r_ptr, g_ptr, w_ptr, b_ptr, out_ptr, res_ptr, ws_ptr, ss_ptr, M, N, K,
               stride_xm, stride_rm, stride_wn, stride_om, stride_res, eps,
               K_PER_SPLIT: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr,
               BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr):
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
    res_m = tl.where(pid_n == 0, M, 0)                           # rows of s this program writes
    resmask = offs_m < res_m                                     # (only the pid_n == 0 column)
    ss = tl.zeros([BLOCK_M], dtype=tl.float32)
    if BLOCK_M == 1:
        acc2 = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)    # reduced once after the loop
    else:
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
                    eviction_policy="evict_first").to(tl.float32)
        if BLOCK_M == 1:
            acc2 += w * a
        else:
            acc += tl.sum(a[:, None, :] * w[None, :, :], axis=2)
    if BLOCK_M == 1:
        acc = tl.sum(acc2, axis=1)[None, :]                       # [1, BLOCK_N]
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
def _arnl_reduce(ws_ptr, ss_ptr, b_ptr, out_ptr, M, N, K, stride_om, eps, HAS_BIAS: tl.constexpr,
                 SPLIT_K: tl.constexpr, SPLIT_P2: tl.constexpr, BLOCK: tl.constexpr):
    m = tl.program_id(1).to(tl.int64)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for s in range(SPLIT_K):                                      # fixed order: deterministic
        acc += tl.load(ws_ptr + (s * M + m) * N + offs, mask=mask, other=0.0)
    sp = tl.arange(0, SPLIT_P2)
    ss = tl.sum(tl.load(ss_ptr + sp * M + m, mask=sp < SPLIT_K, other=0.0), axis=0)
    y = acc * tl.rsqrt(ss / K + eps)
    if HAS_BIAS:
        y += tl.load(b_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + m * stride_om + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _arnl_tiled(x_ptr, r_ptr, g_ptr, w_ptr, b_ptr, out_ptr, res_ptr, M, N, K,
                stride_xm, stride_rm, stride_wn, stride_om, stride_res, eps,
                HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr):
    pid = tl.program_id(0)
    grid_m = tl.cdiv(M, BLOCK_M)
    grid_n = tl.cdiv(N, BLOCK_N)
    group = pid // (GROUP_M * grid_n)                            # GROUP_M row blocks share W tiles in L2
    first_m = group * GROUP_M
    size_m = tl.minimum(grid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % (GROUP_M * grid_n)) % size_m
    pid_n = (pid % (GROUP_M * grid_n)) // size_m
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mmask = offs_m < M
    nmask = offs_n < N
    rows64 = offs_m[:, None].to(tl.int64)
    resmask = offs_m < tl.where(pid_n == 0, M, 0)               # only the pid_n == 0 column writes s
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    ss = tl.zeros([BLOCK_M], dtype=tl.float32)
    for k0 in range(0, K, BLOCK_K):
        offs_k = tl.max_contiguous(tl.multiple_of(k0 + tl.arange(0, BLOCK_K), BLOCK_K), BLOCK_K)
        kmask = offs_k < K
        amask = mmask[:, None] & kmask[None, :]
        xv = tl.load(x_ptr + rows64 * stride_xm + offs_k[None, :], mask=amask, other=0.0)
        rv = tl.load(r_ptr + rows64 * stride_rm + offs_k[None, :], mask=amask, other=0.0)
        s = xv.to(tl.float32) + rv.to(tl.float32)                 # [BLOCK_M, BLOCK_K] A-tile prologue
        tl.store(res_ptr + rows64 * stride_res + offs_k[None, :], s.to(res_ptr.dtype.element_ty),
                 mask=resmask[:, None] & kmask[None, :])
        ss += tl.sum(s * s, axis=1)
        g = tl.load(g_ptr + offs_k, mask=kmask, other=0.0).to(tl.float32)
        a = s * g[None, :]
        b = tl.load(w_ptr + offs_n[None, :].to(tl.int64) * stride_wn + offs_k[:, None],
                    mask=nmask[None, :] & kmask[:, None], other=0.0)  # [BLOCK_K, BLOCK_N]
        if UPCAST:      # the CPU interpreter's bf16 dot is wrong; fp32 there (never on a GPU)
            b = b.to(tl.float32)
        else:
            a = a.to(b.dtype)
        if IEEE:        # fp32 inputs: full precision, not tf32
            acc = tl.dot(a, b, acc, input_precision="ieee")
        else:
            acc = tl.dot(a, b, acc)
    y = acc * tl.rsqrt(ss / K + eps)[:, None]
    if HAS_BIAS:
        y += tl.load(b_ptr + offs_n, mask=nmask, other=0.0).to(tl.float32)[None, :]
    tl.store(out_ptr + rows64 * stride_om + offs_n[None, :], y.to(out_ptr.dtype.element_ty),
             mask=mmask[:, None] & nmask[None, :])


def add_rms_norm_linear_triton(x, residual, norm_weight, eps, weight, bias=None):
    H = x.shape[-1]
    N = weight.shape[0]
    x2, r2 = x.reshape(-1, H), residual.reshape(-1, H)
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
        _arnl_gemv[grid](x2, r2, norm_weight, weight, b, out, res, ws, ss, M, N, H, x2.stride(0), r2.stride(0),
                         weight.stride(0), out.stride(0), res.stride(0), eps, K_PER_SPLIT=k_per_split,
                         HAS_BIAS=bias is not None, BLOCK_M=ARNL_BLOCK_M, BLOCK_N=ARNL_BLOCK_N,
                         BLOCK_K=ARNL_BLOCK_K, SPLIT_K=split, num_warps=ARNL_NUM_WARPS,
                         num_stages=ARNL_NUM_STAGES)
        if split > 1:
            _arnl_reduce[(triton.cdiv(N, 1024), M)](ws, ss, b, out, M, N, H, out.stride(0), eps,
                                                    HAS_BIAS=bias is not None, SPLIT_K=split,
                                                    SPLIT_P2=triton.next_power_of_2(split), BLOCK=1024,
                                                    num_warps=4)
    elif M > ARNL_MAX_T and not ARNL_TILED:
        s = x2.float() + r2.float()                                        # [T, H] fp32
        normed = torch.nn.functional.rms_norm(s, (H,), norm_weight.float(), eps).to(x.dtype)
        out = torch.nn.functional.linear(normed, weight, bias)
        res = s.to(x.dtype)
    elif M > ARNL_MAX_T:
        grid = (triton.cdiv(M, ARNL_TILE_M) * triton.cdiv(N, ARNL_TILE_N),)
        _arnl_tiled[grid](x2, r2, norm_weight, weight, b, out, res, M, N, H, x2.stride(0), r2.stride(0),
                          weight.stride(0), out.stride(0), res.stride(0), eps, HAS_BIAS=bias is not None,
                          BLOCK_M=ARNL_TILE_M, BLOCK_N=ARNL_TILE_N, BLOCK_K=ARNL_TILE_K, GROUP_M=8,
                          UPCAST=x.device.type != "cuda", IEEE=x.dtype == torch.float32,
                          num_warps=ARNL_TILE_WARPS, num_stages=ARNL_TILE_STAGES)
    return out.reshape(*x.shape[:-1], N), res.reshape(x.shape)


OVERRIDES = {'add_rms_norm_linear': add_rms_norm_linear_triton}
DESCRIPTION = 'add_rms_norm_linear.triton_fused{ARNL_BLOCK_K=512,ARNL_BLOCK_M=1,ARNL_BLOCK_N=32,ARNL_MAX_T=16,ARNL_NUM_STAGES=3,ARNL_NUM_WARPS=4,ARNL_SPLIT_K=1,ARNL_TILED=0,ARNL_TILE_K=64,ARNL_TILE_M=64,ARNL_TILE_N=64,ARNL_TILE_STAGES=3,ARNL_TILE_WARPS=4}'
