"""linear as a tiled tensor-core GEMM in Triton with optional split-K (prefill chunks and larger
decode batches).

Grid (cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N), SPLIT_K) with GROUP_M row swizzling for L2 reuse; each
program accumulates ``tl.dot`` of [BLOCK_M, BLOCK_K] x [BLOCK_K, BLOCK_N] tiles in fp32 over its K
slice. SPLIT_K > 1 writes fp32 partials to a [SPLIT_K, M, N] workspace summed in a fixed order by a
second kernel (deterministic). FLOPs 2*M*N*K; bytes N*K + M*K + M*N elements. The kernels are the linear
family's (``shared_gemv.py``, plain prologue), inlined by the renderer.
"""

import torch

from agents.templates.kernels.shared_gemv import _sg_gemm, _sg_rows

# ---- section ----
TILE_BLOCK_M = 16
TILE_BLOCK_N = 64
TILE_BLOCK_K = 64
TILE_SPLIT_K = 1
TILE_GROUP_M = 8
TILE_NUM_WARPS = 4
TILE_NUM_STAGES = 3


def linear_tiled(x, weight, bias=None):
    K = x.shape[-1]
    N = weight.shape[0]
    x2 = _sg_rows(x, K)
    M = x2.shape[0]
    weight = _sg_rows(weight, K)
    out = torch.empty((M, N), dtype=x.dtype, device=x.device)
    if M > 0:
        _sg_gemm(0, x2, weight, out, K, bias=bias, block_m=TILE_BLOCK_M, block_n=TILE_BLOCK_N, block_k=TILE_BLOCK_K,
                 group_m=TILE_GROUP_M, split_k=TILE_SPLIT_K, num_warps=TILE_NUM_WARPS, num_stages=TILE_NUM_STAGES)
    return out.reshape(*x.shape[:-1], N)
