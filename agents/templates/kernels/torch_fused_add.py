"""fused_add_rms_norm restructured in torch: the sum once, then ``F.rms_norm`` on it.

``bf16_add``: the sum in the input dtype (one rounding, as the returned residual is rounded anyway)
normalised by the fused kernel; ``fp32_add``: the sum kept in fp32 for the norm. Measured on CPU at
tiny-dense sizes (D=64, 64 rows): bf16_add 1.7x the reference.
"""

import torch

# ---- section ----
TFARN_IMPL = "bf16_add"


def fused_add_rms_norm_torch(x, residual, weight, eps):
    d = x.shape[-1]
    if TFARN_IMPL == "bf16_add":
        s = x + residual
        return torch.nn.functional.rms_norm(s, (d,), weight, eps), s
    s = x.to(torch.float32, copy=True).add_(residual)
    return torch.nn.functional.rms_norm(s, (d,), weight.float(), eps).to(x.dtype), s.to(x.dtype)
