"""A memory cgroup per executor tree, where this machine lets the judge make one (the judge's side; Linux).

``create(name, limit)`` makes ``<the judge's own memory cgroup>/<name>`` with its memory limit and returns its
directory, or ``(None, why)``: cgroup v2 where the judge's cgroup has the ``memory`` controller for its children
(``cgroup.subtree_control``; a delegated subtree, or root), else the v1 ``memory`` hierarchy where it is mounted
and writable (hybrid hosts). The launcher writes its own pid into ``<dir>/cgroup.procs`` before it forks, so the
whole tree is charged there; the kernel's OOM killer then acts inside the tree only (``SandboxedProcess.
memory_cgroup``; the launcher is in it, so it is not the directory ``cgroup.freeze`` would act on).
``remove(dir)`` removes it once its processes are gone. Unlike RLIMIT_AS (CPU only: the CUDA driver reserves
address space beyond the device's memory at init), a cgroup limit counts resident memory, so it holds on CUDA.
"""

from __future__ import annotations

import os
import time

__all__ = ["create", "remove", "supports_kill"]


def _mounts() -> list[tuple[str, str, str]]:
    """(mount point, fstype, super options) of every cgroup mount, from /proc/self/mountinfo."""
    out = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            left, right = line.split(" - ", 1)
            fstype, _, opts = right.split()[:3]
            if fstype in ("cgroup", "cgroup2"):
                out.append((left.split()[4], fstype, opts))
    return out


def _own(controller: str) -> str | None:
    """This process's cgroup path in the v1 hierarchy of ``controller`` ("" for v2's unified one)."""
    with open("/proc/self/cgroup") as f:
        for line in f:
            _, ctrls, path = line.rstrip("\n").split(":", 2)
            if ctrls.split(",") == [controller] or (controller == "" and ctrls == ""):
                return path
    return None


def _v2_base() -> tuple[str | None, str]:
    mount = next((m for m, t, _ in _mounts() if t == "cgroup2"), None)
    own = _own("")
    if mount is None or own is None:
        return None, "no cgroup v2 hierarchy"
    base = os.path.join(mount, own.lstrip("/"))
    try:
        with open(os.path.join(base, "cgroup.controllers")) as f:
            if "memory" not in f.read().split():
                return None, f"cgroup v2: no memory controller delegated to {base}"
        with open(os.path.join(base, "cgroup.subtree_control")) as f:
            enabled = "memory" in f.read().split()
        if not enabled:
            with open(os.path.join(base, "cgroup.subtree_control"), "w") as f:
                f.write("+memory")          # refused (EBUSY) where this cgroup itself holds processes
    except OSError as e:
        return None, f"cgroup v2 at {base}: {e.strerror or e}"
    return base, ""


def _v1_base() -> tuple[str | None, str]:
    mount = next((m for m, t, o in _mounts() if t == "cgroup" and "memory" in o.split(",")), None)
    own = _own("memory")
    if mount is None or own is None:
        return None, "no cgroup v1 memory hierarchy"
    return os.path.join(mount, own.lstrip("/")), ""


def create(name: str, limit_bytes: int) -> tuple[str | None, str]:
    """A fresh memory cgroup ``name`` below the judge's own, limited to ``limit_bytes``: (dir, "") or (None, why)."""
    reasons = []
    for base_of, limit_file in ((_v2_base, "memory.max"), (_v1_base, "memory.limit_in_bytes")):
        try:
            base, why = base_of()
        except OSError as e:
            base, why = None, str(e)
        if base is None:
            reasons.append(why)
            continue
        path = os.path.join(base, name)
        try:
            os.mkdir(path)
        except OSError as e:
            reasons.append(f"{base}: {e.strerror or e}")
            continue
        try:
            with open(os.path.join(path, limit_file), "w") as f:
                f.write(str(limit_bytes))
            if os.path.exists(os.path.join(path, "memory.swap.max")):
                with open(os.path.join(path, "memory.swap.max"), "w") as f:
                    f.write("0")
            return path, ""
        except OSError as e:
            os.rmdir(path)
            reasons.append(f"{path}/{limit_file}: {e.strerror or e}")
    return None, "; ".join(reasons)


def supports_kill(path: str | None) -> bool:
    """Whether ``path`` offers ``cgroup.kill`` (v2, Linux 5.14): the tree killed as one unit."""
    return bool(path) and os.path.exists(os.path.join(path, "cgroup.kill"))


def remove(path: str | None, timeout_s: float = 2.0) -> bool:
    """rmdir the cgroup once its last process is gone (reaped zombies leave it a moment later)."""
    if not path:
        return True
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            os.rmdir(path)
            return True
        except FileNotFoundError:
            return True
        except OSError:
            if time.monotonic() > deadline:
                return False
            time.sleep(0.01)
