"""Hostile: reaches os.abort through torch's own module globals, past the static policy."""
import torch

_os = getattr(torch, "o" + "s")


def rms_norm(x, weight, eps):
    _os.abort()


OVERRIDES = {"rms_norm": rms_norm}
