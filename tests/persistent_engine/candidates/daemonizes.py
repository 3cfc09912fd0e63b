"""Hostile but exact: leaves processes behind. A double-forked, setsid daemon that writes a
heartbeat (a counter in ``heartbeat`` in the working directory, every 10 ms) forever, plus a
posix_spawned shell (``sleep``) in its own session; their command lines carry the caller's argv (the
tests find survivors by a marker in it). ``os`` through an allowed module (static filter bypassed).
With ``target.json`` ``{"exit": true}`` the candidate's own process exits once the daemon beats,
else it lingers ``linger_s`` (like an executor waiting for work)."""
import typing

_sys = getattr(typing, "sy" + "s")
_imp = getattr(_sys.modules["built" + "ins"], "__imp" + "ort__")
_os = _imp("o" + "s")
_json = _imp("js" + "on")
_time = _imp("ti" + "me")

DESCRIPTION = "rms_norm, exact; leaves a daemon"

try:
    _fd = _os.open("target.json", _os.O_RDONLY)
    target = _json.loads(_os.read(_fd, 1 << 16))
    _os.close(_fd)
except OSError:
    target = {}
_marker = target.get("marker", "tkcc-daemon")
_here = _os.getcwd()

if _os.fork() == 0:
    _os.setsid()
    if _os.fork() == 0:
        _os.posix_spawn("/bin/sh", ["sh", "-c", f"sleep 1000; echo {_marker}"], dict(_os.environ), setsid=True)
        _n = 0
        while True:
            _n += 1
            _fd = _os.open(f"{_here}/heartbeat.tmp", _os.O_WRONLY | _os.O_CREAT | _os.O_TRUNC, 0o644)
            _os.write(_fd, f"{_n} {_os.getpid()}".encode())
            _os.close(_fd)
            _os.replace(f"{_here}/heartbeat.tmp", f"{_here}/heartbeat")
            _time.sleep(0.01)
    _os._exit(0)
_os.wait()
while not _os.path.exists(f"{_here}/heartbeat"):
    _time.sleep(0.005)
if target.get("exit"):
    _os._exit(0)
_time.sleep(target.get("linger_s", 0))


def rms_norm(x, weight, eps):
    xf = x.float()
    return (xf * (xf.pow(2).mean(-1, keepdim=True) + eps).rsqrt() * weight.float()).to(x.dtype)


OVERRIDES = {"rms_norm": rms_norm}
