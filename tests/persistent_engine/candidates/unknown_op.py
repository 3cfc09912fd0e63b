"""Mistake: overrides an op the registry does not have."""
import torch


def rms_normalize(x, weight, eps):
    return x


OVERRIDES = {"rms_normalize": rms_normalize}
