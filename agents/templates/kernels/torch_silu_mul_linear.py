"""silu_mul_linear in torch as one composition: SiLU(gate) * up in fp32 and the projection, without
the registry's two dispatches.

Rows up to ``TSML_FP32_MAX_M`` (16-bit inputs) keep the activation in fp32 and run an fp32 GEMM (the
CPU few-row path, see torch_linear.py); more rows round the activation to the dtype and run the
dtype's GEMM. 0 disables the fp32 path. Bytes: N*I weights + 2*T*I read, T*N written.
"""

import torch

# ---- section ----
TSML_FP32_MAX_M = 8


def silu_mul_linear_torch(x, weight):
    gate, up = x.float().chunk(2, dim=-1)
    a = torch.nn.functional.silu(gate) * up                                # [T, I] fp32
    m = a.numel() // max(a.shape[-1], 1)
    if x.dtype != torch.float32 and m <= TSML_FP32_MAX_M:
        return torch.nn.functional.linear(a, weight.float()).to(x.dtype)
    return torch.nn.functional.linear(a.to(x.dtype), weight)
