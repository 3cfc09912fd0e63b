"""Processes that die with their parent: the engine's side of "no process outlives its parent".

``watch_parent(pid)`` starts a daemon thread that checks ``os.getppid()`` every ``interval_s``
(0.2 s) and, once the parent is gone (the process was re-parented to init or a subreaper), kills this
process's whole process group with SIGKILL: the engine is a session leader (the supervisor starts
it with ``start_new_session``), so whatever it spawned (Triton compiler workers, a candidate's
children) dies with it. It is called first thing in the child, before torch is imported, so a kill
of the orchestrator during start-up, baseline or search leaves nothing behind within ~0.2 s.

Why not ``prctl(PR_SET_PDEATHSIG)``: Linux sends that signal when the *thread* that forked the child
exits, and the fleet starts engines from short-lived boot threads and restarts them from agent
threads; a re-parenting check is per process. Stdlib only.
"""

from __future__ import annotations

import os
import signal
import threading

__all__ = ["PARENT_ENV", "watch_parent", "parent_from_env"]

PARENT_ENV = "TKCC_ENGINE_PARENT_PID"       # set by the spawner: the pid this process must not outlive


def parent_from_env(env: dict | None = None) -> int:
    """The pid named by ``TKCC_ENGINE_PARENT_PID`` (0 when unset or not a number)."""
    try:
        return int((os.environ if env is None else env).get(PARENT_ENV, "0") or 0)
    except ValueError:
        return 0


def _die() -> None:
    try:
        if os.getpgrp() == os.getpid():       # a group leader: take the whole group along
            os.killpg(os.getpid(), signal.SIGKILL)
    except OSError:
        pass
    os.kill(os.getpid(), signal.SIGKILL)


def watch_parent(parent_pid: int | None = None, interval_s: float = 0.2) -> threading.Thread | None:
    """Kill this process (and its group, when it leads one) once ``parent_pid`` is no longer its
    parent. ``parent_pid`` defaults to the environment's ``TKCC_ENGINE_PARENT_PID``; with none (the
    engine started by hand) nothing is watched and None is returned. A parent already gone at the
    call is handled at once (the spawner died while this process was starting)."""
    parent = parent_from_env() if parent_pid is None else int(parent_pid)
    if parent <= 0:
        return None
    if os.getppid() != parent:
        _die()

    def watch() -> None:
        stop = threading.Event()
        while not stop.wait(interval_s):
            if os.getppid() != parent:
                _die()

    thread = threading.Thread(target=watch, name="tkcc-lifeline", daemon=True)
    thread.start()
    return thread


def stray_processes(proc: str = "/proc") -> list[dict]:
    """Engine processes of this user that outlived the process that started them: their command line
    runs ``persistent_engine`` and their parent is no longer the ``TKCC_ENGINE_PARENT_PID`` of their
    environment (or is init). Each as ``{"pid", "ppid", "parent_pid", "cmdline"}``; ``tkcc doctor``
    lists them. Linux /proc only (elsewhere: an empty list)."""
    out = []
    try:
        pids = [int(d) for d in os.listdir(proc) if d.isdigit()]
    except OSError:
        return []
    for pid in pids:
        if pid == os.getpid():
            continue
        try:
            with open(f"{proc}/{pid}/cmdline", "rb") as f:
                argv = [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
            if not any("persistent_engine" in a for a in argv):
                continue
            with open(f"{proc}/{pid}/stat", "rb") as f:
                ppid = int(f.read().rsplit(b")", 1)[1].split()[1])
            with open(f"{proc}/{pid}/environ", "rb") as f:
                env = dict(kv.split(b"=", 1) for kv in f.read().split(b"\0") if b"=" in kv)
        except (OSError, ValueError, IndexError):
            continue                         # gone meanwhile, or another user's
        parent = parent_from_env({PARENT_ENV: env.get(PARENT_ENV.encode(), b"0").decode(errors="replace")})
        if (parent and ppid != parent) or ppid == 1:
            out.append({"pid": pid, "ppid": ppid, "parent_pid": parent, "cmdline": " ".join(argv)[:300]})
    return out
