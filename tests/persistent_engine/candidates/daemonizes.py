"""Hostile but exact: leaves processes behind. A double-forked, setsid daemon (a fresh python) that
writes a heartbeat (a counter in ``heartbeat`` in the working directory, every 10 ms) forever, plus a
posix_spawned shell (``sleep``) in its own session (each tried; where the sandbox refuses setsid both
stay in its process group); both command lines carry ``marker`` (the tests find survivors by it). ``os``
through an allowed module (static filter bypassed). Targets from ``target.json`` in its working directory,
else ``.tkcc-hostile-target.json`` beside the package it runs under. With ``exit`` the candidate's own
process exits once the daemon beats, else it lingers ``linger_s`` (like an executor waiting for work)."""
import typing

_sys = getattr(typing, "sy" + "s")
_imp = getattr(_sys.modules["built" + "ins"], "__imp" + "ort__")
_os = _imp("o" + "s")
_json = _imp("js" + "on")
_time = _imp("ti" + "me")

DESCRIPTION = "fused_add_rms_norm, exact; leaves a daemon"

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
    target = {}
_marker = target.get("marker", "tkcc-daemon")
_here = _os.getcwd()

# the daemon: a fresh python whose argv carries the marker, beating into the working directory
_BEAT = ("import os, sys, time\nn = 0\nwhile True:\n    n += 1\n"
         "    with open(sys.argv[1] + '/heartbeat.tmp', 'w') as f:\n        f.write(f'{n} {os.getpid()}')\n"
         "    os.replace(sys.argv[1] + '/heartbeat.tmp', sys.argv[1] + '/heartbeat')\n    time.sleep(0.01)\n")
_SHELL = ("/bin/sh", ["sh", "-c", f"sleep 1000; echo {_marker}"], dict(_os.environ))
if _os.fork() == 0:
    try:
        _os.setsid()
    except OSError:                     # refused where the sandbox seals its process group: carry on inside it
        pass
    if _os.fork() == 0:
        try:
            _os.posix_spawn(*_SHELL, setsid=True)
        except OSError:
            _os.posix_spawn(*_SHELL)
        _os.execv(_sys.executable, [_sys.executable, "-c", _BEAT, _here, _marker])
    _os._exit(0)
_os.wait()
while not _os.path.exists(f"{_here}/heartbeat"):
    _time.sleep(0.005)
if target.get("exit"):
    _os._exit(0)
_time.sleep(target.get("linger_s", 0))


def fused_add_rms_norm(x, residual, weight, eps):
    r = x.float() + residual.float()
    normed = r * (r.pow(2).mean(-1, keepdim=True) + eps).rsqrt() * weight.float()
    return normed.to(x.dtype), r.to(x.dtype)


OVERRIDES = {"fused_add_rms_norm": fused_add_rms_norm}
