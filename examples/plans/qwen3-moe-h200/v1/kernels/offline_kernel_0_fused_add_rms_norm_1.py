"""tkcc candidate rendered from the template library: fused_add_rms_norm.torch_fused{TFARN_IMPL=fp32_add}"""

import math
import torch
import triton
import triton.language as tl


# ======== fused_add_rms_norm.torch_fused{TFARN_IMPL=fp32_add}
TFARN_IMPL = 'fp32_add'


def fused_add_rms_norm_torch(x, residual, weight, eps):
    d = x.shape[-1]
    if TFARN_IMPL == "bf16_add":
        s = x + residual
        return torch.nn.functional.rms_norm(s, (d,), weight, eps), s
    s = x.to(torch.float32, copy=True).add_(residual)
    return torch.nn.functional.rms_norm(s, (d,), weight.float(), eps).to(x.dtype), s.to(x.dtype)


OVERRIDES = {'fused_add_rms_norm': fused_add_rms_norm_torch}
DESCRIPTION = 'fused_add_rms_norm.torch_fused{TFARN_IMPL=fp32_add}'
