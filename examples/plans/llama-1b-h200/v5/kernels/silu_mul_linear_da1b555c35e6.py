"""tkcc candidate rendered from the template library: silu_mul_linear.triton_fused{SML_BLOCK_K=512,SML_BLOCK_M=1,SML_BLOCK_N=8,SML_MAX_T=16,SML_NUM_STAGES=3,SML_NUM_WARPS=4,SML_PDL=0,SML_SPLIT_K=2,SML_TILED=0,SML_TILE_K=64,SML_TILE_M=64,SML_TILE_N=128,SML_TILE_STAGES=3,SML_TILE_WARPS=4}"""

import math
import torch
import triton
import triton.language as tl


# ======== silu_mul_linear.triton_fused{SML_BLOCK_K=512,SML_BLOCK_M=1,SML_BLOCK_N=8,SML_MAX_T=16,SML_NUM_STAGES=3,SML_NUM_WARPS=4,SML_PDL=0,SML_SPLIT_K=2,SML_TILED=0,SML_TILE_K=64,SML_TILE_M=64,SML_TILE_N=128,SML_TILE_STAGES=3,SML_TILE_WARPS=4}
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
    return bool(SML_PDL) and x.is_cuda and torch.cuda.get_device_capability(x.device)[0] >= 9


@triton.jit
def _sml_w(w_rows, offs_k, nmask, kmask):
    """The [BLOCK_N, BLOCK_K] weight tile at ``offs_k`` in fp32 (streamed once: evicted first)."""
    return tl.load(w_rows + offs_k[None, :], mask=nmask[:, None] & kmask[None, :], other=0.0,
                   eviction_policy="evict_first").to(tl.float32)


@triton.jit
def _sml_gemv(x_ptr, w_ptr, out_ptr, ws_ptr, M, N, I, stride_xm, stride_wn, stride_om,
              K_PER_SPLIT: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr, PEEL: tl.constexpr, GDC: tl.constexpr):
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
    if BLOCK_M == 1:
        acc2 = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)    # reduced once after the loop
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    k_start = 0
    if PEEL:    # first W tile before waiting for x's producer (GDC); nothing else is read or written before
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
        a = _sml_act(x_ptr, rows64, stride_xm, I, offs_k, mmask[:, None] & kmask[None, :])  # [BLOCK_M, BLOCK_K]
        w = _sml_w(w_rows, offs_k, nmask, kmask)
        if BLOCK_M == 1:
            acc2 += w * a
        else:
            acc += tl.sum(a[:, None, :] * w[None, :, :], axis=2)
    if BLOCK_M == 1:
        acc = tl.sum(acc2, axis=1)[None, :]                       # [1, BLOCK_N]
    omask = mmask[:, None] & nmask[None, :]
    if SPLIT_K == 1:
        tl.store(out_ptr + rows64 * stride_om + offs_n[None, :], acc.to(out_ptr.dtype.element_ty), mask=omask)
    else:
        tl.store(ws_ptr + (pid_k * M + rows64) * N + offs_n[None, :], acc, mask=omask)


@triton.jit
def _sml_reduce(ws_ptr, out_ptr, M, N, stride_om, SPLIT_K: tl.constexpr, BLOCK: tl.constexpr, GDC: tl.constexpr):
    if GDC:     # launched early; the partials are read only once the GEMV has finished
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    m = tl.program_id(1).to(tl.int64)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for s in range(SPLIT_K):                                      # fixed order: deterministic
        acc += tl.load(ws_ptr + (s * M + m) * N + offs, mask=mask, other=0.0)
    tl.store(out_ptr + m * stride_om + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)


@triton.jit
def _sml_tiled(x_ptr, w_ptr, out_ptr, M, N, I, stride_xm, stride_wn, stride_om,
               BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
               UPCAST: tl.constexpr, IEEE: tl.constexpr):
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
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, I, BLOCK_K):
        offs_k = tl.max_contiguous(tl.multiple_of(k0 + tl.arange(0, BLOCK_K), BLOCK_K), BLOCK_K)
        kmask = offs_k < I
        a = _sml_act(x_ptr, rows64, stride_xm, I, offs_k, mmask[:, None] & kmask[None, :])  # A-tile prologue
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
    tl.store(out_ptr + rows64 * stride_om + offs_n[None, :], acc.to(out_ptr.dtype.element_ty),
             mask=mmask[:, None] & nmask[None, :])


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
        peel, pdl = bool(SML_PDL), _sml_pdl(x)     # the peeled first tile is testable on CPU
        launch = {"launch_pdl": True} if pdl else {}
        _sml_gemv[grid](x2, weight, out, ws, M, N, I, x2.stride(0), weight.stride(0), out.stride(0),
                        K_PER_SPLIT=k_per_split, BLOCK_M=SML_BLOCK_M, BLOCK_N=SML_BLOCK_N, BLOCK_K=SML_BLOCK_K,
                        SPLIT_K=split, PEEL=peel, GDC=pdl, num_warps=SML_NUM_WARPS, num_stages=SML_NUM_STAGES, **launch)
        if split > 1:
            _sml_reduce[(triton.cdiv(N, 1024), M)](ws, out, M, N, out.stride(0), SPLIT_K=split, BLOCK=1024,
                                                   GDC=pdl, num_warps=4, **launch)
    elif M > SML_MAX_T and not SML_TILED:
        gate, up = x2.float().chunk(2, dim=-1)
        out = torch.nn.functional.linear((torch.nn.functional.silu(gate) * up).to(x.dtype), weight)
    elif M > SML_MAX_T:
        grid = (triton.cdiv(M, SML_TILE_M) * triton.cdiv(N, SML_TILE_N),)
        _sml_tiled[grid](x2, weight, out, M, N, I, x2.stride(0), weight.stride(0), out.stride(0),
                         BLOCK_M=SML_TILE_M, BLOCK_N=SML_TILE_N, BLOCK_K=SML_TILE_K, GROUP_M=8,
                         UPCAST=x.device.type != "cuda", IEEE=x.dtype == torch.float32,
                         num_warps=SML_TILE_WARPS, num_stages=SML_TILE_STAGES)
    return out.reshape(*x.shape[:-1], N)


OVERRIDES = {'silu_mul_linear': silu_mul_linear_triton}
DESCRIPTION = 'silu_mul_linear.triton_fused{SML_BLOCK_K=512,SML_BLOCK_M=1,SML_BLOCK_N=8,SML_MAX_T=16,SML_NUM_STAGES=3,SML_NUM_WARPS=4,SML_PDL=0,SML_SPLIT_K=2,SML_TILED=0,SML_TILE_K=64,SML_TILE_M=64,SML_TILE_N=128,SML_TILE_STAGES=3,SML_TILE_WARPS=4}'
