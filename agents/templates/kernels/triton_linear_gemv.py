"""linear for decode batches as a split-K GEMV in Triton (``y = x @ W.T + b`` with few rows).

Grid (cdiv(N, BLOCK_N), SPLIT_K, cdiv(M, BLOCK_M)). A program streams a [BLOCK_N, BLOCK_K] tile of
W per step (K contiguous: 16-byte vector loads, read once, evicted first) over its K slice. With
BLOCK_M == 1 it accumulates x*W elementwise and reduces once at the end (no per-step shuffles);
otherwise it reduces each [BLOCK_M, BLOCK_N, BLOCK_K] product. With SPLIT_K > 1 the fp32 partials
go to a [SPLIT_K, M, N] workspace and a second kernel sums them in a fixed order (deterministic),
adds the bias and casts. Rows above ``GEMV_MAX_M`` go to torch's GEMM: by default every batch above one
row, since at ``BLOCK_M`` 1 each row re-reads W from L2 (on an H100, 0.38-0.50x cuBLAS at 4 rows and
0.12-0.25x at 16: ``benchmarks/results/h100-linear-rows.json``). Bytes: N*K weights (dominant) + M*K +
M*N; the floor is N*K*2/bandwidth.
``GEMV_PDL`` = 1 (SM90+ GPUs; ignored elsewhere): both kernels are launched with programmatic dependent
launch; the GEMV loads its first W tile (written by no kernel) before ``gdc_wait`` (the previous
kernel, which produced x, done and flushed) and everything else after, so its launch and first
weight bytes overlap the previous kernel's tail. On CPU the same setting runs the peeled first tile.
``GEMV_FUSED_REDUCE`` = 1 (SPLIT_K > 1): no reduce launch; the last GEMV program of each output tile to
arrive (an int32 counter per tile, acq_rel atomics) sums the tile's partials in the same fixed order (the
same bits as the two launches) and stores it. The counters live in ``GEMV_COUNTERS`` (one zeroed int32 per
tile, allocated once per device and tile count, left zeroed by every launch: no memset per call).
The kernels are the linear family's (``shared_gemv.py``, plain prologue), inlined by the renderer.
"""

import torch

from agents.templates.kernels.shared_gemv import _sg_decode, _sg_rows

# ---- section ----
GEMV_BLOCK_N = 16
GEMV_BLOCK_K = 512
GEMV_BLOCK_M = 1
GEMV_SPLIT_K = 4
GEMV_NUM_WARPS = 4
GEMV_NUM_STAGES = 3
GEMV_MAX_M = 1
GEMV_PDL = 0                 # 1: programmatic dependent launch (SM90+)
GEMV_FUSED_REDUCE = 0        # 1: the split-K reduce in the GEMV's last-arriving programs, no second launch
GEMV_COUNTERS = {}           # (device, tiles) -> the fused reduce's int32 counters [tiles]


def linear_gemv(x, weight, bias=None):
    K = x.shape[-1]
    N = weight.shape[0]
    M = x.reshape(-1, K).shape[0]
    if M > GEMV_MAX_M or M == 0:
        return torch.nn.functional.linear(x, weight, bias)
    x2, weight = _sg_rows(x, K), _sg_rows(weight, K)
    out = torch.empty((M, N), dtype=x.dtype, device=x.device)
    _sg_decode(0, x2, weight, out, K, bias=bias, block_n=GEMV_BLOCK_N, block_k=GEMV_BLOCK_K, block_m=GEMV_BLOCK_M,
               split_k=GEMV_SPLIT_K, num_warps=GEMV_NUM_WARPS, num_stages=GEMV_NUM_STAGES, pdl=GEMV_PDL,
               fused=GEMV_FUSED_REDUCE, counters=GEMV_COUNTERS)
    return out.reshape(*x.shape[:-1], N)
