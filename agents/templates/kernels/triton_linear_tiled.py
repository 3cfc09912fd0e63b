"""linear as a tiled tensor-core GEMM in Triton with optional split-K (prefill chunks and larger
decode batches).

Grid (cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N), SPLIT_K) with GROUP_M row swizzling for L2 reuse; each
program accumulates ``tl.dot`` of [BLOCK_M, BLOCK_K] x [BLOCK_K, BLOCK_N] tiles in fp32 over its K
slice. SPLIT_K > 1 writes fp32 partials to a [SPLIT_K, M, N] workspace summed in a fixed order by a
second kernel (deterministic). FLOPs 2*M*N*K; bytes N*K + M*K + M*N elements.
"""

import torch
import triton
import triton.language as tl

# ---- section ----
TILE_BLOCK_M = 16
TILE_BLOCK_N = 64
TILE_BLOCK_K = 64
TILE_SPLIT_K = 1
TILE_GROUP_M = 8
TILE_NUM_WARPS = 4
TILE_NUM_STAGES = 3


@triton.jit
def _tile_kernel(x_ptr, w_ptr, b_ptr, out_ptr, ws_ptr, M, N, K, stride_xm, stride_wn, stride_om,
                 K_PER_SPLIT: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                 SPLIT_K: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr):
    pid = tl.program_id(0)
    pid_k = tl.program_id(1)
    grid_m = tl.cdiv(M, BLOCK_M)
    grid_n = tl.cdiv(N, BLOCK_N)
    group = pid // (GROUP_M * grid_n)
    first_m = group * GROUP_M
    size_m = tl.minimum(grid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % (GROUP_M * grid_n)) % size_m
    pid_n = (pid % (GROUP_M * grid_n)) // size_m
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mmask = offs_m < M
    nmask = offs_n < N
    k_begin = pid_k * K_PER_SPLIT
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, K_PER_SPLIT, BLOCK_K):
        offs_k = tl.max_contiguous(tl.multiple_of(k_begin + k0 + tl.arange(0, BLOCK_K), BLOCK_K), BLOCK_K)
        kmask = offs_k < K
        a = tl.load(x_ptr + offs_m[:, None].to(tl.int64) * stride_xm + offs_k[None, :],
                    mask=mmask[:, None] & kmask[None, :], other=0.0)
        b = tl.load(w_ptr + offs_n[None, :].to(tl.int64) * stride_wn + offs_k[:, None],
                    mask=nmask[None, :] & kmask[:, None], other=0.0)
        if UPCAST:      # the CPU interpreter's bf16 dot is wrong; fp32 there (never on a GPU)
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        if IEEE:        # fp32 inputs: full precision, not tf32
            acc = tl.dot(a, b, acc, input_precision="ieee")
        else:
            acc = tl.dot(a, b, acc)
    omask = mmask[:, None] & nmask[None, :]
    if SPLIT_K == 1:
        if HAS_BIAS:
            acc += tl.load(b_ptr + offs_n, mask=nmask, other=0.0).to(tl.float32)[None, :]
        tl.store(out_ptr + offs_m[:, None].to(tl.int64) * stride_om + offs_n[None, :],
                 acc.to(out_ptr.dtype.element_ty), mask=omask)
    else:
        tl.store(ws_ptr + (pid_k * M + offs_m[:, None]).to(tl.int64) * N + offs_n[None, :], acc, mask=omask)


@triton.jit
def _tile_reduce(ws_ptr, b_ptr, out_ptr, M, N, stride_om, HAS_BIAS: tl.constexpr,
                 SPLIT_K: tl.constexpr, BLOCK: tl.constexpr):
    m = tl.program_id(1).to(tl.int64)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for s in range(SPLIT_K):
        acc += tl.load(ws_ptr + (s * M + m) * N + offs, mask=mask, other=0.0)
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + m * stride_om + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)


def linear_tiled(x, weight, bias=None):
    K = x.shape[-1]
    N = weight.shape[0]
    x2 = x.reshape(-1, K)
    M = x2.shape[0]
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    if weight.stride(-1) != 1:
        weight = weight.contiguous()
    out = torch.empty((M, N), dtype=x.dtype, device=x.device)
    if M == 0:
        return out.reshape(*x.shape[:-1], N)
    k_per_split = triton.cdiv(triton.cdiv(K, TILE_SPLIT_K), TILE_BLOCK_K) * TILE_BLOCK_K
    split = triton.cdiv(K, k_per_split)
    ws = out if split == 1 else torch.empty((split, M, N), dtype=torch.float32, device=x.device)
    b = bias if bias is not None else out
    grid = (triton.cdiv(M, TILE_BLOCK_M) * triton.cdiv(N, TILE_BLOCK_N), split)
    _tile_kernel[grid](x2, weight, b, out, ws, M, N, K, x2.stride(0), weight.stride(0), out.stride(0),
                       K_PER_SPLIT=k_per_split, HAS_BIAS=bias is not None, BLOCK_M=TILE_BLOCK_M,
                       BLOCK_N=TILE_BLOCK_N, BLOCK_K=TILE_BLOCK_K, GROUP_M=TILE_GROUP_M, SPLIT_K=split,
                       UPCAST=x.device.type != "cuda", IEEE=x.dtype == torch.float32,
                       num_warps=TILE_NUM_WARPS, num_stages=TILE_NUM_STAGES)
    if split > 1:
        _tile_reduce[(triton.cdiv(N, 1024), M)](ws, b, out, M, N, out.stride(0), HAS_BIAS=bias is not None,
                                                SPLIT_K=split, BLOCK=1024, num_warps=4)
    return out.reshape(*x.shape[:-1], N)
