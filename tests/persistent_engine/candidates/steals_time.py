"""Cheat (issue 20): an exact fused_add_rms_norm that starts a raw ``_thread`` (no ``threading.Thread``: no
name, reached through ``threading._start_new_thread``) burning the CPU whenever its own override is not
being called, i.e. while the BASELINE side of the A/B runs. In one process (the old engine) this scored
6.4x; with executors the candidate's whole process is SIGSTOPped while the baseline is timed."""
import threading
import time

import torch

_start = getattr(threading, "_start_" + "new_thread")
_last = [0.0]


def _burn():
    a = torch.randn(96, 96)
    while True:
        if time.perf_counter() - _last[0] > 0.002:      # not inside the candidate's own timing
            for _ in range(20):
                a = (a @ a).clamp_(-1, 1)
        else:
            time.sleep(0.0005)


_start(_burn, ())


def fused_add_rms_norm(x, residual, weight, eps):
    _last[0] = time.perf_counter()
    r = x.float() + residual.float()
    return (r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype), r.to(x.dtype)


OVERRIDES = {"fused_add_rms_norm": fused_add_rms_norm}
