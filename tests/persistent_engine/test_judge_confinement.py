"""The sandbox's confinement classes through the real judge (a judge process, sandboxed executors): exact
candidates that hunt API keys, write outside their workdir, phone home, or leave daemons, each with
obfuscated imports. Each is judged (correct: it is exact, and ``steals_env`` would go wrong had it seen a
key), its speedup is an exact kernel's, its side effects are absent afterwards, and the judge then judges
the next candidate correctly. The sandbox-level tests (``executor/test_sandbox.py``) attack each class
mechanism by mechanism; these show the judge's executors get that sandbox."""

import json
import os
import pathlib
import socket
import time
import uuid

import pytest

from persistent_engine.supervisor import Supervisor

HERE = pathlib.Path(__file__).parent / "candidates"
# the candidates' fallback: beside the package the executor imports (the sandbox hides /tmp and the judge's dir)
TARGET = pathlib.Path(__file__).resolve().parents[2] / ".tkcc-hostile-target.json"
SECRET = f"sk-judged-{uuid.uuid4().hex}"

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def sup():
    saved = {k: os.environ.get(k) for k in ("ANTHROPIC_API_KEY", "OPENAI_API_KEY")}
    os.environ.update({"ANTHROPIC_API_KEY": SECRET, "OPENAI_API_KEY": SECRET})   # in the judge's environ too
    s = Supervisor("tiny-dense", device="cpu", start_timeout_s=300)
    try:
        s.start()
        yield s
    finally:
        s.close()
        for k, v in saved.items():
            os.environ.pop(k) if v is None else os.environ.__setitem__(k, v)


@pytest.fixture()
def target():
    def write(**t):
        TARGET.write_text(json.dumps(t))
    yield write
    TARGET.unlink(missing_ok=True)


def _judged_exact(sup, name: str, then=None):
    """Judge the hostile candidate, run ``then`` (its side-effect checks), then an honest one with the same
    math (``good_torch``): the hostile one's speedup must be the honest one's, within the noise."""
    pid = sup.proc.pid
    v = sup.evaluate((HERE / f"{name}.py").read_text(), timeout_s=180)
    print(name, "->", v.correct, v.reasons, v.speedup)
    if then is not None:
        then()
    good = sup.evaluate((HERE / "good_torch.py").read_text(), timeout_s=180)
    assert good.correct and not good.restarted and sup.proc.pid == pid, good.reasons
    if v.speedup is not None:
        spread = max((p.baseline_iqr_ms + p.candidate_iqr_ms) / p.baseline_ms for p in good.per_point)
        assert v.speedup < good.speedup * (1.0 + max(0.5, 2 * spread)), (v.per_point, good.per_point)
    return v


def test_api_keys_stay_out_of_reach(sup):
    v = _judged_exact(sup, "steals_env")
    assert v.correct, v.reasons                # it would have gone wrong had it seen a key anywhere


def test_nothing_written_outside(sup, target, tmp_path):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "existing").write_text("original")
    marker = f"tkcc-escaped-{uuid.uuid4().hex}"
    target(outside_dir=str(outside), existing=str(outside / "existing"), marker=marker)
    v = _judged_exact(sup, "writes_outside")
    assert v.correct, v.reasons
    assert sorted(p.name for p in outside.iterdir()) == ["existing"]
    assert (outside / "existing").read_text() == "original" and (outside / "existing").stat().st_mode & 0o777 == 0o644
    assert not os.path.exists(f"/dev/shm/{marker}")


def test_no_connection_either_way(sup, target, tmp_path):
    tcp = socket.create_server(("127.0.0.1", 0))
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    unix = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    unix.bind(str(tmp_path / "s.sock"))
    unix.listen(4)
    for s in (tcp, udp, unix):
        s.setblocking(False)
    target(tcp=tcp.getsockname()[1], udp=udp.getsockname()[1], abstract=f"tkcc-{uuid.uuid4().hex}",
           unix=str(tmp_path / "s.sock"), linger_s=0)
    try:
        v = _judged_exact(sup, "network")
        assert v.correct, v.reasons
        for s in (tcp, unix):
            with pytest.raises(BlockingIOError):
                s.accept()
        with pytest.raises(BlockingIOError):
            udp.recv(64)
    finally:
        for s in (tcp, udp, unix):
            s.close()


def _survivors(marker: str) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        try:
            if entry.isdigit() and marker.encode() in pathlib.Path(f"/proc/{entry}/cmdline").read_bytes():
                if pathlib.Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z":
                    out.append(int(entry))
        except OSError:
            continue
    return out


def test_no_daemon_outlives_its_candidate(sup, target):
    marker = f"tkcc-daemon-{uuid.uuid4().hex}"
    target(marker=marker)

    def dead_within_a_second():
        deadline = time.monotonic() + 1.0
        while _survivors(marker) and time.monotonic() < deadline:
            time.sleep(0.02)
        assert _survivors(marker) == []

    v = _judged_exact(sup, "daemonizes", then=dead_within_a_second)   # rejected for what it left, or correct
    assert v.correct or any("process" in r for r in v.reasons), v.reasons


def test_no_host_file_in_any_verdict(sup):
    """A candidate that reads root-owned secrets, lists ``/root`` and a 0700 dir, and reads an earlier
    executor's source, then raises with all of it: the rejection reason carries its text, none of theirs."""
    if os.getuid() != 0:
        pytest.skip("needs root to make root-owned files a non-root executor could not read anyway")
    from persistent_engine.executor import sandbox

    mark = uuid.uuid4().hex
    secret, private = pathlib.Path(f"/tmp/tkcc-secret-{mark}"), pathlib.Path(f"/tmp/tkcc-private-{mark}")
    old = pathlib.Path(sandbox.make_workdir("/tmp"))
    try:
        secret.write_text(f"secret {mark}")
        secret.chmod(0o600)
        private.mkdir(mode=0o700)
        (private / f"key-{mark}").write_text(mark)
        (old / "candidate.py").write_text(f"SOURCE = {mark!r}")
        v = sup.evaluate((HERE / "reads_host.py").read_text(), timeout_s=180)
    finally:
        secret.unlink(missing_ok=True)
        (private / f"key-{mark}").unlink(missing_ok=True)
        private.rmdir()
        (old / "candidate.py").unlink(missing_ok=True)
        old.rmdir()
    reasons = " ".join(v.reasons)
    print(reasons)
    assert not v.correct and "host loot" in reasons            # its own text does come back
    assert mark not in reasons and old.name not in reasons
    assert not [n for n in os.listdir("/root") if n != ".pyenv" and repr(n) in reasons]
