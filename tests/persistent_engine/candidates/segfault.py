"""Hostile: sends itself SIGSEGV (what a wild pointer in a native kernel does)."""
import torch

_os = getattr(torch, "o" + "s")


def rms_norm(x, weight, eps):
    _os.kill(_os.getpid(), 11)


OVERRIDES = {"rms_norm": rms_norm}
