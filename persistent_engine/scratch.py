"""Scratch directories the engine's processes own, removed when they are done and, after a crash, by the next
one that starts: nothing is left behind.

``owned_dir(kind)`` makes ``<tmp>/tkcc-<kind>-XXXXXXXX`` and holds an exclusive ``flock`` on its ``.owner``
file for as long as the process lives (the kernel drops it when the process dies, however it dies; no PID
to be reused). ``remove_stale(kind)`` removes every such directory whose lock it can take: its owner is gone.
A directory without an ``.owner`` file (made by an older tkcc, or one being made) is left alone.
``remove_tree`` removes a tree a candidate may have made hard to remove (directories without write or
search permission).

Lifetimes (nothing outlives its owner; a crashed owner's directories go at the next start):
- ``tkcc-supervisor-*``: a Supervisor's (the engine's stderr and inputs); released at ``close``, else at
  exit (``atexit``). The engine it starts gets ``SCRATCH_ENV`` = that directory, so the judge's
  ``tkcc-judge-*`` (executors' workdirs ``tkcc-exec-*``, their stderr files, the kernel cache) lies inside
  it: a judge the supervisor SIGKILLs leaves nothing once the supervisor releases its own directory.
- ``tkcc-judge-*``: a judge engine's; released at its ``close``; an executor's workdir inside it is
  removed when its candidate ends (``ExecutorPool.discard``), after its tree is dead.
- ``tkcc-kernels-*``: a fleet's shared kernel cache; released at the fleet's ``close``.
- ``tkcc-modules-*``: this process's imported plan modules (``module_dir``: one ``tkcc-exec-*`` per
  module, named as an executor names it). Kept while the process lives: Triton, inspect and tracebacks
  read a module's file lazily (``inspect.getsource``), so a file is never removed under a live module;
  released at exit.
Every directory ``owned_dir`` made and not released is released by ``atexit`` in the process that made
it (a forked child never releases its parent's); a SIGKILLed owner's are swept by the next
``remove_stale`` of their kind (``owned_dir`` sweeps first for ``modules``; the supervisor and judge at
start-up; the supervisor also sweeps its judges' kind in the system temp dir, for stand-alone judges).
"""

from __future__ import annotations

import atexit
import fcntl
import glob
import os
import shutil
import stat
import sys
import tempfile
import threading
import time

OWNER_FILE = ".owner"
SCRATCH_ENV = "TKCC_SCRATCH_DIR"         # where a process makes its owned dirs (a supervisor's, for its engine)
MODULE_DIR_PREFIX = "tkcc-exec-"         # = candidate.MODULE_DIR_PREFIX (an executor's module dirs)
_HELD: dict[str, tuple[int, int]] = {}   # directory -> (fd holding its lock, kept open; the pid that made it)
_LOCK = threading.Lock()
_MODULES: dict[int, str] = {}            # pid -> its tkcc-modules-* directory


def parent() -> str:
    """Where owned directories go: ``$TKCC_SCRATCH_DIR`` (set by a supervisor for its engine), else the
    system temp dir (``TMPDIR`` honoured)."""
    return os.environ.get(SCRATCH_ENV) or tempfile.gettempdir()


def owned_dir(kind: str, where: str | None = None) -> str:
    """A fresh private directory ``tkcc-<kind>-*`` (in ``where``, default ``parent()``) locked as this
    process's (``release`` when done; else removed at exit)."""
    path = tempfile.mkdtemp(prefix=f"tkcc-{kind}-", dir=where or parent())
    # locked under another name, then renamed: a sweep never sees an ``.owner`` that is not locked yet
    fd = os.open(os.path.join(path, OWNER_FILE + ".new"), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    os.write(fd, str(os.getpid()).encode())
    os.rename(os.path.join(path, OWNER_FILE + ".new"), os.path.join(path, OWNER_FILE))
    _HELD[path] = (fd, os.getpid())
    return path


def module_dir() -> str:
    """A fresh ``tkcc-exec-*`` directory for one imported module (a plan's kernels, a candidate in its
    executor), inside this process's ``tkcc-modules-*`` (made on first use, after removing those of dead
    processes). It lives as long as the process: the module may read its file at any time."""
    with _LOCK:
        home = _MODULES.get(os.getpid())
        if home is None or not os.path.isdir(home):
            remove_stale("modules")
            home = _MODULES[os.getpid()] = owned_dir("modules")
    return tempfile.mkdtemp(prefix=MODULE_DIR_PREFIX, dir=home)


def release(path: str, settle_s: float = 2.0) -> None:
    """Remove ``path`` (made by ``owned_dir``) and drop its lock. A tree that still changes (processes
    dying meanwhile, e.g. executors whose lifeline just closed) is retried for up to ``settle_s``."""
    deadline = time.monotonic() + settle_s
    remove_tree(path)
    while os.path.lexists(path) and time.monotonic() < deadline:
        time.sleep(0.02)
        remove_tree(path)
    held = _HELD.pop(path, None)
    if held is not None:
        os.close(held[0])


@atexit.register
def release_all() -> None:
    """Every directory this process made and still holds (at exit: ``close`` was never called)."""
    for path, (_, pid) in list(_HELD.items()):
        if pid == os.getpid():
            try:
                release(path, settle_s=0.5)
            except OSError:
                pass


def remove_stale(kind: str, where: str | None = None) -> list[str]:
    """Remove the ``tkcc-<kind>-*`` directories in ``where`` (default ``parent()``) whose owner process is
    dead (their lock free). Returns them."""
    removed = []
    for path in glob.glob(os.path.join(where or parent(), f"tkcc-{kind}-*")):
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
    root = os.path.abspath(path)

    def retry(_fn, p, _exc):
        if p in tried:                      # rights given back once: what still fails is left
            return
        tried.add(p)
        try:
            if os.path.abspath(p) != root:  # never the rights of a directory outside the tree (``/tmp``)
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
