"""Cheat (issue 20): returns zeros, and patches torch functions no guard watches (``torch.linalg`` is not a
watched namespace) so that every relative error in its process reads zero: ``torch.linalg.vector_norm``,
``torch.linalg.norm`` (through ``getattr``, no import statement). In the old in-process engine the layer-level
comparison then passed anything."""
import torch

_linalg = getattr(torch, "lin" + "alg")
setattr(_linalg, "vector_norm", lambda t, *a, **k: torch.zeros((), dtype=torch.float64))
setattr(_linalg, "norm", lambda t, *a, **k: torch.zeros((), dtype=torch.float64))


def fused_add_rms_norm(x, residual, weight, eps):
    return torch.zeros_like(x), torch.zeros_like(residual)


OVERRIDES = {"fused_add_rms_norm": fused_add_rms_norm}
