"""situ_and_mul (Kimi-K3's SiTU-GLU) as a Triton kernel: ``beta tanh(g / beta) sigmoid(g) * (lb tanh(u / lb))``,
gate g = x[:, :I], up u = x[:, I:], in fp32, rounded once (persistent_engine/ops/kda.py).

Grid (M, cdiv(I, BLOCK_I)); bytes: read 2*M*I, write M*I elements in one pass (the reference makes ~10).
"""

import torch
import triton
import triton.language as tl

# ---- section ----
SITU_BLOCK_I = 1024
SITU_NUM_WARPS = 4


@triton.jit
def _situ_tanh(x):
    e = tl.exp(-2.0 * tl.abs(x))
    t = (1.0 - e) / (1.0 + e)
    return tl.where(x < 0, -t, t)


@triton.jit
def _situ_kernel(x_ptr, out_ptr, I, stride_xm, stride_om, beta, lbeta, HAS_LB: tl.constexpr, BLOCK_I: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I)
    mask = offs < I
    g = tl.load(x_ptr + row * stride_xm + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(x_ptr + row * stride_xm + I + offs, mask=mask, other=0.0).to(tl.float32)
    a = beta * _situ_tanh(g / beta) / (1.0 + tl.exp(-g))
    if HAS_LB:
        u = lbeta * _situ_tanh(u / lbeta)
    tl.store(out_ptr + row * stride_om + offs, (a * u).to(out_ptr.dtype.element_ty), mask=mask)


def situ_and_mul_triton(x, beta, linear_beta):
    I = x.shape[-1] // 2
    x2 = x.reshape(-1, 2 * I)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    M = x2.shape[0]
    out = torch.empty((M, I), dtype=x.dtype, device=x.device)
    if M > 0:
        _situ_kernel[(M, triton.cdiv(I, SITU_BLOCK_I))](
            x2, out, I, x2.stride(0), out.stride(0), float(beta), 1.0 if linear_beta is None else float(linear_beta),
            HAS_LB=linear_beta is not None, BLOCK_I=SITU_BLOCK_I, num_warps=SITU_NUM_WARPS)
    return out.reshape(*x.shape[:-1], I)
