"""Cheat (issue 20): a wrong fused_add_rms_norm (no normalisation) that, at import, replaces methods and
functions of the engine's verification classes so every check passes: the comparisons, the op contract,
the tensor guard, the tie check. Reached without an import statement (``getattr(torch, "s" + "ys")``).
``LATE = True``: the same patches on its first call instead (after the executor's load-time guard looked)."""
import torch

LATE = False
_mods = getattr(torch, "s" + "ys").modules
_done = []


def _none(*a, **k):
    return None


def _patch():
    _done.append(1)
    for name in ("persistent_engine.verification.verify", "persistent_engine.ops.contract", "persistent_engine.verification.guards",
                 "persistent_engine.judge.engine", "persistent_engine.verification.tolerance"):
        m = _mods.get(name)
        if m is None:
            continue
        for attr, fake in (("compare_logits", _none), ("compare_outputs", lambda *a, **k: []),
                           ("rel_err", lambda *a, **k: 0.0), ("judge_outputs", lambda *a, **k: []),
                           ("check_op", lambda *a, **k: [])):
            if hasattr(m, attr):
                setattr(m, attr, fake)
        for cls in ("TensorGuard", "TieCheck", "Engine"):
            c = getattr(m, cls, None)
            for meth in ("changed", "compare", "verify", "_layer_level", "_spot_check"):
                if c is not None and hasattr(c, meth):
                    setattr(c, meth, lambda self, *a, _m=meth, **k: [] if _m == "changed" else None)


if not LATE:
    _patch()


def fused_add_rms_norm(x, residual, weight, eps):
    if LATE and not _done:
        _patch()
    r = x.float() + residual.float()
    return (r * weight.float()).to(x.dtype), r.to(x.dtype)


OVERRIDES = {"fused_add_rms_norm": fused_add_rms_norm}
