"""The handle on a sandboxed executor tree (``SandboxedProcess``, returned by ``sandbox.spawn``): wait,
signal the whole tree (one process group or cgroup operation when possible, else a frozen walk of the
kernel's children lists), kill it, and release the judge's view of its workdir."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from typing import TYPE_CHECKING

from persistent_engine.executor import cgroup_memory

if TYPE_CHECKING:
    from persistent_engine.executor.sandbox import SandboxCapabilities


class SandboxedProcess:
    """Popen-like handle on a sandboxed tree. ``pid`` is the launcher's; ``executor_pid`` the
    executor's (as the judge's PID namespace sees it); ``applied`` what confines it. Dropping the
    handle (or the judge dying) closes the lifeline: the launcher then kills the tree.
    ``workdir_view``: the judge's path to the executor's workdir (its private tmpfs, through an fd held
    until ``release_workdir``: readable after the tree is gone); ``memory_cgroup``: the tree's memory cgroup
    directory or None (the launcher is in it too, so it is never frozen).

    ``group``: the executor's process group id when no process of the tree can leave it (the executor
    made it before confining and seccomp denies setsid/setpgid), else None. ``cgroup``: a cgroup v2
    directory holding exactly the executor's tree (not the launcher), set by whoever placed it there,
    else None. Either makes ``signal_group`` one operation on the whole tree."""

    def __init__(self, popen: subprocess.Popen, lifeline_w: int, executor_pid: int, applied: SandboxCapabilities,
                 namespaces: dict[str, str], workdir_view: str = "", view_fd: int | None = None,
                 memory_cgroup: str | None = None, group: int | None = None):
        self.popen, self.pid, self.executor_pid = popen, popen.pid, executor_pid
        self.applied, self.namespaces, self.group = applied, namespaces, group
        self.cgroup: str | None = None
        self._fd_lock = threading.Lock()      # two threads killing one tree: each fd is closed once
        self._lifeline_w: int | None = lifeline_w
        self.workdir_view, self._view_fd, self.memory_cgroup = workdir_view, view_fd, memory_cgroup

    @property
    def returncode(self) -> int | None:
        return self.popen.returncode

    def poll(self) -> int | None:
        return self.popen.poll()

    def wait(self, timeout: float | None = None) -> int:
        return self.popen.wait(timeout)

    def members(self, full: bool = False) -> list[int]:
        """Every live process of the tree. Quick: the launcher and its descendants through
        ``/proc/PID/task/TID/children`` (orphans are re-parented to the launcher, the subreaper, or to the
        executor, its namespace's init). ``full`` (or without those files, or once the launcher is gone):
        a scan of all of ``/proc`` by parent, plus every process in the sandbox's namespaces."""
        launcher_alive = self.popen.poll() is None          # not reaped: its pid cannot be reused yet
        if not full and launcher_alive:
            tree = _descendants(self.pid)
            if tree is not None:
                return sorted(tree | {self.pid})
        ppid: dict[int, int] = {}
        ns_members = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            pid = int(entry)
            try:
                with open(f"/proc/{entry}/stat") as f:
                    after = f.read().rsplit(")", 1)[1].split()
                if after[0] == "Z":
                    continue
                ppid[pid] = int(after[1])
                if self.namespaces and any(os.readlink(f"/proc/{entry}/ns/{k}") == v
                                           for k, v in self.namespaces.items()):
                    ns_members.append(pid)
            except (OSError, IndexError, ValueError):
                continue
        tree, frontier = set(), [self.pid] if launcher_alive else []
        while frontier:
            p = frontier.pop()
            kids = [c for c, pp in ppid.items() if pp == p and c not in tree]
            tree.update(kids)
            frontier += kids
        if launcher_alive and self.pid in ppid:
            tree.add(self.pid)
        return sorted(tree | set(ns_members))

    def signal_group(self, sig: int) -> bool:
        """SIGSTOP / SIGCONT / SIGKILL to every process of the executor's tree as one unit (the launcher
        is not part of it: it stays awake to kill the tree when the judge dies); a child forked meanwhile
        gets it too. The cgroup when there is one (``cgroup.freeze`` / ``cgroup.kill``), else one
        killpg(2) on the sealed ``group`` (~9 us on a 2-core box). False when neither holds (the caller
        scans ``/proc``) or the tree is gone. Only while the launcher lives: it reaps the executor, then exits at once,
        so the group id cannot meanwhile name another process's group."""
        if self.popen.poll() is not None:
            return False
        if self.cgroup is not None and sig in (signal.SIGSTOP, signal.SIGCONT, signal.SIGKILL):
            name, value = (("cgroup.kill", "1") if sig == signal.SIGKILL
                           else ("cgroup.freeze", "1" if sig == signal.SIGSTOP else "0"))
            try:
                with open(os.path.join(self.cgroup, name), "w") as f:
                    f.write(value)
                return True
            except OSError:
                pass                                    # no cgroup.kill (Linux < 5.14): the group instead
        if self.group is None:
            return False
        try:
            os.killpg(self.group, sig)
            return True
        except (ProcessLookupError, PermissionError):
            return False

    def send_signal(self, sig: int) -> list[int]:
        """Signal every process of the tree; returns their pids. SIGSTOP rescans until no new process
        appears (a stopped process cannot fork) and until every member is seen stopped (a sibling
        signalled later cannot have continued an earlier one), so nothing of the candidate runs
        while the other side of an A/B is timed; SIGKILL rescans the same way."""
        hit: set[int] = set()
        deadline = time.monotonic() + 2.0
        while time.monotonic() < deadline:
            members = self.members()
            if sig == signal.SIGSTOP:       # the launcher runs no candidate code and must stay awake: a
                members = [p for p in members if p != self.pid]    # stopped one misses the lifeline closing
            todo = [p for p in members if p not in hit]
            if sig == signal.SIGSTOP:
                todo += [p for p in members if p in hit and _state(p) not in ("T", "t", "Z", "X", "")]
            if not todo:
                break
            for pid in todo:
                try:
                    os.kill(pid, sig)
                except (ProcessLookupError, PermissionError):
                    pass
            hit.update(todo)
            if sig not in (signal.SIGSTOP, signal.SIGKILL):
                break
            time.sleep(0.001)
        return sorted(hit)

    def kill_all(self, timeout: float = 5.0) -> int | None:
        """SIGKILL the whole tree (stop it first, so nothing forks meanwhile), reap the launcher, and
        wait until no member is left. Returns the launcher's return code."""
        if self.poll() is None or self.members(full=True):
            self.signal_group(signal.SIGKILL)           # at once, forks racing it included; then the scans
            self.send_signal(signal.SIGSTOP)
            self.send_signal(signal.SIGKILL)
        self.close_lifeline()
        try:
            rc = self.popen.wait(timeout)
        except subprocess.TimeoutExpired:
            rc = None
        deadline = time.monotonic() + timeout
        while (left := self.members(full=True)) and time.monotonic() < deadline:
            for pid in left:
                try:
                    os.kill(pid, signal.SIGKILL)
                except (ProcessLookupError, PermissionError):
                    pass
            time.sleep(0.01)
        if self.memory_cgroup and cgroup_memory.remove(self.memory_cgroup):
            self.memory_cgroup = None
        return rc

    def release_workdir(self) -> None:
        """Drop the judge's hold on the workdir's tmpfs: its memory is freed once the tree is gone. Idempotent
        and thread-safe (a pool's warm-up thread and its ``close`` may both kill a dying executor): a second
        ``os.close`` of the number would close whatever the judge opened under it since."""
        with self._fd_lock:
            fd, self._view_fd = self._view_fd, None
        if fd is not None:
            os.close(fd)

    def close_lifeline(self) -> None:
        """Closing the lifeline tells the launcher to kill the tree and exit."""
        with self._fd_lock:
            fd, self._lifeline_w = self._lifeline_w, None
        if fd is not None:
            os.close(fd)

    def __enter__(self) -> "SandboxedProcess":
        return self

    def __exit__(self, *exc) -> None:
        self.kill_all()

    def __del__(self):
        if getattr(self, "_lifeline_w", None) is not None:
            self.close_lifeline()
        if getattr(self, "_view_fd", None) is not None:
            self.release_workdir()


def _descendants(root: int) -> set[int] | None:
    """All descendants of ``root`` by the kernel's children lists; None where they are not available."""
    found: set[int] = set()
    frontier = [root]
    while frontier:
        pid = frontier.pop()
        try:
            tids = os.listdir(f"/proc/{pid}/task")
        except OSError:
            continue
        for tid in tids:
            try:
                with open(f"/proc/{pid}/task/{tid}/children") as f:
                    kids = [int(c) for c in f.read().split()]
            except FileNotFoundError:
                if pid == root:
                    return None                      # no CONFIG_PROC_CHILDREN
                continue
            except OSError:
                continue
            for kid in kids:
                if kid not in found:
                    found.add(kid)
                    frontier.append(kid)
    return found


def _state(pid: int) -> str:
    """The process state letter from /proc/PID/stat ("" when it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""
