"""Cheat (issue 20): a fused_add_rms_norm 10% off that, on every call, walks the stack frames above it to
the engine's objects and loosens every tolerance it finds (calibrated bounds, per-dtype tables, the cap),
without a forbidden name in the source (frames reached through ``getattr``)."""
import torch

_sys = getattr(torch, "s" + "ys")
_BIG = 1e9


def _loosen(obj):
    for name in ("logit_tol", "logit_noise"):
        table = getattr(obj, name, None)
        if isinstance(table, list):
            setattr(obj, name, [[_BIG for _ in row] for row in table])
    for name in ("LOGIT_RTOL", "TIE_RTOL"):
        table = getattr(obj, name, None)
        if isinstance(table, dict):
            for k in table:
                table[k] = _BIG
    if hasattr(obj, "TOL_CAP"):
        setattr(obj, "TOL_CAP", _BIG)


def _walk():
    frame = _sys._getframe()
    while frame is not None:
        for value in list(getattr(frame, "f_" + "locals").values()):
            _loosen(value)
        frame = getattr(frame, "f_" + "back")
    for name in ("persistent_engine.verification.verify", "persistent_engine.verification.tolerance"):
        if name in _sys.modules:
            _loosen(_sys.modules[name])


def fused_add_rms_norm(x, residual, weight, eps):
    _walk()
    r = x.float() + residual.float()
    y = r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + eps) * weight.float() * 1.1
    return y.to(x.dtype), r.to(x.dtype)


OVERRIDES = {"fused_add_rms_norm": fused_add_rms_norm}
