"""tkcc candidate rendered from the template library: silu_and_mul.triton{SAM_BLOCK_I=1024,SAM_NUM_WARPS=4}"""

import math
import torch
import triton
import triton.language as tl


# ======== silu_and_mul.triton{SAM_BLOCK_I=1024,SAM_NUM_WARPS=4}
SAM_BLOCK_I = 1024
SAM_NUM_WARPS = 4


@triton.jit
def _sam_kernel(x_ptr, out_ptr, I, stride_xm, stride_om, BLOCK_I: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I)
    mask = offs < I
    g = tl.load(x_ptr + row * stride_xm + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(x_ptr + row * stride_xm + I + offs, mask=mask, other=0.0).to(tl.float32)
    y = g / (1.0 + tl.exp(-g)) * u
    tl.store(out_ptr + row * stride_om + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


def silu_and_mul_triton(x):
    I = x.shape[-1] // 2
    x2 = x.reshape(-1, 2 * I)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    M = x2.shape[0]
    out = torch.empty((M, I), dtype=x.dtype, device=x.device)
    if M > 0:
        _sam_kernel[(M, triton.cdiv(I, SAM_BLOCK_I))](
            x2, out, I, x2.stride(0), out.stride(0), BLOCK_I=SAM_BLOCK_I, num_warps=SAM_NUM_WARPS)
    return out.reshape(*x.shape[:-1], I)


OVERRIDES = {'silu_and_mul': silu_and_mul_triton}
DESCRIPTION = 'silu_and_mul.triton{SAM_BLOCK_I=1024,SAM_NUM_WARPS=4}'
