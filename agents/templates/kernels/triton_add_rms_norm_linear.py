"""add_rms_norm_linear in Triton: residual add, RMSNorm and the projection in one pass over the weight.

``s = x + residual`` (fp32; written back rounded as ``new_residual``), ``out = rms_norm(s) @ W.T + b``.
The RMS scale is a per-row scalar, so it is factored out of the dot product:

    out[m, n] = rsqrt(mean_k s[m, k]^2 + eps) * sum_k (s[m, k] * g[k]) * W[n, k]  (+ b[n])

and the sum of squares is accumulated in the same K loop as the product: no prologue pass, no
second kernel for the norm, the normalised row is never written. Two paths:

- ``T <= ARNL_MAX_T`` (decode): split-K GEMV, grid (cdiv(N, BLOCK_N), SPLIT_K, cdiv(T, BLOCK_M)).
  A program streams a [BLOCK_N, BLOCK_K] tile of W per step (K contiguous, read once, evicted
  first) and the tiny x/residual rows (L2 hits after the first program). Programs with pid_n == 0
  also store new_residual for their rows and K slice. SPLIT_K > 1 writes fp32 partial products and
  partial sums of squares to a workspace that a second kernel sums in a fixed order (deterministic;
  no atomics), then scales, adds the bias and casts. Bytes: N*H weights (dominant) + 2*T*H read,
  T*(N+H) written; floor N*H*2 / bandwidth (llama-1b qkv 12.6 MB: 2.6 us at 4.8 TB/s).
- ``T > ARNL_MAX_T`` with ``ARNL_TILED`` = 2 (serving batches): the swap-AB skinny GEMM (``_sg_skinny``: W the
  MMA's large side, TILE_M the row tile, SPLIT_K slices with the GEMV's reduce or fused reduce).
- ``T > ARNL_MAX_T`` (prefill, ``ARNL_TILED`` = 1): tiled ``tl.dot`` GEMM with the add and ``* g`` in the A-tile
  prologue (the tile is rounded to the weight dtype for the tensor cores) and the rms scale in the
  epilogue; programs with pid_n == 0 store new_residual. FLOPs 2*T*N*H.
- ``ARNL_PDL`` = 1 (decode, SM90+ GPUs; ignored elsewhere): the decode kernels are launched with
  programmatic dependent launch; the GEMV loads its first W tile (written by no kernel) before
  ``gdc_wait`` (the previous kernel, which produced x, done and flushed) and everything else after.
- ``ARNL_FUSED_REDUCE`` = 1 (decode, SPLIT_K > 1): no reduce launch; every program also stores its rows'
  partial sums of squares for its own output tile, and the last of a tile's SPLIT_K programs to arrive
  (an int32 counter per tile in ``ARNL_COUNTERS``, acq_rel atomics, left zeroed) sums the partials in
  the fixed order, scales, adds the bias and stores (the same bits as the two launches).

The kernels are the linear family's (``shared_gemv.py``, add + RMSNorm prologue), inlined by the renderer.
"""

import torch

from agents.templates.kernels.shared_gemv import _sg_decode, _sg_gemm, _sg_norm_linear_torch, _sg_rows, _sg_skinny_gemm

# ---- section ----
ARNL_BLOCK_N = 8
ARNL_BLOCK_K = 512
ARNL_BLOCK_M = 1
ARNL_SPLIT_K = 1
ARNL_NUM_WARPS = 4
ARNL_NUM_STAGES = 3
ARNL_MAX_T = 1
ARNL_TILED = 0               # T > MAX_T: 1 the tl.dot GEMM below, 2 the swap-AB skinny GEMM (serving batches), 0 torch
ARNL_TILE_M = 64
ARNL_TILE_N = 64
ARNL_TILE_K = 64
ARNL_TILE_WARPS = 4
ARNL_TILE_STAGES = 3
ARNL_PDL = 0                 # 1: programmatic dependent launch of the decode kernels (SM90+)
ARNL_FUSED_REDUCE = 0        # 1: the split-K reduce in the GEMV's last-arriving programs, no second launch
ARNL_COUNTERS = {}           # (device, tiles) -> the fused reduce's int32 counters [tiles]


def add_rms_norm_linear_triton(x, residual, norm_weight, eps, weight, bias=None):
    H = x.shape[-1]
    N = weight.shape[0]
    x2, r2, weight = _sg_rows(x, H), _sg_rows(residual, H), _sg_rows(weight, H)
    M = x2.shape[0]
    out = torch.empty((M, N), dtype=x.dtype, device=x.device)
    res = torch.empty((M, H), dtype=x.dtype, device=x.device)
    eps = float(eps)
    if 0 < M <= ARNL_MAX_T:
        _sg_decode(1, x2, weight, out, H, r2=r2, g=norm_weight, res=res, bias=bias, eps=eps, block_n=ARNL_BLOCK_N,
                   block_k=ARNL_BLOCK_K, block_m=ARNL_BLOCK_M, split_k=ARNL_SPLIT_K, num_warps=ARNL_NUM_WARPS,
                   num_stages=ARNL_NUM_STAGES, pdl=ARNL_PDL, fused=ARNL_FUSED_REDUCE, counters=ARNL_COUNTERS)
    elif M > ARNL_MAX_T and not ARNL_TILED:
        out, res = _sg_norm_linear_torch(x2, r2, norm_weight, eps, weight, bias)
    elif M > ARNL_MAX_T and ARNL_TILED == 2:
        _sg_skinny_gemm(1, x2, weight, out, H, r2=r2, g=norm_weight, res=res, bias=bias, eps=eps,
                        block_t=ARNL_TILE_M, block_n=ARNL_TILE_N, block_k=ARNL_TILE_K, split_k=ARNL_SPLIT_K,
                        num_warps=ARNL_TILE_WARPS, num_stages=ARNL_TILE_STAGES, fused=ARNL_FUSED_REDUCE,
                        counters=ARNL_COUNTERS)
    elif M > ARNL_MAX_T:
        _sg_gemm(1, x2, weight, out, H, r2=r2, g=norm_weight, res=res, bias=bias, eps=eps, block_m=ARNL_TILE_M,
                 block_n=ARNL_TILE_N, block_k=ARNL_TILE_K, num_warps=ARNL_TILE_WARPS, num_stages=ARNL_TILE_STAGES)
    return out.reshape(*x.shape[:-1], N), res.reshape(x.shape)
