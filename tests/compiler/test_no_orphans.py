"""No process outlives ``tkcc optimize`` (issue 21): SIGKILL of the orchestrator during start-up, the
baseline and the search leaves no engine (nor any other child) running 5 s later, and ``tkcc doctor``
would list one that did (persistent_engine.lifeline)."""

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONV = str(ROOT / "examples" / "traffic" / "azure2023_conv.csv")


def descendants_of(pid: int) -> list[int]:
    """Processes whose environment names ``pid`` as their spawner, or that still have it as parent."""
    found = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            env = Path(f"/proc/{d}/environ").read_bytes().split(b"\0")
            ppid = int(Path(f"/proc/{d}/stat").read_bytes().rsplit(b")", 1)[1].split()[1])
            state = Path(f"/proc/{d}/stat").read_bytes().rsplit(b")", 1)[1].split()[0]
        except (OSError, ValueError, IndexError):
            continue
        if state == b"Z":
            continue
        if f"TKCC_ENGINE_PARENT_PID={pid}".encode() in env or ppid == pid:
            found.append(int(d))
    return found


def engines_of(pid: int) -> list[int]:
    """``descendants_of`` that are engine processes (a short-lived helper child, e.g. the sandbox
    probe, may come and go before the kill)."""
    out = []
    for d in descendants_of(pid):
        try:
            if b"persistent_engine" in Path(f"/proc/{d}/cmdline").read_bytes():
                out.append(d)
        except OSError:
            pass
    return out


def running(pid: int) -> bool:
    try:
        return b") Z" not in Path(f"/proc/{pid}/stat").read_bytes()
    except OSError:
        return False


def kill_at(tmp_path, when: str) -> tuple[int, list[str]]:
    """Starts a tiny optimize run, SIGKILLs it at ``when`` (an engine spawned / a phase line), returns
    its pid and what it had printed."""
    proc = subprocess.Popen([sys.executable, "-m", "compiler", "optimize", "--model", "tiny-dense", "--hw", "h200",
                             "--traffic", CONV, "--budget", "10m", "--agents", "offline:2", "--aa-runs", "1",
                             "--max-points", "1", "--slow-layers", "1", "--out", str(tmp_path / when)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, cwd=ROOT)
    lines: list[str] = []
    seen = threading.Event()

    def pump():
        for line in proc.stderr:
            lines.append(line)
            if when != "start-up" and f"phase: {when}" in line:
                seen.set()
    threading.Thread(target=pump, daemon=True).start()
    t0 = time.monotonic()
    try:
        while time.monotonic() - t0 < 120 and proc.poll() is None:
            if when == "start-up" and engines_of(proc.pid):
                time.sleep(0.1)                 # still there: an engine starting (importing torch, building the
                if engines_of(proc.pid):        # model), not a helper child that came and went
                    break
                continue
            if seen.is_set():
                break
            time.sleep(0.05)
        assert proc.poll() is None, "".join(lines[-10:])
        assert engines_of(proc.pid), "the run has engine processes when it is killed"
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    return proc.pid, lines


@pytest.mark.slow
@pytest.mark.parametrize("when", ["start-up", "baseline", "searching"])
def test_sigkill_of_optimize_leaves_no_engine_behind(tmp_path, when):
    pid, lines = kill_at(tmp_path, when)
    killed, gone_after = time.monotonic(), None
    while time.monotonic() - killed < 5:
        if gone_after is None and not descendants_of(pid):
            gone_after = time.monotonic() - killed
        time.sleep(0.1)
    left = descendants_of(pid)
    for p in left:                                  # do not leak them into the rest of the suite
        try:
            os.kill(p, signal.SIGKILL)
        except OSError:
            pass
    assert left == [], f"processes of the killed run still alive 5 s later: {left}"
    # the lifeline polls every 0.2 s: an engine killed while it imports torch (no line written for
    # seconds, where a closed stdout would only be noticed at the next one) is gone within about a second
    assert gone_after is not None and gone_after < 1.0, f"the engines outlived the kill by {gone_after} s"


def test_doctor_lists_a_stray_engine(tmp_path):
    """A process that runs persistent_engine and whose spawner is gone is listed by ``tkcc doctor``."""
    from persistent_engine.lifeline import PARENT_ENV, stray_processes

    # a stand-in "engine" whose recorded spawner (pid 1's child that exited) is not its parent
    script = "import time; time.sleep(30)  # persistent_engine serve"
    proc = subprocess.Popen([sys.executable, "-c", script, "persistent_engine"], env={**os.environ, PARENT_ENV: "999999999"})
    try:
        time.sleep(0.3)
        strays = stray_processes()
        assert any(s["pid"] == proc.pid for s in strays), strays
        r = subprocess.run([sys.executable, "-m", "compiler", "doctor"], capture_output=True, text=True,
                           timeout=120, cwd=ROOT)
        assert r.returncode == 0 and f"pid {proc.pid}" in r.stdout and "outlived their orchestrator" in r.stdout
    finally:
        proc.kill()
        proc.wait()


def test_watch_parent_kills_the_child_when_its_parent_dies(tmp_path):
    """The lifeline itself: a grandchild watching its parent dies within a second of that parent."""
    marker = tmp_path / "pid"
    grand = "import sys, time; from persistent_engine.lifeline import watch_parent; watch_parent(int(sys.argv[1])); time.sleep(60)"
    child = ("import os, sys, time, subprocess\n"
             f"g = subprocess.Popen([sys.executable, '-c', {grand!r}, str(os.getpid())], start_new_session=True)\n"
             f"open({str(marker)!r}, 'w').write(str(g.pid))\n"
             "time.sleep(60)\n")
    parent = subprocess.Popen([sys.executable, "-c", child], cwd=ROOT)
    try:
        for _ in range(200):
            if marker.exists() and marker.read_text():
                break
            time.sleep(0.05)
        grandchild = int(marker.read_text())
        time.sleep(0.5)
        assert Path(f"/proc/{grandchild}").exists()
        parent.kill()
        parent.wait()
        for _ in range(40):
            if not Path(f"/proc/{grandchild}").exists() or b") Z" in Path(f"/proc/{grandchild}/stat").read_bytes():
                break
            time.sleep(0.05)
        else:
            os.kill(grandchild, signal.SIGKILL)
            pytest.fail("the grandchild outlived its parent by 2 s")
    finally:
        parent.kill()


def test_an_isolated_child_dies_with_the_orchestrator(tmp_path):
    """compiler.fleet.isolated's spawned child (the plan's per-op profile after the fleet closed) watches its
    parent too: a SIGKILL of the orchestrator during the writing phase leaves nothing behind."""
    script = ("import time\nfrom compiler.fleet.isolated import run_isolated\n"
              "run_isolated(time.sleep, 60, timeout_s=120)\n")
    parent = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT)
    try:
        t0 = time.monotonic()
        while time.monotonic() - t0 < 60 and not [p for p in descendants_of(parent.pid) if p != parent.pid]:
            time.sleep(0.05)
        children = descendants_of(parent.pid)
        assert children, "the isolated child started"
        time.sleep(1.0)                          # it is in time.sleep now, past its imports
        parent.kill()
        parent.wait()
        killed = time.monotonic()
        while time.monotonic() - killed < 5 and any(running(c) for c in children):
            time.sleep(0.05)
        alive = [c for c in children if running(c)]
        for c in alive:
            os.kill(c, signal.SIGKILL)
        assert alive == [] and time.monotonic() - killed < 2.0
    finally:
        parent.kill()
