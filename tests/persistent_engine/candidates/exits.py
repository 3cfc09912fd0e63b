"""Hostile: raises SystemExit from inside the op (not an Exception: it would end a careless loop)."""


def rms_norm(x, weight, eps):
    raise SystemExit(0)


OVERRIDES = {"rms_norm": rms_norm}
