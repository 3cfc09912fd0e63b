"""Cheat (issue 6 of the list, issue 20): correct while verified, then (after its first 80 calls, i.e. once
it is being timed) returns the output it computed for the first input of each shape, so repeated timed runs
cost a copy. Fresh token ids per timed run and random spot re-checks see the stale outputs."""
import torch

_calls = [0]
_cache = {}


def fused_add_rms_norm(x, residual, weight, eps):
    _calls[0] += 1
    key = (tuple(x.shape), x.dtype)
    if _calls[0] > 80 and key in _cache:
        y, r = _cache[key]
        return y.clone(), r.clone()
    r = x.float() + residual.float()
    out = (r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype), r.to(x.dtype)
    if _calls[0] > 70:
        _cache[key] = (out[0].clone(), out[1].clone())
    return out


OVERRIDES = {"fused_add_rms_norm": fused_add_rms_norm}
