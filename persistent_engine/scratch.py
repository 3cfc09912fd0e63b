"""Scratch directories the engine's processes own, removed when they are done and, after a crash, by the next
one that starts: nothing is left behind.

``owned_dir(kind)`` makes ``<tmp>/tkcc-<kind>-XXXXXXXX`` and holds an exclusive ``flock`` on its ``.owner``
file for as long as the process lives (the kernel drops it when the process dies, however it dies; no PID
to be reused). ``remove_stale(kind)`` removes every such directory whose lock it can take: its owner is gone.
A directory without an ``.owner`` file (made by an older tkcc, or one being made) is left alone.
``remove_tree`` removes a tree a candidate may have made hard to remove (directories without write or
search permission).
"""

from __future__ import annotations

import fcntl
import glob
import os
import shutil
import stat
import sys
import tempfile

OWNER_FILE = ".owner"
_HELD: dict[str, int] = {}               # directory -> the fd holding its lock (kept open: the lock lives)


def owned_dir(kind: str) -> str:
    """A fresh private directory ``tkcc-<kind>-*`` locked as this process's (``release`` when done)."""
    path = tempfile.mkdtemp(prefix=f"tkcc-{kind}-")
    fd = os.open(os.path.join(path, OWNER_FILE), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.write(fd, str(os.getpid()).encode())
    _HELD[path] = fd
    return path


def release(path: str) -> None:
    """Remove ``path`` (made by ``owned_dir``) and drop its lock."""
    remove_tree(path)
    fd = _HELD.pop(path, None)
    if fd is not None:
        os.close(fd)


def remove_stale(kind: str, parent: str | None = None) -> list[str]:
    """Remove the ``tkcc-<kind>-*`` directories whose owner process is dead (their lock free). Returns them."""
    removed = []
    for path in glob.glob(os.path.join(parent or tempfile.gettempdir(), f"tkcc-{kind}-*")):
        if path in _HELD:
            continue
        try:
            fd = os.open(os.path.join(path, OWNER_FILE), os.O_RDONLY | os.O_CLOEXEC | os.O_NOFOLLOW)
        except OSError:
            continue                        # no owner file: not ours to judge
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            continue                        # its owner is alive
        finally:
            os.close(fd)
        remove_tree(path)
        removed.append(path)
    return removed


def remove_tree(path: str) -> None:
    """``shutil.rmtree`` that first gives back the owner's rights a candidate took from a directory
    (``chmod 000``); never follows a link out of the tree; a tree already gone is fine."""
    tried: set[str] = set()
    hook = "onexc" if sys.version_info >= (3, 12) else "onerror"

    def retry(_fn, p, _exc):
        if p in tried:                      # rights given back once: what still fails is left
            return
        tried.add(p)
        try:
            os.chmod(os.path.dirname(p), stat.S_IRWXU)
            if os.path.isdir(p) and not os.path.islink(p):
                os.chmod(p, stat.S_IRWXU)
                shutil.rmtree(p, **{hook: retry})
            elif os.path.lexists(p):
                os.unlink(p)
        except OSError:
            pass
    if os.path.lexists(path):
        shutil.rmtree(path, **{hook: retry})
