"""Starting executors (through the OS sandbox), talking to them, and the warm pool.

``Executor``: one executor process and the judge's end of its channel. ``call(msg, timeout_s)`` sends one
request and waits for the reply; a process that dies meanwhile is ``ExecutorDied`` (with how it ended and the
tail of its stderr), one that does not answer in time is ``ExecutorTimeout`` (the caller then discards it).
``stop()`` / ``cont()`` send SIGSTOP / SIGCONT to its whole process group: the judge freezes the side of an
A/B pair that is not being timed, so no thread of it runs meanwhile.

Processes are spawned by ``persistent_engine.executor.sandbox.spawn`` with ``sandbox.executor_env`` (the same
environment a served plan sees; never the judge's ``os.environ``); where that module is absent this falls
back to a plain process in its own session with an allow-listed environment (``fallback_env``), and says so
(``SANDBOX``).

``ExecutorPool``: ``size`` executors started and warmed in background threads (imports, CUDA context,
weights from the arena, workloads, kernel warm-up), so that ``take()`` hands out a warm one at once and a
replacement starts warming; each is used for one candidate, then killed.
"""

from __future__ import annotations

import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time

from persistent_engine.executor.channel import ChannelClosed, channel_pair, decode_tensors

try:                                        # issue 20b's OS sandbox
    from persistent_engine.executor import sandbox as _sandbox
except ImportError:                         # pragma: no cover - until it lands
    _sandbox = None

ENV_ALLOW = ("PATH", "PYTHONPATH", "LANG", "LC_ALL", "CUDA_VISIBLE_DEVICES", "LD_LIBRARY_PATH", "OMP_NUM_THREADS",
             "TRITON_INTERPRET", "TKCC_ENGINE_THREADS", "VIRTUAL_ENV")


class ExecutorDied(RuntimeError):
    """The executor process ended while the judge waited for it."""


class ExecutorTimeout(TimeoutError):
    """The executor did not answer within the call's deadline."""


def describe_exit(rc: int | None) -> str:
    if rc is None:
        return "still running"
    if rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    return f"exit code {rc}"


def fallback_env(device: str, tmp: str) -> dict:
    """An allow-listed environment (no API keys, no tokens) for when the sandbox module is absent."""
    env = {k: os.environ[k] for k in ENV_ALLOW if k in os.environ}
    env.update({"HOME": tmp, "TMPDIR": tmp, "PYTHONUNBUFFERED": "1", "PYTHONDONTWRITEBYTECODE": "1",
                "TRITON_CACHE_DIR": os.environ.get("TRITON_CACHE_DIR", os.path.join(tempfile.gettempdir(),
                                                                                   "tkcc-triton-cache"))})
    if not device.startswith("cuda"):
        env["TRITON_INTERPRET"] = "1"
    return env


def executor_env(device: str, tmp: str) -> dict:
    if _sandbox is not None and hasattr(_sandbox, "executor_env"):
        env = dict(_sandbox.executor_env(device))
        for k in ("PYTHONPATH",):           # the judge's code must win in the executor too (worktrees, tests)
            if k in os.environ and k not in env:
                env[k] = os.environ[k]
        return env
    return fallback_env(device, tmp)


SANDBOX = "os-sandbox" if _sandbox is not None and hasattr(_sandbox, "spawn") else "none (own session, allow-listed env)"


class _Plain:
    """A plain child in its own session (fallback when the sandbox module is absent)."""

    def __init__(self, argv, env, pass_fds, stderr):
        self.proc = subprocess.Popen(argv, env=env, pass_fds=pass_fds, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=stderr, start_new_session=True,
                                     cwd=env.get("TMPDIR"))
        self.pid = self.proc.pid

    def poll(self):
        return self.proc.poll()

    def wait(self, timeout=None):
        return self.proc.wait(timeout)

    def send_signal(self, sig):
        try:
            os.killpg(self.pid, sig)
        except (ProcessLookupError, PermissionError):
            pass

    def kill_all(self):
        self.send_signal(signal.SIGKILL)
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            pass


def _spawn(argv, env, pass_fds, stderr):
    if _sandbox is not None and hasattr(_sandbox, "spawn"):
        return _sandbox.spawn(argv, env=env, pass_fds=pass_fds, stderr=stderr)
    return _Plain(argv, env, pass_fds, stderr)


class Executor:
    def __init__(self, init: dict, arena, workdir: str, role: str = "candidate"):
        self.role = role
        self.tmp = tempfile.mkdtemp(prefix=f"tkcc-{role}-", dir=workdir)
        self.stderr_path = os.path.join(self.tmp, "stderr")
        self.chan, theirs = channel_pair()
        argv = [sys.executable, "-m", "persistent_engine.executor.worker", "--fd", str(theirs.fileno()),
                "--arena-fd", str(arena.fd)]
        os.set_inheritable(arena.fd, True)
        env = executor_env(init["device"], self.tmp)
        with open(self.stderr_path, "ab") as err:
            self.proc = _spawn(argv, env, (theirs.fileno(), arena.fd), err)
        theirs.close()
        self.pid = self.proc.pid
        self.stopped = False
        self.chan.send({**init, "arena_size": arena.size, "manifest": arena.manifest})
        self.ready = False

    def wait_ready(self, timeout_s: float) -> None:
        reply = self._recv(time.monotonic() + timeout_s, "start-up")
        if not reply.get("ready"):
            raise ExecutorDied(f"executor did not start: {reply}")
        self.ready = True

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stderr_tail(self, n: int = 300) -> str:
        try:
            with open(self.stderr_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - n))
                return f.read().decode(errors="replace").strip().replace("\n", " | ")
        except OSError:
            return ""

    def _recv(self, deadline: float, what: str) -> dict:
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ExecutorTimeout(f"no answer during {what}")
            try:
                return decode_tensors(self.chan.recv(timeout=min(left, 0.05)))
            except TimeoutError:
                if not self.alive():
                    raise ExecutorDied(self._death()) from None
            except (ChannelClosed, ConnectionError, OSError):
                raise ExecutorDied(self._death()) from None

    def _death(self) -> str:
        try:
            rc = self.proc.wait(5)
        except Exception:  # noqa: BLE001 - still running: its socket closed
            rc = None
        return describe_exit(rc)

    def call(self, msg: dict, timeout_s: float) -> dict:
        try:
            self.chan.send(msg)
        except (ConnectionError, OSError):
            raise ExecutorDied(self._death()) from None
        return self._recv(time.monotonic() + timeout_s, msg.get("op", "?"))

    def stop(self) -> None:
        if not self.stopped:
            self.proc.send_signal(signal.SIGSTOP)
            self.stopped = True

    def cont(self) -> None:
        if self.stopped:
            self.proc.send_signal(signal.SIGCONT)
            self.stopped = False

    def kill(self) -> None:
        try:
            self.proc.kill_all()
        finally:
            self.chan.close()


class ExecutorPool:
    """Warm executors on demand: ``take()`` one (blocking until one is ready), used once, then killed."""

    def __init__(self, make, size: int, start_timeout_s: float = 900.0, log=lambda line: None):
        self._make, self.size, self.start_timeout_s, self._log = make, max(1, size), start_timeout_s, log
        self._ready: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._warming = 0
        self._closed = False
        self._all: set = set()
        for _ in range(self.size):
            self._start_one()

    def _start_one(self) -> None:
        """Spawn on the calling (main) thread: an executor dies with the thread that spawned it
        (PR_SET_PDEATHSIG), so never from a short-lived one; only the wait for its ready line is threaded."""
        with self._lock:
            if self._closed:
                return
            self._warming += 1
        try:
            ex = self._make()
        except BaseException as e:  # noqa: BLE001 - reported to whoever takes it
            self._ready.put(RuntimeError(f"executor failed to start: {type(e).__name__}: {e}"))
            with self._lock:
                self._warming -= 1
            return
        with self._lock:
            self._all.add(ex)
        threading.Thread(target=self._warm, args=(ex,), daemon=True, name="tkcc-executor-warm").start()

    def _warm(self, ex) -> None:
        try:
            ex.wait_ready(self.start_timeout_s)
            self._ready.put(ex)
        except BaseException as e:  # noqa: BLE001 - reported to whoever takes it
            tail = ex.stderr_tail(600) if ex is not None else ""
            self._ready.put(RuntimeError(f"executor failed to start: {type(e).__name__}: {e} {tail}"))
            if ex is not None:
                ex.kill()
        finally:
            with self._lock:
                self._warming -= 1

    def take(self, timeout_s: float | None = None) -> Executor:
        t0 = time.monotonic()
        while True:
            item = self._ready.get(timeout=timeout_s)
            self._start_one()               # a replacement starts warming at once
            if isinstance(item, BaseException):
                raise item
            if item.alive():
                self.waited_s = time.monotonic() - t0
                return item
            self.discard(item)

    def discard(self, ex: Executor) -> None:
        ex.kill()
        with self._lock:
            self._all.discard(ex)

    def close(self) -> None:
        with self._lock:
            self._closed = True
            everyone = list(self._all)
        for ex in everyone:
            ex.kill()
