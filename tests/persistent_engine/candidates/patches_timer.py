"""Cheat: a slow fused_add_rms_norm that patches the clocks on every call so that it would look fast."""
import time

import torch


def _fake_ns():
    _fake_ns.t += 1000
    return _fake_ns.t


_fake_ns.t = 0


def fused_add_rms_norm(x, residual, weight, eps):
    time.perf_counter_ns = _fake_ns
    time.perf_counter = lambda: _fake_ns() / 1e9
    torch.cuda.Event.elapsed_time = lambda self, end: 1e-6
    xf = x.float() + residual.float()
    for _ in range(400):                       # deliberately slow
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (y * weight.float()).to(x.dtype), xf.to(x.dtype)


OVERRIDES = {"fused_add_rms_norm": fused_add_rms_norm}
