"""fused_add_rms_norm as one Triton kernel: ``s = x + residual`` (rounded to the dtype, returned as
the new residual) and ``rms_norm(s)``, so the sum is read from registers instead of memory.

Bytes: read 2*M*D + D, write 2*M*D elements (the unfused reference moves the sum twice more).
"""

import torch
import triton
import triton.language as tl

from agents.templates.kernels.shared_norm import _sn_scale_rows, _sn_store

# ---- section ----
FARN_BLOCK_D = 2048
FARN_ROWS = 1
FARN_NUM_WARPS = 4


@triton.jit
def _farn_kernel(x_ptr, r_ptr, w_ptr, out_ptr, res_ptr, M, D, stride_xm, stride_rm, stride_om, eps,
                 BLOCK_D: tl.constexpr, ROWS: tl.constexpr, SINGLE: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)          # [ROWS]
    rmask = rows < M
    cols = tl.arange(0, BLOCK_D)
    if SINGLE:
        mask = rmask[:, None] & (cols[None, :] < D)
        x = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :], mask=mask, other=0.0)
        r = tl.load(r_ptr + rows[:, None] * stride_rm + cols[None, :], mask=mask, other=0.0)
        s = (x.to(tl.float32) + r.to(tl.float32)).to(res_ptr.dtype.element_ty)
        tl.store(res_ptr + rows[:, None] * stride_om + cols[None, :], s, mask=mask)
        sf = s.to(tl.float32)
        rstd = tl.rsqrt(tl.sum(sf * sf, axis=1) / D + eps)
        _sn_store(sf, rstd, w_ptr, out_ptr, rows, stride_om, cols, mask, D)
    else:
        acc = tl.zeros([ROWS, BLOCK_D], dtype=tl.float32)
        for d0 in range(0, D, BLOCK_D):
            c = d0 + cols
            mask = rmask[:, None] & (c[None, :] < D)
            x = tl.load(x_ptr + rows[:, None] * stride_xm + c[None, :], mask=mask, other=0.0)
            r = tl.load(r_ptr + rows[:, None] * stride_rm + c[None, :], mask=mask, other=0.0)
            s = (x.to(tl.float32) + r.to(tl.float32)).to(res_ptr.dtype.element_ty)
            tl.store(res_ptr + rows[:, None] * stride_om + c[None, :], s, mask=mask)
            sf = s.to(tl.float32)
            acc += sf * sf
        rstd = tl.rsqrt(tl.sum(acc, axis=1) / D + eps)
        _sn_scale_rows(res_ptr, stride_om, w_ptr, out_ptr, stride_om, rows, rmask, cols, D, rstd, BLOCK_D)


def fused_add_rms_norm_triton(x, residual, weight, eps):
    D = x.shape[-1]
    x2, r2 = x.reshape(-1, D), residual.reshape(-1, D)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    if r2.stride(-1) != 1:
        r2 = r2.contiguous()
    M = x2.shape[0]
    out = torch.empty((M, D), dtype=x.dtype, device=x.device)
    res = torch.empty((M, D), dtype=x.dtype, device=x.device)
    if M > 0:
        _farn_kernel[(triton.cdiv(M, FARN_ROWS),)](
            x2, r2, weight, out, res, M, D, x2.stride(0), r2.stride(0), out.stride(0), float(eps),
            BLOCK_D=FARN_BLOCK_D, ROWS=FARN_ROWS, SINGLE=FARN_BLOCK_D >= D, num_warps=FARN_NUM_WARPS)
    return out.reshape(x.shape), res.reshape(x.shape)
