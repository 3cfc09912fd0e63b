"""Cheat: starts a background thread (could keep working, or patch things, after the call returns)."""
import threading
import time

import torch

_started = []


def _background():
    while True:
        time.sleep(0.01)


def rms_norm(x, weight, eps):
    if not _started:
        t = threading.Thread(target=_background, daemon=True, name="candidate-worker")
        t.start()
        _started.append(t)
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)


OVERRIDES = {"rms_norm": rms_norm}
