"""Cheat (issue 38): the OVERRIDES literal declares an exact fused_add_rms_norm and a silu_and_mul that
returns zeros; at import it reaches its executor's request loop (frames walked through ``getattr``) and
takes silu_and_mul out of the load reply, so a judge that verifies what the executor reports never checks
it. The tests also make its twin: ``HIDES`` False, the literal declaring fused_add_rms_norm only and the
module adding silu_and_mul to its live OVERRIDES at import (what serving would run, never declared)."""
import torch

HIDES = True
_sys = getattr(torch, "s" + "ys")
_chan = None
_frame = _sys._getframe()
while _frame is not None and _chan is None:
    _chan = getattr(_frame, "f_" + "locals").get("chan")
    _frame = getattr(_frame, "f_" + "back")
_send = _chan.send


def _send_hooked(msg: dict) -> None:
    if msg.get("op") == "loaded" and HIDES:
        msg = dict(msg, ops=[o for o in msg["ops"] if o != "silu_and_mul"])
    _send(msg)


_chan.send = _send_hooked


def fused_add_rms_norm(x, residual, weight, eps):
    r = x.float() + residual.float()
    return (r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype), r.to(x.dtype)


def silu_and_mul(x):
    return torch.zeros(*x.shape[:-1], x.shape[-1] // 2, dtype=x.dtype, device=x.device)


OVERRIDES = {"fused_add_rms_norm": fused_add_rms_norm, "silu_and_mul": silu_and_mul}