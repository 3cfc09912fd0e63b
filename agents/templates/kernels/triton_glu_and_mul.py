"""The gated-linear-unit ops as one Triton kernel: ``act(gate) * up`` with gate = x[:, :I], up = x[:, I:],
in fp32, rounded once. The activation is a constexpr (``ACT``: one compiled kernel per op, no branch at run
time); each op has its own entry and knob prefix, so one candidate can hold several with their own tiles:

- ``silu_and_mul_triton`` (SAM_): ``silu(gate) * up``;
- ``swiglu_clamp_and_mul_triton`` (SWCL_, DeepSeek-V4's ``swiglu_limit``): ``silu(min(gate, limit)) *
  clamp(up, -limit, limit)``;
- ``swigluoai_and_mul_triton`` (SOAI_, MiniMax-M3, gpt-oss): ``(clamp(up, -limit, limit) + 1) * g *
  sigmoid(alpha * g)``, ``g = min(gate, limit)``;
- ``gelu_tanh_and_mul_triton`` (GELU_, Gemma's GeGLU, persistent_engine/ops/gemma.py): ``gelu_tanh(gate) * up``,
  ``gelu_tanh(g) = 0.5 g (1 + tanh(sqrt(2/pi) (g + 0.044715 g^3)))``;
- ``situ_and_mul_triton`` (SITU_, Kimi-K3's SiTU-GLU, persistent_engine/ops/kda.py): ``beta tanh(gate / beta)
  sigmoid(gate) * (lb tanh(up / lb)`` when ``linear_beta`` is given, else ``up)``.

Grid (M, cdiv(I, BLOCK_I)); bytes: read 2*M*I, write M*I elements in one pass (the unfused references make
~6-10).
"""

import torch
import triton
import triton.language as tl

from agents.templates.kernels.shared_math import _sm_tanh

# ---- section ----
SAM_BLOCK_I = 1024
SAM_NUM_WARPS = 4
SWCL_BLOCK_I = 1024
SWCL_NUM_WARPS = 4
SOAI_BLOCK_I = 1024
SOAI_NUM_WARPS = 4
SITU_BLOCK_I = 1024
SITU_NUM_WARPS = 4
GELU_BLOCK_I = 1024
GELU_NUM_WARPS = 4
GLU_SILU, GLU_CLAMP, GLU_OAI, GLU_SITU, GLU_SITU_LB, GLU_GELU = 0, 1, 2, 3, 4, 5     # ACT


@triton.jit
def _glu_kernel(x_ptr, out_ptr, I, stride_xm, stride_om, A, B, ACT: tl.constexpr, BLOCK_I: tl.constexpr):
    # A, B: limit (CLAMP); alpha, limit (OAI); beta, lb (SITU, SITU_LB); unused by SILU
    row = tl.program_id(0).to(tl.int64)
    offs = tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I)
    mask = offs < I
    g = tl.load(x_ptr + row * stride_xm + offs, mask=mask, other=0.0).to(tl.float32)
    u = tl.load(x_ptr + row * stride_xm + I + offs, mask=mask, other=0.0).to(tl.float32)
    if ACT == 1:
        g = tl.minimum(g, A)
        u = tl.minimum(tl.maximum(u, -A), A)
    if ACT == 2:
        g = tl.minimum(g, B)
        u = tl.minimum(tl.maximum(u, -B), B)
        y = (u + 1.0) * g / (1.0 + tl.exp(-A * g))
    elif ACT == 5:
        y = 0.5 * g * (1.0 + _sm_tanh(0.7978845608028654 * (g + 0.044715 * g * g * g))) * u
    elif ACT >= 3:
        a = A * _sm_tanh(g / A) / (1.0 + tl.exp(-g))
        if ACT == 4:
            u = B * _sm_tanh(u / B)
        y = a * u
    else:
        y = g / (1.0 + tl.exp(-g)) * u
    tl.store(out_ptr + row * stride_om + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


def _glu_and_mul(x, act, a, b, block_i, num_warps):
    I = x.shape[-1] // 2
    x2 = x.reshape(-1, 2 * I)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    M = x2.shape[0]
    out = torch.empty((M, I), dtype=x.dtype, device=x.device)
    if M > 0:
        _glu_kernel[(M, triton.cdiv(I, block_i))](x2, out, I, x2.stride(0), out.stride(0), a, b, ACT=act,
                                                  BLOCK_I=block_i, num_warps=num_warps)
    return out.reshape(*x.shape[:-1], I)


def silu_and_mul_triton(x):
    return _glu_and_mul(x, GLU_SILU, 0.0, 0.0, SAM_BLOCK_I, SAM_NUM_WARPS)


def swiglu_clamp_and_mul_triton(x, limit):
    return _glu_and_mul(x, GLU_CLAMP, float(limit), 0.0, SWCL_BLOCK_I, SWCL_NUM_WARPS)


def swigluoai_and_mul_triton(x, alpha, limit):
    return _glu_and_mul(x, GLU_OAI, float(alpha), float(limit), SOAI_BLOCK_I, SOAI_NUM_WARPS)


def gelu_tanh_and_mul_triton(x):
    return _glu_and_mul(x, GLU_GELU, 0.0, 0.0, GELU_BLOCK_I, GELU_NUM_WARPS)


def situ_and_mul_triton(x, beta, linear_beta):
    act, lb = (GLU_SITU, 1.0) if linear_beta is None else (GLU_SITU_LB, float(linear_beta))
    return _glu_and_mul(x, act, float(beta), lb, SITU_BLOCK_I, SITU_NUM_WARPS)
