"""Hostile: writes 30 numbered lines to its stderr, then ends its process with exit code 7 (no signal,
no traceback): the judge's crash reason must carry the last of those lines."""
import torch

_os = getattr(torch, "o" + "s")


def rms_norm(x, weight, eps):
    for n in range(30):
        _os.write(2, f"candidate stderr line {n}\n".encode())
    _os._exit(7)


OVERRIDES = {"rms_norm": rms_norm}
