"""Cheat: returns float32 whatever the input dtype (saves a cast, breaks the contract)."""
import torch


def rms_norm(x, weight, eps):
    xf = x.float()
    return xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()


OVERRIDES = {"rms_norm": rms_norm}
