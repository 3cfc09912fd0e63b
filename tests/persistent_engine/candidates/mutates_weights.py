"""Cheat: once it recognises a model weight (the same tensor object passed again and again), it
pre-scales that weight in place and compensates in its own math: outputs stay right, weights do not."""
import torch

_seen = {}          # id(weight) -> (weight, calls); holding the tensor keeps its id unique
_scaled = set()


def rms_norm(x, weight, eps):
    ref, n = _seen.get(id(weight), (weight, 0))
    _seen[id(weight)] = (weight, n + 1)
    if n + 1 == 4 and id(weight) not in _scaled:    # op-level checks pass a tensor at most twice
        weight.mul_(2)
        _scaled.add(id(weight))
    w = weight.float() / 2 if id(weight) in _scaled else weight.float()
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * w).to(x.dtype)


OVERRIDES = {"rms_norm": rms_norm}
