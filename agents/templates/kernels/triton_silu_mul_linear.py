"""silu_mul_linear in Triton: ``out = (silu(x[:, :I]) * x[:, I:]) @ W.T`` with the activation computed
on the fly in the GEMV prologue (fp32, never rounded, never written).

- ``T <= SML_MAX_T`` (decode): split-K GEMV, grid (cdiv(N, BLOCK_N), SPLIT_K, cdiv(T, BLOCK_M)). A
  program streams a [BLOCK_N, BLOCK_K] tile of W per step (K contiguous, read once, evicted first)
  and recomputes ``a = silu(gate) * up`` for its K slice of the T rows (2*BLOCK_K elements per row
  from L2; BLOCK_K exps per step, i.e. 1/BLOCK_N exp per weight element). Few output rows
  (llama-1b down: N=2048, I=8192) give few programs, so K is split: SPLIT_K slices write fp32
  partials to a [SPLIT_K, T, N] workspace that a second kernel sums in a fixed order
  (deterministic two-pass reduce, chosen over fp32 atomics, whose order varies run to run).
  Bytes: N*I weights (dominant) + 2*T*I read + T*N written; floor N*I*2 / bandwidth (llama-1b down
  33.5 MB: 7.0 us at 4.8 TB/s).
- ``T > SML_MAX_T`` with ``SML_TILED`` = 2 (serving batches): the swap-AB skinny GEMM (``_sg_skinny``: W the
  MMA's large side, TILE_M the row tile, SPLIT_K slices with the GEMV's reduce or fused reduce).
- ``T > SML_MAX_T`` (prefill, ``SML_TILED`` = 1): tiled ``tl.dot`` GEMM whose A-tile prologue loads the gate and up
  tiles and forms the activation (rounded to the weight dtype for the tensor cores). FLOPs 2*T*N*I.
- ``SML_PDL`` = 1 (decode, SM90+ GPUs; ignored elsewhere): both kernels are launched with programmatic
  dependent launch. The GEMV loads its first W tile (weights: written by no kernel) before
  ``gdc_wait``, which waits for the kernel that produced x; everything else, stores included, comes
  after it. So the launch and the first weight bytes overlap the previous kernel's tail.
- ``SML_FUSED_REDUCE`` = 1 (decode, SPLIT_K > 1): no reduce launch; the last of an output tile's SPLIT_K
  programs to arrive (an int32 counter per tile in ``SML_COUNTERS``, acq_rel atomics, left zeroed) sums
  the partials in the fixed order and stores (the same bits as the two launches).

The kernels are the linear family's (``shared_gemv.py``, SiLU * up prologue), inlined by the renderer.
"""

import torch

from agents.templates.kernels.shared_gemv import _sg_decode, _sg_gemm, _sg_rows, _sg_skinny_gemm

# ---- section ----
SML_BLOCK_N = 8
SML_BLOCK_K = 512
SML_BLOCK_M = 1
SML_SPLIT_K = 2
SML_NUM_WARPS = 4
SML_NUM_STAGES = 3
SML_MAX_T = 1
SML_TILED = 0                # T > MAX_T: 1 the tl.dot GEMM below, 2 the swap-AB skinny GEMM (serving batches), 0 torch
SML_TILE_M = 64
SML_TILE_N = 64
SML_TILE_K = 64
SML_TILE_WARPS = 4
SML_TILE_STAGES = 3
SML_PDL = 0                  # 1: programmatic dependent launch of the decode kernels (SM90+)
SML_FUSED_REDUCE = 0         # 1: the split-K reduce in the GEMV's last-arriving programs, no second launch
SML_COUNTERS = {}            # (device, tiles) -> the fused reduce's int32 counters [tiles]


def silu_mul_linear_triton(x, weight):
    I = x.shape[-1] // 2
    N = weight.shape[0]
    x2, weight = _sg_rows(x, 2 * I), _sg_rows(weight, I)
    M = x2.shape[0]
    out = torch.empty((M, N), dtype=x.dtype, device=x.device)
    if 0 < M <= SML_MAX_T:
        _sg_decode(2, x2, weight, out, I, block_n=SML_BLOCK_N, block_k=SML_BLOCK_K, block_m=SML_BLOCK_M,
                   split_k=SML_SPLIT_K, num_warps=SML_NUM_WARPS, num_stages=SML_NUM_STAGES, pdl=SML_PDL,
                   fused=SML_FUSED_REDUCE, counters=SML_COUNTERS)
    elif M > SML_MAX_T and not SML_TILED:
        gate, up = x2.float().chunk(2, dim=-1)
        out = torch.nn.functional.linear((torch.nn.functional.silu(gate) * up).to(x.dtype), weight)
    elif M > SML_MAX_T and SML_TILED == 2:
        _sg_skinny_gemm(2, x2, weight, out, I, block_t=SML_TILE_M, block_n=SML_TILE_N,
                        block_k=SML_TILE_K, split_k=SML_SPLIT_K, num_warps=SML_TILE_WARPS, num_stages=SML_TILE_STAGES,
                        fused=SML_FUSED_REDUCE, counters=SML_COUNTERS)
    elif M > SML_MAX_T:
        _sg_gemm(2, x2, weight, out, I, block_m=SML_TILE_M, block_n=SML_TILE_N, block_k=SML_TILE_K,
                 num_warps=SML_TILE_WARPS, num_stages=SML_TILE_STAGES)
    return out.reshape(*x.shape[:-1], N)
