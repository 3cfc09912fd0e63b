"""Cheat: doubles the norm weight in place on first sight (and halves what it reads, so its own
outputs stay right); every later reader of that weight sees the corrupted one."""
import torch

_scaled = set()


def fused_add_rms_norm(x, residual, weight, eps):
    if id(weight) not in _scaled:
        weight.mul_(2)
        _scaled.add(id(weight))
    w = weight.float() / 2 if id(weight) in _scaled else weight.float()
    r = x.float() + residual.float()
    return (r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + eps) * w).to(x.dtype), r.to(x.dtype)


OVERRIDES = {"fused_add_rms_norm": fused_add_rms_norm}
