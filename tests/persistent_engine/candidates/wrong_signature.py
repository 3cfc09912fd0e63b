"""Mistake: drops the eps argument of rms_norm."""
import torch


def rms_norm(x, weight):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-5) * weight.float()).to(x.dtype)


OVERRIDES = {"rms_norm": rms_norm}
