"""swiglu_clamp_and_mul (DeepSeek-V4's ``swiglu_limit``) as a Triton kernel: ``silu(min(gate, limit)) *
clamp(up, -limit, limit)``, gate = x[:, :I], up = x[:, I:], in fp32, rounded once.

Grid (M, cdiv(I, BLOCK_I)); bytes: read 2*M*I, write M*I elements (one pass; the reference makes ~6).
"""

import torch
import triton
import triton.language as tl

# ---- section ----
SWCL_BLOCK_I = 1024
SWCL_NUM_WARPS = 4


@triton.jit
def _swcl_kernel(x_ptr, out_ptr, I, stride_xm, stride_om, limit, BLOCK_I: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I)
    mask = offs < I
    g = tl.load(x_ptr + row * stride_xm + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(x_ptr + row * stride_xm + I + offs, mask=mask, other=0.0).to(tl.float32)
    g = tl.minimum(g, limit)
    u = tl.minimum(tl.maximum(u, -limit), limit)
    y = g / (1.0 + tl.exp(-g)) * u
    tl.store(out_ptr + row * stride_om + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


def swiglu_clamp_and_mul_triton(x, limit):
    I = x.shape[-1] // 2
    x2 = x.reshape(-1, 2 * I)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    M = x2.shape[0]
    out = torch.empty((M, I), dtype=x.dtype, device=x.device)
    if M > 0:
        _swcl_kernel[(M, triton.cdiv(I, SWCL_BLOCK_I))](
            x2, out, I, x2.stride(0), out.stride(0), float(limit), BLOCK_I=SWCL_BLOCK_I, num_warps=SWCL_NUM_WARPS)
    return out.reshape(*x.shape[:-1], I)
