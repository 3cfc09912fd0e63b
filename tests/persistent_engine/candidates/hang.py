"""Hostile: never returns."""


def rms_norm(x, weight, eps):
    while True:
        pass


OVERRIDES = {"rms_norm": rms_norm}
