"""Issue 38: an executor's processes are stopped and killed as one unit. The executor makes its own process
group before confining and seccomp denies setsid/setpgid, so a child it forks *after* the judge's last
``/proc`` scan (and that tries to leave the group) is still stopped by ``Executor.stop`` with its parent,
continued by ``cont`` and killed with the tree; the launcher stays out of the group, awake. Where a writable
cgroup v2 hierarchy exists, the same through ``proc.cgroup`` (``cgroup.freeze`` / ``cgroup.kill``)."""

import os
import signal
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from persistent_engine.executor import sandbox as sb
from persistent_engine.executor.launch import Executor

# the executor: waits for ``go`` in its workdir, then forks a child that tries to leave the process group
# (setsid, then setpgid), records what it was told, and counts in ``count`` as fast as it can
TREE = textwrap.dedent("""
    import os, time
    while not os.path.exists("go"):
        time.sleep(0.002)
    if os.fork() == 0:
        told = []
        for name, call in (("setsid", os.setsid), ("setpgid", lambda: os.setpgid(0, 0))):
            try:
                call()
                told.append(name + " ok")
            except OSError as e:
                told.append(f"{name} errno {e.errno}")
        with open("told.tmp", "w") as f:
            f.write(";".join(told) + ";")
        os.replace("told.tmp", "told")
        n = 0
        while True:
            n += 1
            if n % 1000 == 0:
                with open("count.tmp", "w") as f:
                    f.write(str(n))
                os.replace("count.tmp", "count")
    time.sleep(60)
""")


def _state(pid: int) -> str:
    with open(f"/proc/{pid}/stat") as f:
        return f.read().rsplit(")", 1)[1].split()[0]


def _wait_file(path: Path, timeout: float = 10.0) -> str:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            text = path.read_text()
            if text:
                return text
        except OSError:
            pass
        time.sleep(0.005)
    raise AssertionError(f"{path.name} never written")


def _until(cond, timeout: float = 5.0) -> bool:
    """``cond()`` became true within ``timeout`` (a signalled process stops once it is scheduled)."""
    deadline = time.monotonic() + timeout
    while not cond():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.005)
    return True


def _count(workdir: Path) -> int:
    return int(_wait_file(workdir / "count"))


def _executor_over(proc: sb.SandboxedProcess) -> Executor:
    """The judge's ``Executor`` stop/cont/kill logic over a bare sandboxed process (no worker protocol)."""
    ex = Executor.__new__(Executor)
    ex.proc, ex.pid, ex._stops, ex.stopped = proc, proc.pid, 0, False
    ex._members = proc.members()                              # the judge's scan: before the child exists
    return ex


@pytest.fixture()
def tree(tmp_path):
    caps = sb.probe()
    if not caps.seccomp:
        pytest.skip(f"no seccomp here: the tree is not sealed in its group ({dict(caps.errors)})")
    workdir = Path(sb.make_workdir(str(tmp_path)))
    proc = sb.spawn([sys.executable, "-c", TREE], sb.SandboxPolicy(workdir=str(workdir)))
    yield proc, workdir
    proc.kill_all()


def test_a_child_forked_after_the_scan_stops_with_its_parent_and_dies_with_the_tree(tree):
    proc, workdir = tree
    assert proc.group == proc.executor_pid and proc.group != os.getpgid(proc.pid)   # the launcher stays out
    ex = _executor_over(proc)
    (workdir / "go").write_text("1")                          # the child is forked now, after the scan
    told = _wait_file(workdir / "told").rsplit(";", 1)[0]
    (child,) = set(proc.members()) - set(ex._members)        # its pid as the judge sees it
    assert told == "setsid errno 1;setpgid errno 1"           # EPERM: it cannot leave the group
    assert os.getpgid(child) == proc.group
    _count(workdir)
    for _ in range(3):                                         # twice per timed pair, many times over
        ex.stop()
        assert _until(lambda: _state(child) == "T" and _state(proc.executor_pid) == "T")
        assert _state(proc.pid) != "T"                          # the launcher stays awake
        frozen = _count(workdir)
        time.sleep(0.2)
        assert _count(workdir) == frozen
        ex.cont()
        assert _until(lambda: _count(workdir) > frozen)
    ex.kill_known()
    proc.kill_all()
    assert not os.path.exists(f"/proc/{child}") or _state(child) in ("Z", "X")
    assert proc.members(full=True) == []


def test_without_seccomp_the_group_is_not_claimed(tmp_path):
    """Where the calls are not denied a candidate can leave the group: ``signal_group`` then declines and
    the callers fall back to their ``/proc`` scans (nothing pretends the tree is sealed)."""
    workdir = sb.make_workdir(str(tmp_path))
    with sb.spawn([sys.executable, "-c", "import time; time.sleep(30)"],
                  sb.SandboxPolicy(workdir=workdir, disable=("seccomp",))) as proc:
        assert proc.group is None
        assert proc.signal_group(signal.SIGSTOP) is False
        assert _state(proc.executor_pid) != "T"


def _writable_cgroup_v2() -> str | None:
    """A cgroup v2 directory here that we may make children in (with ``cgroup.freeze`` and ``cgroup.kill``)."""
    for root in ("/sys/fs/cgroup", "/sys/fs/cgroup/unified"):
        if os.path.isfile(os.path.join(root, "cgroup.procs")) and os.access(root, os.W_OK):
            probe = os.path.join(root, f"tkcc-test-probe-{os.getpid()}")
            try:
                os.mkdir(probe)
            except OSError:
                continue
            ok = all(os.path.exists(os.path.join(probe, f)) for f in ("cgroup.freeze", "cgroup.kill"))
            os.rmdir(probe)
            if ok:
                return root
    return None


def test_a_cgroup_of_its_own_freezes_and_kills_the_tree_the_same_way(tree):
    """Where the executor's tree has a cgroup v2 directory of its own (``proc.cgroup``: the launcher stays
    out), ``stop`` freezes it and ``kill_known`` kills it through the cgroup, the late child included."""
    root = _writable_cgroup_v2()
    if root is None:
        pytest.skip("no writable cgroup v2 hierarchy with cgroup.freeze / cgroup.kill here")
    proc, workdir = tree
    cg = os.path.join(root, f"tkcc-test-{os.getpid()}-{proc.executor_pid}")
    os.mkdir(cg)
    try:
        with open(os.path.join(cg, "cgroup.procs"), "w") as f:
            f.write(str(proc.executor_pid))                   # before it forks: the child is born inside
        proc.cgroup, proc.group = cg, None                    # the cgroup alone must do it
        ex = _executor_over(proc)
        (workdir / "go").write_text("1")
        _wait_file(workdir / "told")
        (child,) = set(proc.members()) - set(ex._members)
        assert str(proc.pid) not in open(os.path.join(cg, "cgroup.procs")).read().split()
        _count(workdir)
        ex.stop()
        assert _until(lambda: "frozen 1" in open(os.path.join(cg, "cgroup.events")).read())
        frozen = _count(workdir)
        time.sleep(0.2)
        assert _count(workdir) == frozen
        ex.cont()
        assert _until(lambda: _count(workdir) > frozen)
        ex.kill_known()
        assert _until(lambda: not os.path.exists(f"/proc/{child}") or _state(child) in ("Z", "X"))
    finally:
        proc.kill_all()
        assert _until(lambda: _rmdir(cg))                     # empty once its processes are reaped


def _rmdir(path: str) -> bool:
    try:
        os.rmdir(path)
        return True
    except FileNotFoundError:
        return True
    except OSError:
        return False


class _GoneTree:
    """An executor's process whose launcher has exited and been reaped: no group, no cgroup, no members."""

    pid = -1

    def poll(self) -> int:
        return 0

    def signal_group(self, sig: int) -> bool:
        return False

    def members(self, full: bool = False) -> list[int]:
        return []


def test_the_pids_of_a_tree_that_is_gone_are_never_signalled():
    """Once the launcher is reaped, the pids of the last scan are free for reuse (pid_max 32,768 on the CI
    machine): stop, cont and kill_known leave a process that now holds one of them alone."""
    import subprocess

    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        ex = object.__new__(Executor)
        ex.proc, ex.pid, ex._members, ex._stops, ex.stopped = _GoneTree(), bystander.pid, [bystander.pid], 0, False
        ex.stop()
        assert ex.stopped and _state(bystander.pid) != "T"
        ex.cont()
        ex.kill_known()
        time.sleep(0.05)
        assert bystander.poll() is None and _state(bystander.pid) not in ("T", "Z")
    finally:
        bystander.kill()
        bystander.wait()


def test_two_threads_releasing_one_workdir_view_close_its_fd_once(tmp_path, monkeypatch):
    """A pool's warm-up thread and its ``close`` may kill one dying executor at the same time: the judge's
    view fd is closed once (a second close of the number would close whatever the judge opened since)."""
    proc = sb.spawn([sys.executable, "-c", "pass"], sb.SandboxPolicy.for_device("cpu", sb.make_workdir(str(tmp_path))))
    proc.kill_all()
    if proc._view_fd is None:
        pytest.skip("no private tmpfs here: the judge holds no view fd")
    real_close, closed = os.close, []

    def slow_close(fd):                  # widens the window between reading the number and closing it
        closed.append(fd)
        time.sleep(0.05)
        real_close(fd)

    monkeypatch.setattr(os, "close", slow_close)
    errors = []

    def release():
        try:
            proc.release_workdir()
        except OSError as e:
            errors.append(e)

    threads = [threading.Thread(target=release) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(closed) == 1, (errors, closed)
