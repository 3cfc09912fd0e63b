"""What an executor sees of the host (``confine_fs``): no root-owned secret, no ``/root`` listing, no other
executor's workdir or source, a size-limited tmpfs as its only writable place, no host pathname UNIX socket
under the CUDA policy (which allows ``socket(AF_UNIX)``), a memory cgroup where one can be made. Each attack
runs under the executors' policy, under each mechanism alone, and unconfined (the control: the attack works
there, so the test can fail). A sandboxed python reports what it reached in ``loot.json``, read through the
judge's view of the workdir (``SandboxedProcess.workdir_view``)."""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import textwrap
import uuid
from pathlib import Path

import pytest

from persistent_engine.executor import sandbox as sb

NEW = ("unprivileged_uid", "workdir_tmpfs", "hidden_dirs", "memory_cgroup")
CONFIGS = {"full": (), "uid_only": ("hidden_dirs",), "hiding_only": ("unprivileged_uid",),
           "unconfined": sb.MECHANISMS}

HUNT = """
    import json, os, sys
    t = json.load(open("target.json"))
    out = {}
    def attempt(name, fn):
        try:
            out[name] = fn()
        except OSError as e:
            out[name] = f"errno {e.errno}"
    attempt("secret", lambda: open(t["secret"]).read())
    attempt("private_dir", lambda: os.listdir(t["private_dir"]))
    attempt("private_file", lambda: open(os.path.join(t["private_dir"], "key")).read())
    attempt("root", lambda: os.listdir("/root"))
    attempt("siblings", lambda: os.listdir(os.path.dirname(os.getcwd())))
    attempt("old_source", lambda: open(t["old_source"]).read())
    attempt("uid", os.getuid)
    json.dump(out, open("loot.json", "w"))
"""


@pytest.fixture(scope="module")
def caps() -> sb.SandboxCapabilities:
    found = sb.probe("cpu")
    print("cpu policy:", {k: v for k, v in found.as_dict().items() if v is not True}, dict(found.errors))
    return found


def _need(caps, *mechs):
    lacking = [m for m in mechs if not getattr(caps, m)]
    if lacking:
        pytest.skip(f"this machine lacks {lacking} (probe errors: {dict(caps.errors)})")


def _spawn(workdir: str, code: str, device: str = "cpu", args=(), **policy) -> sb.SandboxedProcess:
    pol = sb.SandboxPolicy.for_device(device, workdir, **policy)
    return sb.spawn([sys.executable, "-c", textwrap.dedent(code), *args], pol, stderr=subprocess.DEVNULL)


def _loot(proc: sb.SandboxedProcess) -> dict:
    assert proc.wait(30) == 0
    try:
        return json.loads(Path(proc.workdir_view, "loot.json").read_text())
    finally:
        proc.kill_all()
        proc.release_workdir()


@pytest.fixture()
def host():
    """A root-owned 0600 secret, a 0700 dir with a key in it, and an earlier executor's workdir holding its
    source, in a dir any uid may search (so only the uid, or the hiding, stops the reads)."""
    if os.getuid() != 0:
        pytest.skip("needs root to make root-owned files a non-root executor could not read anyway")
    tmp_path = Path(tempfile.mkdtemp(prefix="tkcc-hosttest-"))
    tmp_path.chmod(0o755)
    yield _host(tmp_path)
    shutil.rmtree(tmp_path)


def _host(tmp_path: Path) -> tuple:
    mark = uuid.uuid4().hex
    secret = tmp_path / "tkcc-secret"
    secret.write_text(f"secret-{mark}")
    secret.chmod(0o600)
    private = tmp_path / "tkcc-private"
    private.mkdir(mode=0o700)
    (private / "key").write_text(f"key-{mark}")
    judge = tmp_path / "judge"
    judge.mkdir(mode=0o755)
    old = Path(sb.make_workdir(str(judge)))
    (old / "candidate.py").write_text(f"SOURCE = 'old-{mark}'")
    target = {"secret": str(secret), "private_dir": str(private), "old_source": str(old / "candidate.py")}
    return mark, str(judge), target, old.name


@pytest.mark.parametrize("config", list(CONFIGS))
def test_no_secret_listing_or_other_source(config, caps, host):
    _need(caps, *{"full": NEW[:3], "uid_only": ("unprivileged_uid",), "hiding_only": ("hidden_dirs",),
                  "unconfined": ()}[config])
    mark, judge, target, old_name = host
    workdir = sb.make_workdir(judge)
    Path(workdir, "target.json").write_text(json.dumps(target))
    loot = _loot(_spawn(workdir, HUNT, disable=CONFIGS[config]))
    print(config, loot)
    text = json.dumps(loot)
    if config == "unconfined":
        assert f"secret-{mark}" in text and f"old-{mark}" in text and old_name in text, "control"
        return
    assert mark not in text                       # no secret, no key, no earlier candidate's source
    assert (old_name in text) == (config == "uid_only")       # its name: in a dir any uid may list (here)
    assert loot["uid"] == (0 if config == "hiding_only" else sb.NOBODY)
    if config != "hiding_only":
        assert loot["private_dir"] == ("errno 13" if config == "uid_only" else "errno 2")
        assert loot["root"] != os.listdir("/root")
    if config != "uid_only":
        assert loot["siblings"] == [os.path.basename(workdir)]


def test_workdir_is_a_size_limited_tmpfs(caps, tmp_path):
    _need(caps, "workdir_tmpfs")
    workdir = sb.make_workdir(str(tmp_path))
    Path(workdir, "seeded.txt").write_text("from the judge")
    code = """
        import errno, json, os
        out = {"seeded": open("seeded.txt").read()}
        try:
            with open("big", "wb") as f:
                for _ in range(16):
                    f.write(b"x" * (1 << 20))
            out["big"] = "written"
        except OSError as e:
            out["big"] = errno.errorcode[e.errno]
        out["size"] = os.path.getsize("big")
        os.unlink("big")                           # room for the report
        json.dump(out, open("loot.json", "w"))
    """
    proc = _spawn(workdir, code, workdir_bytes=4 << 20)
    assert proc.applied.workdir_tmpfs
    loot = _loot(proc)
    assert loot == {"seeded": "from the judge", "big": "ENOSPC", "size": loot["size"]} and loot["size"] <= 4 << 20
    assert not Path(workdir, "loot.json").exists()          # the host dir underneath got nothing


SOCKET_CLIENT = """
    import json, socket, sys
    out = {}
    for path in sys.argv[1:]:
        s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            s.connect(path)
            s.sendall(b"hello")
            out[path] = "connected"
        except OSError as e:
            out[path] = f"errno {e.errno}"
        s.close()
    json.dump(out, open("loot.json", "w"))
"""


def _listener(path: str) -> socket.socket:
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(path)
    os.chmod(path, 0o777)                 # any uid may connect: only visibility stops it
    s.listen(4)
    s.setblocking(False)
    return s


@pytest.mark.parametrize("config", ["full", "unconfined"])
def test_cuda_policy_reaches_no_host_unix_socket(config, caps, tmp_path):
    """The CUDA policy allows socket(AF_UNIX) (the driver makes one at init): host pathname sockets (one in a
    temp dir, one under /run) stay out of reach because their dirs are hidden; one in a ``reveal`` dir is
    reached (the allow-list for what the CUDA driver needs)."""
    cuda = sb.probe("cuda")
    _need(cuda, "socket_dirs_hidden")
    assert sb.SandboxPolicy.for_device("cuda", "/x").allow_unix_sockets and not cuda.seccomp_unix
    os.chmod(tmp_path, 0o755)
    allowed = tmp_path / "allowed"
    allowed.mkdir(mode=0o755)
    paths = [str(tmp_path / "host.sock"), str(allowed / "driver.sock")]
    if os.access("/run", os.W_OK):
        paths.append(f"/run/tkcc-test-{uuid.uuid4().hex[:8]}.sock")
    socks = [_listener(p) for p in paths]
    try:
        workdir = sb.make_workdir(str(tmp_path))
        disable = () if config == "full" else ("hidden_dirs", "unprivileged_uid", "seccomp")
        loot = _loot(_spawn(workdir, SOCKET_CLIENT, "cuda", args=paths, reveal=(str(allowed),), disable=disable))
    finally:
        for s in socks:
            s.close()
        for p in paths[2:]:
            os.unlink(p)
    print(config, loot)
    hidden = [p for p in paths if "allowed" not in p]
    if config == "unconfined":
        assert all(loot[p] == "connected" for p in paths), "control: every socket reached"
    else:
        assert all(loot[p] != "connected" for p in hidden) and loot[paths[1]] == "connected"


def test_memory_cgroup_limits_the_tree(caps, tmp_path):
    """Resident memory counts, on CUDA as on CPU (RLIMIT_AS off): 256 MiB touched under a 64 MiB limit is
    killed; the cgroup is gone after kill_all."""
    _need(caps, "memory_cgroup")
    workdir = sb.make_workdir(str(tmp_path))
    proc = _spawn(workdir, "b = bytearray(256 << 20)\nimport time; time.sleep(0.5)", "cuda", memory_bytes=64 << 20)
    assert proc.applied.memory_cgroup and os.path.isdir(proc.memory_cgroup)
    assert proc.wait(30) != 0
    group = proc.memory_cgroup
    proc.kill_all()
    assert not os.path.exists(group)


def test_the_judges_view_outlives_the_tree(caps, tmp_path):
    """What the executor wrote on its tmpfs stays readable through ``workdir_view`` after ``kill_all`` (the
    Triton-cache harvest runs then), and is gone once released; the host dir underneath never had it."""
    _need(caps, "workdir_tmpfs")
    workdir = sb.make_workdir(str(tmp_path))
    proc = _spawn(workdir, "open('made.txt', 'w').write('by the executor')")
    assert proc.wait(30) == 0
    proc.kill_all()
    view = proc.workdir_view
    assert Path(view, "made.txt").read_text() == "by the executor" and not Path(workdir, "made.txt").exists()
    proc.release_workdir()
    assert not os.path.exists(view)
