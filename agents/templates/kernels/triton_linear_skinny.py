"""linear for serving batches (16-256 rows) as a swap-AB tensor-core GEMM in Triton (``y = x @ W.T + b``).

At serving batches a decode step's linears are still weight-bound (llama-1b gate_up at 64 rows: 67 MB of
weights, 0.5 MB of activations), but a GEMV streams W once per row block and a tiled GEMM of 16-row tiles
cannot use Hopper's 64-row wgmma. Here a program computes ``out^T`` tiles: W [BLOCK_N, BLOCK_K] (64/128 rows
of weights, the MMA's large side) times x^T [BLOCK_K, BLOCK_T] (the batch's rows, 16-256, the small side),
over a K slice; grid (cdiv(T, BLOCK_T), SPLIT_K, cdiv(N, BLOCK_N)) with the row blocks fastest, so the
programs that share a W tile run together and W comes from memory about once. SPLIT_K > 1: fp32 partials
[SPLIT_K, T, N] summed in a fixed order by a second launch (deterministic), or with ``SKINNY_FUSED_REDUCE``
by the last-arriving program of each output tile (int32 counters in ``SKINNY_COUNTERS``, left zeroed).
The row tile is max(16, min(SKINNY_BLOCK_T, pow2(T))): one compile per CUDA-graph batch bucket. Rows above
``SKINNY_MAX_M`` (prefill) go to cuBLAS, compute-bound there. Bytes: N*K weights + T*K + T*N; the floor is
N*K*2 / bandwidth. The kernels are the linear family's (``shared_gemv.py``, plain prologue), inlined by the
renderer.
"""

import torch

from agents.templates.kernels.shared_gemv import _sg_rows, _sg_skinny_gemm

# ---- section ----
SKINNY_BLOCK_T = 64
SKINNY_BLOCK_N = 64
SKINNY_BLOCK_K = 128
SKINNY_SPLIT_K = 4
SKINNY_NUM_WARPS = 4
SKINNY_NUM_STAGES = 4
SKINNY_MAX_M = 256
SKINNY_FUSED_REDUCE = 0      # 1: the split-K reduce in the last-arriving programs, no second launch
SKINNY_COUNTERS = {}         # (device, tiles) -> the fused reduce's int32 counters [tiles]


def linear_skinny(x, weight, bias=None):
    K = x.shape[-1]
    N = weight.shape[0]
    x2 = _sg_rows(x, K)
    M = x2.shape[0]
    if M > SKINNY_MAX_M or M == 0:
        return torch.nn.functional.linear(x, weight, bias)
    weight = _sg_rows(weight, K)
    out = torch.empty((M, N), dtype=x.dtype, device=x.device)
    _sg_skinny_gemm(0, x2, weight, out, K, bias=bias, block_t=SKINNY_BLOCK_T, block_n=SKINNY_BLOCK_N,
                    block_k=SKINNY_BLOCK_K, split_k=SKINNY_SPLIT_K, num_warps=SKINNY_NUM_WARPS,
                    num_stages=SKINNY_NUM_STAGES, fused=SKINNY_FUSED_REDUCE, counters=SKINNY_COUNTERS)
    return out.reshape(*x.shape[:-1], N)
