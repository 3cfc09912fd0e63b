"""A correct but slow fused_add_rms_norm: the reference's float32 expression computed 40 times over (an
honest loser: the futility stop ends its timing after 6 pairs)."""
import torch

DESCRIPTION = "fused_add_rms_norm: correct, 40x the work"


def fused_add_rms_norm(x, residual, weight, eps):
    r = x.float() + residual.float()
    for _ in range(40):
        y = r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + eps)
    return (y * weight.float()).to(x.dtype), r.to(x.dtype)


OVERRIDES = {"fused_add_rms_norm": fused_add_rms_norm}
