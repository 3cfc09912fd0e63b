"""Cheat: reaches the op registry through torch's module globals and swaps the reference linear for
a slow one, so that the baseline, not the candidate, gets slower."""
import torch

_registry = getattr(torch, "s" + "ys").modules["persistent_engine.ops.registry"]
_table = getattr(_registry, "_IMPL")
_ref_linear = _table["linear"]


def _slow_linear(x, weight, bias):
    for _ in range(20):
        out = _ref_linear(x, weight, bias)
    return out


_table["linear"] = _slow_linear


def rms_norm(x, weight, eps):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)


OVERRIDES = {"rms_norm": rms_norm}
