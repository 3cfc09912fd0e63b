"""linear for decode batches as a split-K GEMV in Triton (``y = x @ W.T + b`` with few rows).

Grid (cdiv(N, BLOCK_N), SPLIT_K, cdiv(M, BLOCK_M)). A program streams a [BLOCK_N, BLOCK_K] tile of
W per step (K contiguous: 16-byte vector loads, read once, evicted first) over its K slice. With
BLOCK_M == 1 it accumulates x*W elementwise and reduces once at the end (no per-step shuffles);
otherwise it reduces each [BLOCK_M, BLOCK_N, BLOCK_K] product. With SPLIT_K > 1 the fp32 partials
go to a [SPLIT_K, M, N] workspace and a second kernel sums them in a fixed order (deterministic),
adds the bias and casts. Rows above ``GEMV_MAX_M`` (prefill) go to torch's GEMM, which is
compute-bound there. Bytes: N*K weights (dominant) + M*K + M*N; the floor is N*K*2/bandwidth.
``GEMV_PDL`` = 1 (SM90+ GPUs; ignored elsewhere): both kernels are launched with programmatic dependent
launch; the GEMV loads its first W tile (written by no kernel) before ``gdc_wait`` (the previous
kernel, which produced x, done and flushed) and everything else after, so its launch and first
weight bytes overlap the previous kernel's tail. On CPU the same setting runs the peeled first tile.
"""

import torch
import triton
import triton.language as tl

# ---- section ----
GEMV_BLOCK_N = 16
GEMV_BLOCK_K = 512
GEMV_BLOCK_M = 1
GEMV_SPLIT_K = 4
GEMV_NUM_WARPS = 4
GEMV_NUM_STAGES = 3
GEMV_MAX_M = 16
GEMV_PDL = 0                 # 1: programmatic dependent launch (SM90+)


def _gemv_pdl(x) -> bool:
    """Programmatic dependent launch: asked for, and a GPU that has it (SM90+)."""
    return bool(GEMV_PDL) and x.is_cuda and torch.cuda.get_device_capability(x.device)[0] >= 9


@triton.jit
def _gemv_tile(rows, offs_k, rmask, kmask, STREAM: tl.constexpr):
    """[rows, BLOCK_K] tile at ``offs_k`` in fp32; STREAM: read once (weights), evicted first."""
    if STREAM:
        t = tl.load(rows + offs_k[None, :], mask=rmask[:, None] & kmask[None, :], other=0.0,
                    eviction_policy="evict_first")
    else:
        t = tl.load(rows + offs_k[None, :], mask=rmask[:, None] & kmask[None, :], other=0.0)
    return t.to(tl.float32)


@triton.jit
def _gemv_kernel(x_ptr, w_ptr, b_ptr, out_ptr, ws_ptr, M, N, K, stride_xm, stride_wn, stride_om,
                 K_PER_SPLIT: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr, PEEL: tl.constexpr,
                 GDC: tl.constexpr):
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)             # [BLOCK_N]
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)             # [BLOCK_M]
    nmask = offs_n < N
    mmask = offs_m < M
    k_begin = pid_k * K_PER_SPLIT
    w_rows = w_ptr + offs_n[:, None].to(tl.int64) * stride_wn
    x_rows = x_ptr + offs_m[:, None].to(tl.int64) * stride_xm
    if BLOCK_M == 1:
        acc2 = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)    # reduced once after the loop
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    k_start = 0
    if PEEL:    # first W tile before waiting for x's producer (GDC); nothing else is read or written before
        offs_k = tl.max_contiguous(tl.multiple_of(k_begin + tl.arange(0, BLOCK_K), BLOCK_K), BLOCK_K)
        kmask = offs_k < K
        w = _gemv_tile(w_rows, offs_k, nmask, kmask, True)
        if GDC:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        x = _gemv_tile(x_rows, offs_k, mmask, kmask, False)
        if BLOCK_M == 1:
            acc2 += w * x
        else:
            acc += tl.sum(x[:, None, :] * w[None, :, :], axis=2)
        k_start = BLOCK_K
    for k0 in range(k_start, K_PER_SPLIT, BLOCK_K):
        offs_k = tl.max_contiguous(tl.multiple_of(k_begin + k0 + tl.arange(0, BLOCK_K), BLOCK_K), BLOCK_K)
        kmask = offs_k < K
        w = _gemv_tile(w_rows, offs_k, nmask, kmask, True)       # [BLOCK_N, BLOCK_K]
        x = _gemv_tile(x_rows, offs_k, mmask, kmask, False)      # [BLOCK_M, BLOCK_K]
        if BLOCK_M == 1:
            acc2 += w * x
        else:
            acc += tl.sum(x[:, None, :] * w[None, :, :], axis=2)
    if BLOCK_M == 1:
        acc = tl.sum(acc2, axis=1)[None, :]                       # [1, BLOCK_N]
    omask = mmask[:, None] & nmask[None, :]
    if SPLIT_K == 1:
        if HAS_BIAS:
            acc += tl.load(b_ptr + offs_n, mask=nmask, other=0.0).to(tl.float32)[None, :]
        tl.store(out_ptr + offs_m[:, None] * stride_om + offs_n[None, :], acc.to(out_ptr.dtype.element_ty),
                 mask=omask)
    else:
        tl.store(ws_ptr + (pid_k * M + offs_m[:, None]) * N + offs_n[None, :], acc, mask=omask)


@triton.jit
def _gemv_reduce(ws_ptr, b_ptr, out_ptr, M, N, stride_om, HAS_BIAS: tl.constexpr,
                 SPLIT_K: tl.constexpr, BLOCK: tl.constexpr, GDC: tl.constexpr):
    if GDC:     # launched early; the partials are read only once the GEMV has finished
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    m = tl.program_id(1)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for s in range(SPLIT_K):
        acc += tl.load(ws_ptr + (s * M + m) * N + offs, mask=mask, other=0.0)
    if HAS_BIAS:
        acc += tl.load(b_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + m * stride_om + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)


def linear_gemv(x, weight, bias=None):
    K = x.shape[-1]
    N = weight.shape[0]
    x2 = x.reshape(-1, K)
    M = x2.shape[0]
    if M > GEMV_MAX_M or M == 0:
        return torch.nn.functional.linear(x, weight, bias)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    if weight.stride(-1) != 1:
        weight = weight.contiguous()
    out = torch.empty((M, N), dtype=x.dtype, device=x.device)
    k_per_split = triton.cdiv(triton.cdiv(K, GEMV_SPLIT_K), GEMV_BLOCK_K) * GEMV_BLOCK_K
    split = triton.cdiv(K, k_per_split)
    ws = out if split == 1 else torch.empty((split, M, N), dtype=torch.float32, device=x.device)
    b = bias if bias is not None else out
    grid = (triton.cdiv(N, GEMV_BLOCK_N), split, triton.cdiv(M, GEMV_BLOCK_M))
    peel, pdl = bool(GEMV_PDL), _gemv_pdl(x)     # the peeled first tile is testable on CPU
    launch = {"launch_pdl": True} if pdl else {}
    _gemv_kernel[grid](x2, weight, b, out, ws, M, N, K, x2.stride(0), weight.stride(0), out.stride(0),
                       K_PER_SPLIT=k_per_split, HAS_BIAS=bias is not None, BLOCK_M=GEMV_BLOCK_M,
                       BLOCK_N=GEMV_BLOCK_N, BLOCK_K=GEMV_BLOCK_K, SPLIT_K=split, PEEL=peel, GDC=pdl,
                       num_warps=GEMV_NUM_WARPS, num_stages=GEMV_NUM_STAGES, **launch)
    if split > 1:
        _gemv_reduce[(triton.cdiv(N, 1024), M)](ws, b, out, M, N, out.stride(0), HAS_BIAS=bias is not None,
                                                SPLIT_K=split, BLOCK=1024, GDC=pdl, num_warps=4, **launch)
    return out.reshape(*x.shape[:-1], N)
