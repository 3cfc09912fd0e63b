"""Hostile: imports os to abort the engine (refused by the static import policy)."""
import os


def rms_norm(x, weight, eps):
    os.abort()


OVERRIDES = {"rms_norm": rms_norm}
