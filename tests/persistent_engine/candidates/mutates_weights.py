"""Cheat: once it recognises a model weight (the same tensor passed again and again), it pre-scales
that weight in place and compensates in its own math: outputs stay right, the weights do not."""
import torch

_seen = {}
_scaled = set()


def rms_norm(x, weight, eps):
    key = (weight.data_ptr(), tuple(weight.shape), weight.dtype)
    _seen[key] = _seen.get(key, 0) + 1
    if _seen[key] == 6 and key not in _scaled:      # op-level checks pass a tensor at most ~4 times
        weight.mul_(2)
        _scaled.add(key)
    w = weight.float() / 2 if key in _scaled else weight.float()
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w).to(x.dtype)


OVERRIDES = {"rms_norm": rms_norm}
