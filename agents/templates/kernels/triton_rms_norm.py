"""rms_norm as a row-blocked Triton kernel.

One program normalises ``ROWS`` rows of ``x[M, D]``: the sum of squares in fp32 over ``BLOCK_D``-wide
chunks, then ``x * rsqrt(mean + eps) * weight`` written in x's dtype. With ``BLOCK_D >= D`` a row
is one load (kept in registers); otherwise two passes over the row (the second from L1/L2).
Bytes: read M*D + D, write M*D elements; memory-bound at every model size.
"""

import torch
import triton
import triton.language as tl

from agents.templates.kernels.shared_norm import _sn_scale_rows, _sn_store

# ---- section ----
RMSN_BLOCK_D = 2048
RMSN_ROWS = 1
RMSN_NUM_WARPS = 4


@triton.jit
def _rmsn_kernel(x_ptr, w_ptr, out_ptr, M, D, stride_xm, stride_om, eps,
                 BLOCK_D: tl.constexpr, ROWS: tl.constexpr, SINGLE: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)          # [ROWS]
    rmask = rows < M
    cols = tl.arange(0, BLOCK_D)                                  # [BLOCK_D]
    if SINGLE:
        mask = rmask[:, None] & (cols[None, :] < D)
        x = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        rstd = tl.rsqrt(tl.sum(x * x, axis=1) / D + eps)          # [ROWS]
        _sn_store(x, rstd, w_ptr, out_ptr, rows, stride_om, cols, mask, D)
    else:
        acc = tl.zeros([ROWS, BLOCK_D], dtype=tl.float32)
        for d0 in range(0, D, BLOCK_D):
            c = d0 + cols
            mask = rmask[:, None] & (c[None, :] < D)
            x = tl.load(x_ptr + rows[:, None] * stride_xm + c[None, :], mask=mask, other=0.0).to(tl.float32)
            acc += x * x
        rstd = tl.rsqrt(tl.sum(acc, axis=1) / D + eps)
        _sn_scale_rows(x_ptr, stride_xm, w_ptr, out_ptr, stride_om, rows, rmask, cols, D, rstd, BLOCK_D)


def rms_norm_triton(x, weight, eps):
    D = x.shape[-1]
    x2 = x.reshape(-1, D)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    M = x2.shape[0]
    out = torch.empty((M, D), dtype=x.dtype, device=x.device)
    if M > 0:
        _rmsn_kernel[(triton.cdiv(M, RMSN_ROWS),)](
            x2, weight, out, M, D, x2.stride(0), out.stride(0), float(eps),
            BLOCK_D=RMSN_BLOCK_D, ROWS=RMSN_ROWS, SINGLE=RMSN_BLOCK_D >= D, num_warps=RMSN_NUM_WARPS)
    return out.reshape(x.shape)
