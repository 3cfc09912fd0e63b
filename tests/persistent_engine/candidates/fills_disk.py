"""Hostile but exact (issue 38): at import it reserves 64 MiB with ``posix_fallocate`` in its temporary
directory and 64 MiB more in its working directory, and leaves a tree it took the rights from (``chmod
000``), ``os`` reached through an allowed module. Nothing of it may outlive its check."""
import torch

_sys = getattr(torch, "s" + "ys")
_os = _sys.modules["o" + "s"]

for _path in (_os.path.join(_os.environ.get("TMPDIR", "."), "ballast"), "ballast"):
    _fd = _os.open(_path, _os.O_CREAT | _os.O_WRONLY, 0o600)
    _os.posix_fallocate(_fd, 0, 64 << 20)
    _os.close(_fd)
_os.makedirs("locked/inner", exist_ok=True)
_fd = _os.open("locked/inner/note", _os.O_CREAT | _os.O_WRONLY, 0o600)
_os.write(_fd, b"left behind?")
_os.close(_fd)
_os.chmod("locked/inner", 0)
_os.chmod("locked", 0)


def fused_add_rms_norm(x, residual, weight, eps):
    r = x.float() + residual.float()
    return (r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype), r.to(x.dtype)


OVERRIDES = {"fused_add_rms_norm": fused_add_rms_norm}
