"""What the executor sees of the host (stdlib only: ``confine.py`` imports it under ``python -I -S``).

Three parts, applied by the launcher before the executor execs its argv:

- **identity** (``start_mapper`` / ``finish_mapper`` / ``become``): a launcher that is root on the host forks a
  *mapper* before it enters its user namespace; the mapper, still in the host's namespace, writes the new
  namespace's maps ``0 0 1`` (the launcher: mounts, then nothing of the candidate's) and ``U U 1`` (``run_as``, by
  default 65534, *nobody*). The executor then drops to ``U`` (no supplementary groups), so root-owned files with
  no "other" bits (``0600`` secrets, ``/root`` at ``0700``) stay closed to it: ``U`` is not their owner and has no
  capability over host-owned inodes. Without a privileged launcher (or with the mapper refused) the maps are the
  launcher's own ids, as before: a non-root judge's executor is that non-root user.
- **files** (``private_fs``): the workdir on a fresh tmpfs of ``workdir_bytes`` (the judge's files in it copied
  in, all owned by ``U``), or the host workdir itself (chowned to ``U`` by the judge); then an empty read-only
  tmpfs over the workdir's parent, ``/tmp``, ``/var/tmp`` and ``/run`` (``hide``), so no other executor's
  directory, no earlier candidate's source and no host pathname UNIX socket there (D-Bus, container runtimes,
  PostgreSQL, a Ray raylet, ssh agents) is visible; the workdir, the extra writable dirs and the ``reveal``
  dirs (what the CUDA driver may need: the persistence daemon's socket dir, the MPS pipe dir) are bound back.
  What the executor must read to run (``keep``: the interpreter, this package, PYTHONPATH) is bound back when
  under a hidden dir; an ancestor of it that ``U`` cannot search (``/root`` at 0700 holding a pyenv Python) is
  hidden too, so ``U`` reaches the interpreter and nothing beside it.
- **reading** (``unreadable``): which of ``keep`` a process of uid ``U`` could not read; the executor stays at the
  launcher's uid then, and says so.
"""

from __future__ import annotations

import ctypes
import os
import shutil

libc = ctypes.CDLL(None, use_errno=True)
MS_NOSUID, MS_NODEV, MS_BIND, MS_REC = 2, 4, 4096, 1 << 14
O_DIR_PATH = os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC
HIDE = ("/tmp", "/var/tmp", "/run", "/var/run")
SOCKET_DIRS = ("/tmp", "/var/tmp", "/run", "/var/run")   # where host services put their pathname sockets


def _mount(src: str, dst: str, fstype: str | None, flags: int, data: str | None = None) -> None:
    if libc.mount(src.encode(), dst.encode(), fstype.encode() if fstype else None, flags,
                  data.encode() if data else None) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"mount {dst}: {os.strerror(err)}")


# ------------------------------------------------------------------------------------ identity
def start_mapper(run_as: int) -> tuple[int, int]:
    """Fork the mapper (host namespaces, root): on a byte from the launcher, once it has unshared its user
    namespace, it writes the launcher's ``uid_map`` and ``gid_map``. Returns (pid, pipe write end)."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(w)
        code = 1
        try:
            if os.read(r, 1) == b"g":
                for name in ("uid_map", "gid_map"):
                    with open(f"/proc/{os.getppid()}/{name}", "w") as f:
                        f.write(f"0 0 1\n{run_as} {run_as} 1\n")
                code = 0
        except OSError:
            pass
        os._exit(code)
    os.close(r)
    return pid, w


def finish_mapper(mapper: tuple[int, int], go: bool) -> bool:
    """Let the mapper write (``go``) or just end; True when both maps are written."""
    pid, w = mapper
    try:
        if go:
            os.write(w, b"g")
    finally:
        os.close(w)
    status = os.waitpid(pid, 0)[1]
    return go and os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0


def unreadable(paths: list[str], uid: int) -> list[str]:
    """Which of ``paths`` a process of uid ``uid`` (no groups) could not reach: every ancestor searchable, the
    path readable (and searchable if a dir), by the "other" bits or as owner."""
    bad = []
    for path in paths:
        parts, ok = os.path.realpath(path).split("/"), True
        for i in range(1, len(parts) + 1):
            cur = "/".join(parts[:i]) or "/"
            try:
                st = os.stat(cur)
            except OSError:
                break                                            # gone: nothing to read, nothing to refuse
            shift = 6 if st.st_uid == uid else 0
            last = i == len(parts)
            need = (4 if last else 0) | (1 if os.path.isdir(cur) else 0)
            if (st.st_mode >> shift) & need != need:
                ok = False
                break
        if not ok:
            bad.append(path)
    return bad


def become(run_as: int) -> None:
    """Drop to ``run_as`` (uid and gid, no supplementary groups); the capabilities go with uid 0."""
    os.setgroups([])
    os.setresgid(run_as, run_as, run_as)
    os.setresuid(run_as, run_as, run_as)


# ------------------------------------------------------------------------------------ files
def chown_tree(root: str, uid: int) -> None:
    for top, dirs, files in os.walk(root):
        for name in dirs + files:
            os.chown(os.path.join(top, name), uid, uid, follow_symlinks=False)
    os.chown(root, uid, uid)


def _under(path: str, root: str) -> bool:
    return path == root or path.startswith(root.rstrip("/") + "/")


def blockers(paths: list[str], uid: int) -> list[str]:
    """For each of ``paths``, its topmost ancestor that ``uid`` cannot search (``/root`` at 0700 holding a
    pyenv Python): hidden like the rest, with the path bound back, so ``uid`` reaches it and nothing beside it."""
    out = set()
    for path in paths:
        parts = os.path.realpath(path).split("/")
        for i in range(2, len(parts)):
            cur = "/".join(parts[:i])
            try:
                st = os.stat(cur)
            except OSError:
                break
            if not (st.st_mode >> (6 if st.st_uid == uid else 0)) & 1:
                out.add(cur)
                break
    return sorted(out)


def private_fs(workdir: str, workdir_bytes: int | None, owner: int | None, writable: list[str],
               hide: list[str], reveal: list[str], keep: list[str]) -> tuple[dict, list[str]]:
    """In the executor's mount namespace, as its root: the workdir (a tmpfs of ``workdir_bytes``, or the host
    dir); ``hide`` dirs (and those that would keep ``owner`` from ``keep``) covered by empty tmpfs (read-only
    once ``readonly_root`` has run); then bound back: the ``keep`` dirs under a hidden one (the Python the
    executor runs), the workdir, ``writable`` and ``reveal``. ``owner`` (the uid the executor will run as) owns
    the tmpfs and what is copied into it. Returns ({mechanism: bool}, the dirs hidden)."""
    got = {"workdir_tmpfs": False, "hidden_dirs": False, "socket_dirs_hidden": False}
    if workdir_bytes:
        host = os.open(workdir, O_DIR_PATH)
        try:
            ids = f",uid={owner},gid={owner}" if owner is not None else ""
            _mount("tmpfs", workdir, "tmpfs", MS_NOSUID | MS_NODEV, f"size={workdir_bytes},mode=0700{ids}")
            shutil.copytree(f"/proc/self/fd/{host}", workdir, symlinks=True, dirs_exist_ok=True)
        finally:
            os.close(host)
        if owner is not None:
            chown_tree(workdir, owner)
        got["workdir_tmpfs"] = True
    keep = sorted({p if os.path.isdir(p) else os.path.dirname(p) for p in map(os.path.realpath, keep)}, key=len)
    blocking = blockers(keep + [workdir], owner) if owner else []
    hide = sorted({os.path.realpath(d) for d in hide} | set(blocking), key=len)
    hide = [d for d in hide if d != "/" and os.path.isdir(d)]
    hidden = [d for i, d in enumerate(hide) if not any(_under(d, h) for h in hide[:i])]
    keep = [k for k in keep if any(_under(k, h) for h in hidden)]
    keep = [k for i, k in enumerate(keep) if not any(_under(k, o) for o in keep[:i])]
    binds = keep + [workdir] + [p for p in writable if p != workdir] + [p for p in reveal if os.path.isdir(p)]
    fds = [(p, os.open(p, O_DIR_PATH)) for p in binds]
    umask = os.umask(0o022)
    try:
        for d in hidden:
            _mount("tmpfs", d, "tmpfs", MS_NOSUID | MS_NODEV, "size=1m,mode=0755")
        for path, fd in fds:
            os.makedirs(path, mode=0o755, exist_ok=True)
            _mount(f"/proc/self/fd/{fd}", path, None, MS_BIND | MS_REC)
    finally:
        os.umask(umask)
        for _, fd in fds:
            os.close(fd)
    parent = os.path.dirname(os.path.realpath(workdir))
    got["hidden_dirs"] = any(_under(parent, h) for h in hidden) and not any(_under(parent, k) for k in keep)
    socket_dirs = {os.path.realpath(d) for d in SOCKET_DIRS if os.path.isdir(d)}
    got["socket_dirs_hidden"] = all(any(_under(d, h) for h in hidden) for d in socket_dirs)
    return got, hidden
