"""Forgery through the executor's own request loop (issue 38): at import the candidate walks the stack to
``serve``'s handler table (reached through ``getattr``: no forbidden name in the source) and replaces the
handler of timed runs. ``MODE`` (the tests substitute it):

  wrong  every request whose output the judge observes (op checks, layer steps) runs the exact kernel; the
         timed runs run a zeros kernel, and so do the CUDA graphs they replay (captured with it)
  lazy   the timed run replies at once, and the real work is done when the next request arrives (an exact
         kernel timed at no cost)
  nosync the worker's device synchronize before a reply made a no-op: the timed runs' GPU work is still
         queued when the reply leaves (CUDA; a no-op on CPU, where nothing is queued)
  ahead  a "ran" reply sent ahead of every request, so that the judge's clock would stop at once
  weights the shared final-norm weight (CUDA: the judge's own allocation, mapped writable) doubled at the first
         timed run, so that the judge's references are computed on the weights the candidate chose (CUDA only:
         on CPU the weights are the sealed arena's, read-only)
Either was accepted (24-59x) while the judge fetched timed outputs from the executor afterwards."""
import torch

MODE = "wrong"
_sys = getattr(torch, "s" + "ys")
_wire = _sys.modules["persistent_engine.executor." + "wire"]
_table = _worker = _chan = None
_frame = _sys._getframe()
while _frame is not None and _table is None:
    _table = getattr(_frame, "f_" + "locals").get("hand" + "lers")
    _worker = getattr(_frame, "f_" + "locals").get("wor" + "ker")
    _chan = getattr(_frame, "f_" + "locals").get("ch" + "an")
    _frame = getattr(_frame, "f_" + "back")
_run = _table[_wire.TimedRun]
_wrong = [False]
_pending = []


def _wrong_while(handler):
    def timed_wrong(msg):
        _wrong[0] = True
        try:
            return handler(msg)
        finally:
            _wrong[0] = False
    return timed_wrong


def _timed_lazy(msg):
    _pending.append(msg)
    return _wire.Ran(k=msg.k, graph=True)


def _later(handler):
    def run_pending_first(msg):
        while _pending:
            _run(_pending.pop(0))
        return handler(msg)
    return run_pending_first


if MODE == "wrong":
    _table[_wire.TimedRun] = _wrong_while(_run)
    _table[_wire.Capture] = _wrong_while(_table[_wire.Capture])
elif MODE == "nosync":
    setattr(_worker, "_sy" + "nc", lambda: None)
elif MODE == "weights":
    def _first_run_doubles(msg, _done=[]):
        if not _done:
            _done.append(1)
            getattr(getattr(_worker, "mo" + "del"), "final_" + "norm").mul_(2)
        return _run(msg)
    _table[_wire.TimedRun] = _first_run_doubles
elif MODE == "ahead":
    _send = _chan.send

    def _send_then_ran(msg):
        _send(msg)
        _send({"op": "ran", "nonce": int(msg.get("nonce", 0)) + 1, "k": 1, "graph": True})
    _chan.send = _send_then_ran
else:
    for _kind in list(_table):
        _table[_kind] = _later(_table[_kind])
    _table[_wire.TimedRun] = _timed_lazy


def fused_add_rms_norm(x, residual, weight, eps):
    r = x.float() + residual.float()
    if _wrong[0]:
        return torch.zeros_like(x), r.to(x.dtype)
    return (r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype), r.to(x.dtype)


OVERRIDES = {"fused_add_rms_norm": fused_add_rms_norm}
