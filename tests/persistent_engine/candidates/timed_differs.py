"""Cheat: right while being verified, then (from its CALLS_BEFORE_CHEATING-th call, in timing) returns zeros."""
import torch

_calls = [0]


def fused_add_rms_norm(x, residual, weight, eps):
    _calls[0] += 1
    r = x.float() + residual.float()
    if _calls[0] > CALLS_BEFORE_CHEATING:
        return torch.zeros_like(x), r.to(x.dtype)
    return (r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype), r.to(x.dtype)


CALLS_BEFORE_CHEATING = 130          # verification of tiny-dense makes 108 calls
OVERRIDES = {"fused_add_rms_norm": fused_add_rms_norm}
