"""Cheat: right while being verified, then (from its 90th call, in timing) returns zeros."""
import torch

_calls = [0]


def rms_norm(x, weight, eps):
    _calls[0] += 1
    if _calls[0] > CALLS_BEFORE_CHEATING:
        return torch.zeros_like(x)
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)


CALLS_BEFORE_CHEATING = 90           # verification of tiny-dense makes ~70 calls
OVERRIDES = {"rms_norm": rms_norm}
