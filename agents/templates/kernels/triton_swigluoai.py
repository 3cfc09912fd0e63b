"""swigluoai_and_mul (MiniMax-M3, gpt-oss) as a Triton kernel: ``(clamp(up, -limit, limit) + 1) * g *
sigmoid(alpha * g)``, ``g = clamp(gate, max=limit)``, gate = x[:, :I], up = x[:, I:], in fp32, rounded once.

Grid (M, cdiv(I, BLOCK_I)); bytes: read 2*M*I, write M*I elements (one pass; the reference makes ~8).
"""

import torch
import triton
import triton.language as tl

# ---- section ----
SOAI_BLOCK_I = 1024
SOAI_NUM_WARPS = 4


@triton.jit
def _soai_kernel(x_ptr, out_ptr, I, stride_xm, stride_om, alpha, limit, BLOCK_I: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I)
    mask = offs < I
    g = tl.load(x_ptr + row * stride_xm + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(x_ptr + row * stride_xm + I + offs, mask=mask, other=0.0).to(tl.float32)
    g = tl.minimum(g, limit)
    u = tl.minimum(tl.maximum(u, -limit), limit)
    y = (u + 1.0) * g / (1.0 + tl.exp(-alpha * g))
    tl.store(out_ptr + row * stride_om + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


def swigluoai_and_mul_triton(x, alpha, limit):
    I = x.shape[-1] // 2
    x2 = x.reshape(-1, 2 * I)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    M = x2.shape[0]
    out = torch.empty((M, I), dtype=x.dtype, device=x.device)
    if M > 0:
        _soai_kernel[(M, triton.cdiv(I, SOAI_BLOCK_I))](
            x2, out, I, x2.stride(0), out.stride(0), float(alpha), float(limit), BLOCK_I=SOAI_BLOCK_I,
            num_warps=SOAI_NUM_WARPS)
    return out.reshape(*x.shape[:-1], I)
