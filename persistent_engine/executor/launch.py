"""Starting executors (through the OS sandbox), talking to them, and the warm pool.

``Executor``: one executor process and the judge's end of its channel. ``call(req, timeout_s)`` sends one typed
request (``wire.py``, a fresh random nonce) and waits for its typed reply; a process that dies meanwhile is
``ExecutorDied`` (with how it ended and the tail of its stderr), one that does not answer in time is
``ExecutorTimeout``, one whose reply breaks the protocol (another kind, another nonce, a field of another
type, a frame over the limits or stalled half-written) is ``ExecutorBroke`` (the caller discards it in each
case). Its work directory and stderr file are removed when it is discarded.
``stop()`` / ``cont()`` send SIGSTOP / SIGCONT to its whole tree: the judge freezes the side of an A/B pair
that is not being timed, so no thread of it runs meanwhile. Where the sandbox seals the tree in one process
group (seccomp denies setsid/setpgid: ``sandbox.SandboxedProcess.signal_group``) or gives it a cgroup, that
is one operation (a killpg(2): ~9 us with the launcher check, ~17 us to signal 4 members one by one; twice
per timed pair) that also reaches a child forked after any scan, however briefly it lives; the launcher is
outside the group and stays awake. Without seccomp the known
members are signalled one by one (re-scanned every RESCAN_EVERY stops): a child forked and reaped between
two scans then runs unstopped, the gap issue 38 names, closed wherever seccomp holds.

Processes are spawned by ``sandbox.spawn`` with ``sandbox.executor_env`` (the same environment a served plan
sees; never the judge's ``os.environ``), each with a private work directory; its stderr goes to a file
beside that directory, outside the executor's reach.

``ExecutorPool``: ``size`` executors started and warmed in background threads (imports, CUDA context,
weights from the arena, workloads, kernel warm-up), so that ``take()`` hands out a warm one at once and a
replacement starts warming; each is used for one candidate, then killed.
"""

from __future__ import annotations

import dataclasses
import os
import queue
import secrets
import signal
import sys
import threading
import time

from persistent_engine import scratch
from persistent_engine.executor import sandbox, wire
from persistent_engine.executor.channel import (ChannelClosed, ExecutorProtocolError, Mailbox, channel_pair,
                                               mailbox_bytes)
from persistent_engine.executor.out_ring import OutRing, ring_bytes

# without a sealed process group (no seccomp): the tree is re-scanned (``/proc``, ~10 ms) when a point's timing
# starts and every RESCAN_EVERY stops; the stops themselves signal the known members (microseconds each). A
# process the candidate starts and keeps is found by the judge's scan at the end of bench and rejects the
# candidate (``Executor.extra_processes``).
RESCAN_EVERY = 256


STDERR_TAIL_LINES = 20                  # lines of a dead executor's stderr carried in ExecutorDied
STDERR_TAIL_BYTES = 64 * 1024           # read from the end of its stderr file to find them
STDERR_TAIL_CHARS = 2000                # at most this much of them (the end, escaped) in a message


class ExecutorDied(RuntimeError):
    """The executor process ended while the judge waited for it. ``how``: how it ended (``describe_exit``);
    ``tail``: the last ``STDERR_TAIL_LINES`` lines of its stderr, joined by " | " ("" when it wrote none)."""

    def __init__(self, how: str, tail: str = ""):
        super().__init__(how + (f"; its stderr ended: {tail}" if tail else "; it wrote nothing to stderr"))
        self.how, self.tail = how, tail


class ExecutorBroke(ExecutorDied):
    """The executor's reply broke the protocol (``wire.decode_reply``): its failure, as if it had died."""

    def __init__(self, what: str, why: str):
        super().__init__(f"broke the protocol during {what}: {wire.excerpt(why, 300)}")
        self.what = what


class ExecutorTimeout(TimeoutError):
    """The executor did not answer within the call's deadline."""


class ExecutorStartFailed(RuntimeError):
    """A pool executor that never became ready (``failed_to_start`` says why); the pool starts another."""


def describe_exit(rc: int | None) -> str:
    """How an executor ended: -s (the launcher died by the executor's signal s) or 128 + s (the executor's
    PID-1 wrapper reports its child's signal, ``worker._init_then_serve``) are both "killed by SIG..."."""
    if rc is None:
        return "still running"
    if rc < 0 or 128 < rc < 128 + 65:
        sig = -rc if rc < 0 else rc - 128
        try:
            return f"killed by {signal.Signals(sig).name}"
        except ValueError:
            return f"killed by signal {sig}"
    return f"exit code {rc}"


def executor_env(device: str, policy: "sandbox.SandboxPolicy") -> dict:
    """The environment of every executor: ``sandbox.executor_env`` (the same one ``tkcc plan apply`` and
    serving give a plan's kernels), never the judge's ``os.environ``."""
    extra = {} if device.startswith("cuda") else {"TRITON_INTERPRET": "1"}
    return sandbox.executor_env(policy, extra=extra)


def sandbox_summary(device: str = "cpu") -> str:
    """What confines the executors here, one line (verdict metadata, ``StatusReply.sandbox``)."""
    caps = sandbox.probe("cuda" if device.startswith("cuda") else "cpu")
    line = "complete" if caps.complete() else "incomplete (missing: " + "; ".join(caps.missing()) + ")"
    if sandbox.SandboxPolicy.for_device(device, "/nonexistent").allow_unix_sockets:
        line += "; AF_UNIX sockets allowed (the CUDA driver needs them; the host's socket dirs "
        line += "hidden)" if caps.socket_dirs_hidden else "NOT hidden)"
    return line


class Executor:
    def __init__(self, init: dict, arena, workdir: str, role: str = "candidate"):
        self.role = role
        self.tmp = sandbox.make_workdir(workdir)              # the executor's only writable place
        self.stderr_path = os.path.join(workdir, f"{os.path.basename(self.tmp)}.stderr")   # outside its reach
        self.chan, theirs = channel_pair()
        # its replies' large tensors: this executor's only (sized by the judge, ``channel.mailbox_bytes``)
        self.mailbox = Mailbox.create(init.get("mailbox_bytes") or mailbox_bytes(init["device"].split(":")[0]),
                                      device=init["device"])
        # where its timed runs leave their outputs: the judge's memory (``out_ring``), read at each reply
        self.out = OutRing.create(init.get("ring_bytes") or ring_bytes(init["device"].split(":")[0], 0),
                                  init["device"])
        argv = [sys.executable, "-m", "persistent_engine.executor.worker", "--fd", str(theirs.fileno()),
                "--arena-fd", str(arena.fd), "--mailbox-fd", str(self.mailbox.fd)]
        fds = [theirs.fileno(), arena.fd, self.mailbox.fd]
        if self.out.fd is not None:
            argv += ["--ring-fd", str(self.out.fd)]
            fds.append(self.out.fd)
        for fd in fds[1:]:
            os.set_inheritable(fd, True)
        # the baseline executor runs only reference code for the judge's whole life: no CPU-time cap
        limits = {"cpu_seconds": None} if role == "baseline" else {}
        policy = sandbox.SandboxPolicy.for_device(init["device"], self.tmp, **limits)
        try:
            with open(self.stderr_path, "ab") as err:
                self.proc = sandbox.spawn(argv, policy, env=executor_env(init["device"], policy),
                                          pass_fds=tuple(fds), stderr=err)
        except BaseException:
            self.mailbox.close()
            self.out.close()
            raise
        finally:
            theirs.close()
        self.pid = self.proc.pid
        self.applied = self.proc.applied
        self._members: list[int] = []
        self._stops = 0
        self.stopped = False
        self._pending: list[tuple[type, int]] = []          # (reply class, nonce) of requests sent, in order
        self._ready_nonce = secrets.randbits(62)
        self.chan.send({**init, "arena_size": arena.size, "manifest": arena.manifest,
                        "mailbox_size": self.mailbox.size, "ring": self.out.spec, "nonce": self._ready_nonce})
        self.ready = False

    @property
    def triton_dir(self) -> str:
        """Its Triton cache (``TRITON_CACHE_DIR`` inside its workdir; on its private tmpfs, seen through the
        judge's view, readable until ``remove_files``)."""
        return os.path.join(self.proc.workdir_view, sandbox.ENV_WORKDIR["TRITON_CACHE_DIR"])

    @property
    def own_triton_dir(self) -> str:
        """The same directory at the path the executor itself sees (its workdir's mount point): what Triton's
        group files written for it must name."""
        return os.path.join(self.tmp, sandbox.ENV_WORKDIR["TRITON_CACHE_DIR"])

    def wait_ready(self, timeout_s: float) -> None:
        reply = self._recv(time.monotonic() + timeout_s, "start-up", wire.Ready, self._ready_nonce)
        if not isinstance(reply, wire.Ready):
            raise ExecutorDied(f"executor did not start: {reply}", self.stderr_tail())
        self.ready = True
        self.base_members = set(self.members())     # the launcher and the executor: anything more is the candidate's

    def extra_processes(self) -> list[int]:
        """Processes of the tree beyond those it started with (a candidate's forks or daemons)."""
        return sorted(set(self.members()) - self.base_members)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def stderr_tail(self, lines: int = STDERR_TAIL_LINES) -> str:
        """The last ``lines`` non-empty lines of the executor's stderr (the launcher's sandbox errors, a
        traceback, faulthandler's stack), joined by " | "; at most the last STDERR_TAIL_BYTES are read."""
        try:
            with open(self.stderr_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - STDERR_TAIL_BYTES))
                text = f.read().decode(errors="replace")
        except OSError:
            return ""
        kept = [ln.rstrip() for ln in text.splitlines() if ln.strip()][-lines:]
        return wire.excerpt(" | ".join(kept)[-STDERR_TAIL_CHARS:], STDERR_TAIL_CHARS)    # the candidate wrote it

    def _recv(self, deadline: float, what: str, expect: type, nonce: int) -> wire.ExecutorReply:
        """The reply of class ``expect`` (or ``wire.Failed``) echoing ``nonce``, within ``deadline``."""
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise ExecutorTimeout(f"no answer during {what}")
            try:
                raw = self.chan.recv(timeout=min(left, 0.05))
                return wire.decode_reply(raw, expect, nonce, self.mailbox)
            except TimeoutError:
                if not self.alive():
                    raise self._death() from None
            except ExecutorProtocolError as e:
                raise ExecutorBroke(what, str(e)) from None
            except (ChannelClosed, ConnectionError, OSError):
                raise self._death() from None

    def _death(self) -> ExecutorDied:
        """How the process ended, with its stderr's last lines (read after it exited: nothing is lost)."""
        try:
            rc = self.proc.wait(5)
        except Exception:  # noqa: BLE001 - still running: its socket closed
            rc = None
        return ExecutorDied(describe_exit(rc), self.stderr_tail())

    def call(self, req: wire.ExecutorRequest, timeout_s: float) -> wire.ExecutorReply:
        self.send(req)
        return self.receive(timeout_s, req.KIND)

    def send(self, req: wire.ExecutorRequest) -> None:
        """The first half of ``call``: the request is on its way, with a fresh random nonce (the judge works
        meanwhile). Requests sent are answered in order."""
        nonce = secrets.randbits(62)
        try:
            self.chan.send(wire.to_wire(dataclasses.replace(req, nonce=nonce)))
        except (ConnectionError, OSError):
            raise self._death() from None
        if not isinstance(req, wire.Exit):
            self._pending.append((wire.REPLY_OF[type(req)], nonce))

    def receive(self, timeout_s: float, what: str) -> wire.ExecutorReply:
        """The second half of ``call``: the reply to the oldest request ``send`` sent and not answered yet."""
        if not self._pending:
            raise ExecutorBroke(what, "no request is waiting for a reply")
        expect, nonce = self._pending.pop(0)
        return self._recv(time.monotonic() + timeout_s, what, expect, nonce)

    def has_reply(self) -> bool:
        """Whether a reply (or the end of the channel) is there to read: ``receive`` without waiting."""
        return self.chan.ready()

    def members(self) -> list[int]:
        """Every live process of this executor's tree (re-scanned now)."""
        self._members = self.proc.members()
        self._stops = 0
        return list(self._members)

    def stop(self) -> None:
        """SIGSTOP every process of the tree (all their threads): nothing of it runs until ``cont``."""
        if self.stopped:
            return
        if self.proc.signal_group(signal.SIGSTOP) or self.proc.poll() is not None:
            self.stopped = True                         # one unit (forks included), or the tree is gone
            return
        if not self._members or self._stops >= RESCAN_EVERY:
            self._members = self.proc.members()
            self._stops = 0
        self._stops += 1
        # the launcher stays awake, so the judge's death still ends the tree
        _signal_each([pid for pid in self._members if pid != self.proc.pid], signal.SIGSTOP)
        self.stopped = True

    def cont(self) -> None:
        if not self.stopped:
            return
        if not self.proc.signal_group(signal.SIGCONT) and self.proc.poll() is None:
            _signal_each(self._members, signal.SIGCONT)
        self.stopped = False

    def kill_known(self) -> None:
        """SIGKILL the tree: the sealed group at once, else every process of a fresh scan while the launcher
        lives (``kill`` does the rest: re-scan, reap, wait until none is left). Never the pids of an earlier
        scan once the launcher is gone: they are free for reuse (pid_max is 32,768 on the CI machine, which
        starts tens of thousands of processes a run): a stale one may name any process, an engine included."""
        if not self.proc.signal_group(signal.SIGKILL) and self.proc.poll() is None:
            _signal_each(self.proc.members(), signal.SIGKILL)

    def kill(self, keep_files: bool = False) -> None:
        """SIGKILL the whole tree and wait for it; then its workdir and stderr file are removed (unless
        ``keep_files``: the caller harvests them first, then calls ``remove_files``)."""
        try:
            self.proc.kill_all()
        finally:
            self.chan.close()
            self.mailbox.close()
            self.out.close()
            if not keep_files:
                self.remove_files()

    def remove_files(self) -> None:
        """Its workdir (what the candidate wrote: sources, caches, any file it made) and its stderr file."""
        self.proc.release_workdir()
        scratch.remove_tree(self.tmp)
        try:
            os.unlink(self.stderr_path)
        except OSError:
            pass


def _signal_each(pids, sig: int) -> None:
    """``sig`` to each of ``pids``; a process that is gone (or no longer ours) is passed over."""
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def failed_to_start(e: BaseException, tail: str = "", note: str = "") -> str:
    """One line: why an executor did not start. A SIGKILL with nothing on stderr came from outside (nothing
    in tkcc kills a warming executor but the pool's close): most often the kernel's out-of-memory killer."""
    line = f"executor failed to start: {type(e).__name__}: {e}" + (f"; its stderr ended: {tail}" if tail else "")
    if isinstance(e, ExecutorDied) and "SIGKILL" in e.how and not e.tail:
        line += " (killed from outside: most often the kernel's out-of-memory killer)"
    return line + (f"; {note}" if note else "")


class ExecutorPool:
    """Warm executors on demand: ``take()`` one (blocking until one is ready), used once, then killed."""

    def __init__(self, make, size: int, start_timeout_s: float = 900.0, log=lambda line: None,
                 note=lambda: ""):
        """``note()``: a clause appended to the reason of an executor that failed to start (the judge's
        memory figures at that moment)."""
        self._make, self.size, self.start_timeout_s, self._log = make, max(1, size), start_timeout_s, log
        self._note = note
        self._ready: queue.Queue = queue.Queue()
        self._lock = threading.Lock()
        self._warming = 0
        self._closed = False
        self._all: set = set()
        self._reapers: list[threading.Thread] = []
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
            self._ready.put(ExecutorStartFailed(self._failed(e)))
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
            tail = "" if isinstance(e, ExecutorDied) or ex is None else ex.stderr_tail()
            self._ready.put(ExecutorStartFailed(self._failed(e, tail)))
            if ex is not None:
                with self._lock:
                    self._all.discard(ex)           # killed here: ``close`` must not kill it at the same time
                ex.kill()
        finally:
            with self._lock:
                self._warming -= 1

    def _failed(self, e: BaseException, tail: str = "") -> str:
        """The reason an executor could not start: what ended it, its stderr's tail, the ``note``."""
        try:
            note = self._note()
        except Exception as why:  # noqa: BLE001 - the reason must still be given
            note = f"(memory unknown: {why})"
        return failed_to_start(e, tail, note)

    def warming_count(self) -> int:
        """Executors started and not ready yet (each still to take its device memory)."""
        with self._lock:
            return self._warming

    def take(self, timeout_s: float | None = None) -> Executor:
        t0 = time.monotonic()
        while True:
            item = self._ready.get(timeout=timeout_s)
            self._start_one()               # a replacement starts warming at once
            if isinstance(item, BaseException):
                raise item
            if item.alive():
                self.waited_s = time.monotonic() - t0
                self.hand_out(item)
                return item
            self.discard(item)

    def pause(self) -> list:
        """SIGSTOP every executor of the pool (warming or waiting): on a machine with few cores their start-up
        would add noise to a timed A/B. Returns them for ``resume``."""
        with self._lock:
            everyone = [ex for ex in self._all if ex.alive()]
        for ex in everyone:
            ex.stop()
        return everyone

    @staticmethod
    def resume(paused: list) -> None:
        for ex in paused:
            ex.cont()

    def ready_count(self) -> int:
        return self._ready.qsize()

    def discard(self, ex: Executor, then=None) -> None:
        """SIGKILL the executor's known processes now; the full tree kill (re-scan, reap, wait until no
        member is left: ~10-200 ms) finishes on a reaper thread, off the judge's cycle, which then calls
        ``then()`` (no process of the executor is left to write its files by then)."""
        ex.kill_known()
        with self._lock:
            self._all.discard(ex)

        def reap() -> None:
            ex.kill(keep_files=True)
            try:
                if then is not None:
                    then()
            finally:
                ex.remove_files()

        t = threading.Thread(target=reap, daemon=True, name="tkcc-executor-reap")
        t.start()
        with self._lock:
            self._reapers = [r for r in self._reapers if r.is_alive()] + [t]

    def hand_out(self, ex: Executor) -> None:
        """``ex`` is the judge's now (a candidate's): no longer paused with the pool."""
        with self._lock:
            self._all.discard(ex)

    def close(self) -> None:
        """Kill every executor and wait for the reapers of discarded ones (their files removed)."""
        with self._lock:
            self._closed = True
            everyone = list(self._all)
            reapers = list(self._reapers)
        for ex in everyone:
            ex.kill()
        for t in reapers:
            t.join(timeout=30)
