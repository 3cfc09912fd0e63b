"""tkcc composed plan: 1 accepted optimization(s): offline-kernel-0-fused_add_rms_norm-1. Generated; do not edit."""
import math
import torch
import triton
import triton.language as tl
TFARN_IMPL = 'fp32_add'

def fused_add_rms_norm_torch(x, residual, weight, eps):
    d = x.shape[-1]
    if TFARN_IMPL == 'bf16_add':
        s = x + residual
        return (torch.nn.functional.rms_norm(s, (d,), weight, eps), s)
    s = x.to(torch.float32, copy=True).add_(residual)
    return (torch.nn.functional.rms_norm(s, (d,), weight.float(), eps).to(x.dtype), s.to(x.dtype))
_c0_DESCRIPTION = 'fused_add_rms_norm.torch_fused{TFARN_IMPL=fp32_add}'
OVERRIDES = {'fused_add_rms_norm': fused_add_rms_norm_torch}
DESCRIPTION = 'composed: offline-kernel-0-fused_add_rms_norm-1'
