"""add_rms_norm_linear in torch as one composition: the residual add in fp32, ``F.rms_norm`` (one fused
kernel) and the projection, without the registry's two dispatches and the bf16 round trip of the
normed rows.

Rows up to ``TARNL_FP32_MAX_M`` (16-bit inputs) run the GEMM in fp32 on the normed fp32 rows (on CPU a
few-row bf16 GEMM spends its time in oneDNN's set-up; see torch_linear.py); more rows round the
normed rows to the dtype and run the dtype's GEMM (compute-bound there). 0 disables the fp32 path.
Bytes: N*H weights + 2*T*H read, T*(N+H) written (the fp32 path also reads an fp32 copy of W).
"""

import torch

# ---- section ----
TARNL_FP32_MAX_M = 8


def add_rms_norm_linear_torch(x, residual, norm_weight, eps, weight, bias=None):
    s = x.float() + residual.float()                                       # [T, H] fp32
    normed = torch.nn.functional.rms_norm(s, (s.shape[-1],), norm_weight.float(), eps)
    m = s.numel() // max(s.shape[-1], 1)
    if x.dtype != torch.float32 and m <= TARNL_FP32_MAX_M:
        out = torch.nn.functional.linear(normed, weight.float(), None if bias is None else bias.float())
        return out.to(x.dtype), s.to(x.dtype)
    return torch.nn.functional.linear(normed.to(x.dtype), weight, bias), s.to(x.dtype)
