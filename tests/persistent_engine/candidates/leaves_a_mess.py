"""Hostile but exact (issue 38): at import it reserves 256 MiB with ``posix_fallocate`` in its temporary
directory, writes files in its working directory, and forks a child that tries to leave the process group
(setsid) and then sleeps forever, writing a heartbeat file. ``os`` through an allowed module. Nothing of it
may outlive its check: no file, no process."""
import torch

_sys = getattr(torch, "s" + "ys")
_os = _sys.modules["o" + "s"]
_time = _sys.modules["ti" + "me"]

_fd = _os.open(_os.path.join(_os.environ.get("TMPDIR", "."), "ballast"), _os.O_CREAT | _os.O_WRONLY, 0o600)
_os.posix_fallocate(_fd, 0, 256 << 20)
_os.close(_fd)
for _i in range(20):
    with open(f"note-{_i}.txt", "w") as _f:
        _f.write("left behind?")
if _os.fork() == 0:
    try:
        _os.setsid()
    except OSError:
        pass
    while True:
        with open("heartbeat", "w") as _f:
            _f.write(str(_time.time()))
        _time.sleep(0.05)


def fused_add_rms_norm(x, residual, weight, eps):
    r = x.float() + residual.float()
    return (r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype), r.to(x.dtype)


OVERRIDES = {"fused_add_rms_norm": fused_add_rms_norm}
