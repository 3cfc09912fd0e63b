"""Cheat: normalises x in place (saves an allocation, destroys the caller's tensor)."""
import torch


def rms_norm(x, weight, eps):
    xf = x.float()
    x.mul_(0.5)
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)


OVERRIDES = {"rms_norm": rms_norm}
