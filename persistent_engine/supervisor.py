"""The supervisor (orchestrator side): one engine process, kept alive whatever candidates do.

``Supervisor.evaluate(source, timeout_s)`` sends load -> verify -> bench -> unload to the engine with
one deadline for the whole cycle. A crash (abort, segfault, a CUDA error that made the engine exit)
is noticed within ~50 ms through the process handle; a hang is cut by the watchdog at the deadline
(the engine's process group is killed). Either way the candidate is rejected with the reason, a
fresh engine is started, and the next candidate is served. Start-up stages (process, imports,
weights, kv_cache, warmup, calibration, graph_capture) are read from the engine's JSON lines as they happen.

Stdlib + pyzmq + msgpack only (no torch here): the engine is another process.
"""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from persistent_engine import scratch
from persistent_engine.verification import interpreter
from persistent_engine.client import EngineClient, EngineDied, EngineTimeout
from persistent_engine.io_struct import ErrorReply, PointTiming, Reply, WorkloadPoint
from persistent_engine.server import TOKEN_ENV, make_token

STAGES = ("process", "imports", "weights", "kv_cache", "warmup", "calibration", "graph_capture")


class EngineStartError(RuntimeError):
    """The engine process did not become ready (bad model, bad arguments, or it died starting)."""

    user_error = True


@dataclass(frozen=True)
class CandidateVerdict:
    correct: bool
    reasons: list[str]
    speedup: float | None
    per_point: list[PointTiming] = field(default_factory=list)
    timings: dict = field(default_factory=dict)     # load_s, verify_s, bench_s, total_s, restart_s
    restarted: bool = False
    sandbox: dict = field(default_factory=dict)     # mechanisms that confined the candidate's executor
    untimed: str = ""                               # why a correct candidate was not timed (speedup None)
    notes: list[str] = field(default_factory=list)  # what verification excused, in words (``interpreter``)

    def to_dict(self) -> dict:
        return {"correct": self.correct, "reasons": list(self.reasons), "speedup": self.speedup,
                "per_point": [p.to_dict() for p in self.per_point], "timings": dict(self.timings),
                "restarted": self.restarted, "sandbox": dict(self.sandbox), "untimed": self.untimed,
                "notes": list(self.notes)}


INTERPRETED = ("not timed: its Triton kernels run in Triton's interpreter on CPU, orders of magnitude slower "
               "than compiled; that time is no speedup (time it on a GPU)")


def interpreted_triton(source: str, device: str) -> str:
    """Why a candidate is verified but not timed on ``device`` ("" when it is timed): a source defining a
    Triton kernel on CPU, where its kernels run interpreted (``TRITON_INTERPRET=1``)."""
    return INTERPRETED if device == "cpu" and interpreter.defines_triton_kernel(source) else ""


def describe_exit(rc: int | None) -> str:
    if rc is None:
        return "still running"
    if rc < 0:
        try:
            return f"killed by {signal.Signals(-rc).name}"
        except ValueError:
            return f"killed by signal {-rc}"
    if rc == 3:
        return "exit code 3: the engine left after a device error or a leaked thread"
    return f"exit code {rc}"


class Supervisor:
    def __init__(self, model: str, layers: list[int] | int | None = None, device: str = "cpu",
                 points: list[WorkloadPoint] | None = None, *, dtype: str = "bf16", variants: int = 2,
                 samples: int = 0, start_timeout_s: float = 900.0, env: dict | None = None,
                 python: str = sys.executable, log: Callable[[str], None] | None = None,
                 cuda_graph: bool = True, auto_restart: bool = True, inputs: dict | None = None,
                 co_tenant_weights: int = 0):
        """``auto_restart=False``: after a crash or hang the engine is only killed; the next call
        starts a fresh one (a one-shot ``tkcc candidate check`` never pays for a restart).
        ``co_tenant_weights``: bytes of weights other engines on the same device hold or will hold
        (``EngineConfig.co_tenant_weights``)."""
        self.model, self.device, self.dtype = model, device, dtype
        self.layers = list(range(layers)) if isinstance(layers, int) else layers
        self.points = points
        self.variants, self.samples = variants, samples
        self.start_timeout_s = start_timeout_s
        self.cuda_graph = cuda_graph
        self.inputs = dict(inputs or {})        # tier_inputs.TierInputs as JSON
        self.co_tenant_weights = int(co_tenant_weights)
        self.auto_restart = auto_restart
        self._env = dict(os.environ if env is None else env)
        self._python = python
        self._log = log or (lambda line: None)
        self._token = make_token()
        scratch.remove_stale("supervisor")     # those of supervisors that died (their lock is free)
        scratch.remove_stale("judge")          # stand-alone judges' (a supervised one's is inside its dir)
        self._dir = scratch.owned_dir("supervisor")     # the engine's stderr and inputs: removed at close
        self.proc: subprocess.Popen | None = None
        self.client: EngineClient | None = None
        self.startup: dict[str, float] = {}
        self.ready_info: dict = {}
        self.restarts: list[dict] = []
        self._lines: queue.Queue = queue.Queue()
        self._stderr_path = os.path.join(self._dir, "engine.stderr")
        self._stderr_read = 0                   # bytes of it already passed to ``log`` (``_forward_engine_lines``)

    # ------------------------------------------------------------------------------ process
    def _command(self) -> list[str]:
        cmd = [self._python, "-m", "persistent_engine", "serve", "--model", self.model,
               "--device", self.device, "--dtype", self.dtype, "--variants", str(self.variants)]
        if self.layers is not None:
            cmd += ["--layers", ",".join(str(i) for i in self.layers) + ("," if len(self.layers) == 1 else "")]
        if self.points:
            path = os.path.join(self._dir, "points.json")
            with open(path, "w") as f:
                json.dump([p.to_dict() for p in self.points], f)
            cmd += ["--points", path]
        if not self.cuda_graph:
            cmd.append("--no-cuda-graph")
        if self.co_tenant_weights:
            cmd += ["--co-tenant-weights", str(self.co_tenant_weights)]
        if self.inputs:
            path = os.path.join(self._dir, "inputs.json")
            with open(path, "w") as f:
                json.dump(self.inputs, f)
            cmd += ["--inputs", path]
        return cmd

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> dict:
        """Start the engine and wait for its ready line; returns the stage timings (seconds)."""
        t0 = time.monotonic()
        env = dict(self._env)
        env[TOKEN_ENV] = self._token            # the token travels in the environment, not argv
        env["TKCC_ENGINE_PARENT_PID"] = str(os.getpid())
        env["TKCC_ENGINE_SPAWNED_AT"] = repr(time.time())
        env.setdefault("PYTHONUNBUFFERED", "1")
        if not os.path.isdir(self._dir):       # started again after close
            self._dir = scratch.owned_dir("supervisor")
            self._stderr_path = os.path.join(self._dir, "engine.stderr")
            self._stderr_read = 0
        env[scratch.SCRATCH_ENV] = self._dir    # the judge's directory inside ours: gone with ours at close
        stderr = open(self._stderr_path, "ab")
        self.proc = subprocess.Popen(self._command(), stdout=subprocess.PIPE, stderr=stderr, env=env,
                                     stdin=subprocess.DEVNULL, start_new_session=True)
        stderr.close()
        self._lines = queue.Queue()
        threading.Thread(target=self._pump, args=(self.proc, self._lines), daemon=True,
                         name="tkcc-engine-stdout").start()
        stages: dict[str, float] = {}
        deadline = t0 + self.start_timeout_s
        while True:
            try:
                line = self._lines.get(timeout=max(0.01, min(0.2, deadline - time.monotonic())))
            except queue.Empty:
                line = None
            if line is None:
                if not self.alive():
                    raise EngineStartError(f"engine did not start ({describe_exit(self.proc.poll())}): "
                                           f"{self._stderr_tail()}")
                if time.monotonic() > deadline:
                    self._kill()
                    raise EngineStartError(f"engine not ready within {self.start_timeout_s:.0f} s")
                continue
            if "stage" in line:
                stages[line["stage"]] = float(line["seconds"])
                self._log(f"[engine] {line['stage']:<14} {line['seconds']:8.3f} s")
            elif line.get("ready") is True:
                self.ready_info = line
                break
            elif line.get("ready") is False:
                self.proc.wait(timeout=30)
                raise EngineStartError(f"engine refused to start: {line.get('error')}")
        stages = {**stages, **line.get("startup", {})}
        stages["total_to_ready"] = time.monotonic() - t0
        self.startup = stages
        self._log(f"[engine] ready on {line['address']} in {stages['total_to_ready']:.2f} s")
        self.client = EngineClient(line["address"], self._token, alive=self.alive)
        return stages

    @staticmethod
    def _pump(proc: subprocess.Popen, lines: queue.Queue) -> None:
        """Drain the engine's stdout (a candidate's prints must never fill the pipe and block it)."""
        for raw in proc.stdout:
            try:
                obj = json.loads(raw)
            except (ValueError, UnicodeDecodeError):
                continue
            if isinstance(obj, dict):
                lines.put(obj)

    def _forward_engine_lines(self) -> None:
        """The engine's own log lines (``tkcc-engine[pid]: ...``: an executor that died and why, a trusted compile,
        a fallback) written since the last call, each passed to ``log``: the run's log names every executor
        death, not only the candidates' verdicts. At most 64 KiB per call; other stderr text is left for the
        crash tail. Called after each evaluation, the profile and the engine's end."""
        chunk = 64 << 10
        try:
            with open(self._stderr_path, "rb") as f:
                f.seek(self._stderr_read)
                data = f.read(chunk)
        except OSError:
            return
        end = data.rfind(b"\n") + 1              # complete lines only; a partial one waits for its end
        if end == 0 and len(data) == chunk:     # one line longer than a chunk: passed over, its rest too
            self._stderr_read += chunk
            return
        self._stderr_read += end
        for line in data[:end].decode(errors="replace").splitlines():
            if line.startswith("tkcc-engine["):
                self._log(f"[engine] {line.split(': ', 1)[-1]}")

    def _stderr_tail(self, n: int = 300) -> str:
        try:
            with open(self._stderr_path, "rb") as f:
                f.seek(0, os.SEEK_END)
                f.seek(max(0, f.tell() - n))
                return f.read().decode(errors="replace").strip().replace("\n", " | ")
        except OSError:
            return ""

    def _kill(self) -> None:
        if self.proc is None:
            return
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)    # the engine and anything it spawned
            except (ProcessLookupError, PermissionError):
                self.proc.kill()
        try:
            self.proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            pass
        if self.client is not None:
            self.client.close()
            self.client = None

    def _after_failure(self, reason: str) -> float:
        if self.auto_restart:
            return self.restart(reason)
        self._kill()
        return 0.0

    def restart(self, reason: str) -> float:
        t0 = time.monotonic()
        self._kill()
        self._log(f"[supervisor] restarting the engine: {reason}")
        self.start()
        seconds = time.monotonic() - t0
        self.restarts.append({"reason": reason, "seconds": seconds})
        return seconds

    def ensure_running(self) -> bool:
        """Start or restart the engine when it is not running; True when it had to."""
        if self.alive() and self.client is not None:
            return False
        if self.proc is None:
            self.start()
        else:
            self.restart(f"engine had exited ({describe_exit(self.proc.poll())})")
        return True

    # ------------------------------------------------------------------------------ calls
    def prepare(self, sources: list[str]) -> None:
        """Tell the running engine which sources come next, the next one first (it loads and compiles them
        ahead, ``io_struct.Prepare``), and have an executor ready for it. Best effort: an engine that is not
        running or does not answer is left to ``evaluate``."""
        if not self.alive() or self.client is None:
            return
        try:
            self.client.prepare(timeout_s=self.start_timeout_s, sources=list(sources))
        except (EngineTimeout, EngineDied):
            pass

    def evaluate(self, source: str, timeout_s: float = 300.0, name: str = "candidate",
                 samples: int | None = None, queued: list[str] | tuple = ()) -> CandidateVerdict:
        """Load, verify, bench and unload ``source``. ``queued``: the sources waiting for this engine after it,
        which the engine starts compiling ahead (``io_struct.Prepare``)."""
        restarted = self.ensure_running()
        pool_wait = time.monotonic()
        try:                                    # a warm executor first: waiting for one is not the candidate's time
            self.client.prepare(timeout_s=self.start_timeout_s, sources=[source, *queued])
        except (EngineTimeout, EngineDied):
            pass                                # the load below reports it
        pool_wait = time.monotonic() - pool_wait
        t0 = time.monotonic()
        deadline = t0 + timeout_s
        timings: dict[str, float] = {}
        reasons: list[str] = []
        speedup, per_point, confined, notes = None, [], {}, []
        untimed = interpreted_triton(source, self.device)
        phase = "load"

        def call(fn, *args):
            left = deadline - time.monotonic()
            if left <= 0:
                raise EngineTimeout("deadline passed")
            s = time.monotonic()
            reply = fn(*args, timeout_s=left)
            timings[f"{phase}_s"] = time.monotonic() - s
            return reply

        try:
            r = call(self.client.load_candidate, source, name)
            confined = dict(getattr(r, "sandbox", None) or {})
            timings["compiled_ahead"] = 1.0 if getattr(r, "ahead", False) else 0.0
            reasons += _reasons(r)
            if not reasons:
                phase = "verify"
                v = call(self.client.verify, None)
                reasons += _reasons(v)
                notes = (v.message or "").split("; ")[1:] if getattr(v, "ok", False) else []
            if not reasons and not untimed:
                phase = "bench"
                b = call(self.client.bench, self.samples if samples is None else samples, 0)
                reasons += _reasons(b)
                speedup = getattr(b, "speedup", None)
                per_point = list(getattr(b, "per_point", []))
            phase = "unload"
            reasons += list(call(self.client.unload).reasons)     # what its guards found once it was gone
        except EngineTimeout:
            reasons.append(f"hang: no answer during {phase} within the {timeout_s:g} s timeout "
                           "(watchdog killed the engine)")
            timings["restart_s"] = self._after_failure(f"watchdog timeout during {phase}")
            restarted = self.auto_restart
        except EngineDied:
            rc = self.proc.wait(timeout=30) if self.proc else None
            tail = self._stderr_tail(200)
            # the engine logs why it left (exception, poisoning cause, faulthandler stack) on stderr
            self._log(f"[supervisor] engine died during {phase} ({describe_exit(rc)}); stderr tail: "
                      f"{self._stderr_tail(3000)}")
            if phase != "unload":       # after the verdict: it left on purpose (exit 3), not a crash
                reasons.append(f"crash: engine died during {phase} ({describe_exit(rc)})"
                               + (f": {tail}" if tail and rc is not None and rc >= 0 else ""))
            timings["restart_s"] = self._after_failure(f"crash during {phase}")
            restarted = self.auto_restart
        if not self.alive() and self.proc is not None and self.client is not None:
            # it left on purpose (device error, leaked thread)
            timings["restart_s"] = self._after_failure("engine exited after the candidate")
            restarted = self.auto_restart
        self._forward_engine_lines()
        timings["total_s"] = time.monotonic() - t0
        timings["pool_wait_s"] = pool_wait
        return CandidateVerdict(correct=not reasons, reasons=reasons, speedup=speedup,
                                per_point=per_point, timings=timings, restarted=restarted, sandbox=confined,
                                untimed=untimed if not reasons else "", notes=notes if not reasons else [])

    def profile(self, timeout_s: float = 600.0) -> dict:
        self.ensure_running()
        r = self.client.profile(timeout_s=timeout_s)
        self._forward_engine_lines()
        if not r.ok:
            raise RuntimeError(f"profile failed: {r.message}")
        return {"per_point": [p.to_dict() for p in r.per_point], "timer": r.timer}   # the profile document

    def status(self, timeout_s: float = 30.0) -> Reply:
        self.ensure_running()
        return self.client.status(timeout_s=timeout_s)

    def close(self) -> None:
        if self.alive() and self.client is not None:
            try:
                self.client.shutdown(timeout_s=10)
                self.proc.wait(timeout=10)
            except (EngineTimeout, EngineDied, subprocess.TimeoutExpired):
                pass
        self._kill()
        self._forward_engine_lines()            # what it said on its way out
        scratch.release(self._dir)

    def __enter__(self) -> "Supervisor":
        self.ensure_running()
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _reasons(reply: Reply) -> list[str]:
    if isinstance(reply, ErrorReply):
        return [f"{reply.kind}: {reply.message}"]
    if reply.ok:
        return []
    return list(getattr(reply, "reasons", None) or [reply.message or "rejected"])


def startup_table(stages: dict[str, float]) -> str:
    """Start-up stages as a two-column table (like Table 1 of the Together post)."""
    rows = [(s, stages[s]) for s in STAGES if s in stages]
    total = sum(v for _, v in rows)
    lines = [f"{'stage':<16}{'seconds':>10}"] + [f"{s:<16}{v:>10.3f}" for s, v in rows]
    lines.append(f"{'sum of stages':<16}{total:>10.3f}")
    if "total_to_ready" in stages:
        lines.append(f"{'spawn to ready':<16}{stages['total_to_ready']:>10.3f}")
    return "\n".join(lines)
