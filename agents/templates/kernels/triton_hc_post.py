"""hc_post (DeepSeek-V4 hyper-connections) as a Triton kernel: out[t, k] = post[t, k] * o[t] + sum_j comb[t, j, k]
* residual[t, j] for the N = hc_mult streams, in fp32, rounded once.

Grid (T, cdiv(D, BLOCK_D)); each program reads its D-block of o and of the N residual streams once and writes the
N output streams: bytes (1 + 2N) * T * D elements plus the T * (N + N^2) fp32 weights (the reference makes ~4
passes over the streams: the matmul, the expand, the add, the cast).
"""

import torch
import triton
import triton.language as tl

# ---- section ----
HCP_BLOCK_D = 512
HCP_NUM_WARPS = 4


@triton.jit
def _hc_post_kernel(o_ptr, res_ptr, post_ptr, comb_ptr, out_ptr, D, N: tl.constexpr, BLOCK_D: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    mask = offs < D
    o = tl.load(o_ptr + t * D + offs, mask=mask, other=0.0).to(tl.float32)
    for k in tl.static_range(N):
        acc = tl.load(post_ptr + t * N + k).to(tl.float32) * o
        for j in tl.static_range(N):
            r = tl.load(res_ptr + (t * N + j) * D + offs, mask=mask, other=0.0).to(tl.float32)
            acc += tl.load(comb_ptr + (t * N + j) * N + k).to(tl.float32) * r
        tl.store(out_ptr + (t * N + k) * D + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)


def hc_post_triton(out, residual, post, comb):
    t, n, d = residual.shape
    o, res = out.contiguous(), residual.contiguous()
    p, c = post.float().contiguous(), comb.float().contiguous()
    y = torch.empty((t, n, d), dtype=residual.dtype, device=residual.device)
    if t > 0:
        _hc_post_kernel[(t, triton.cdiv(d, HCP_BLOCK_D))](o, res, p, c, y, d, N=n, BLOCK_D=HCP_BLOCK_D,
                                                          num_warps=HCP_NUM_WARPS)
    return y
