"""The judge's executors (``engine.Engine`` inherits this side): the baseline executor, the pool of warm
candidate executors sized from the device's memory (``memory.py``), the one taken for a candidate or prepared
ahead of its load, those loading and compiling queued candidates ahead (``AHEAD``), the op-level checks' byte
budget, and the reference routing asked of the baseline executor. Nothing here runs candidate code: it starts,
sizes and hands out the processes that do.

``ExecutorSide`` reads what ``Engine`` sets up: ``config``, ``device``, ``points``, ``arena``, ``_init``,
``_dir``, ``baseline``, ``pool``, ``kernel_cache``, ``pool_size``, ``candidate``, ``_next``, ``_ahead``, ``ahead_max``,
``ahead_used``, ``warmed``, ``_rng``, ``ops_at``, ``op_params``, ``executor_bytes``,
``device_weights``, ``op_check_floor``, ``op_check_budget``, the reference (``ref``, ``model``,
``workloads``, ``moe_routes``, ``executor_routes``, ``dtype``).
"""

from __future__ import annotations

import os
import queue
import sys
from dataclasses import dataclass

import torch

from persistent_engine import candidate as cand_mod
from persistent_engine.measure import timing
from persistent_engine.verification import guards, verify
from persistent_engine.devices import free_gpu_bytes, gpu_bytes
from persistent_engine.executor.out_ring import ring_bytes_for
from persistent_engine.executor import wire
from persistent_engine.executor.compile_cache import op_set_key
from persistent_engine.executor.kernel_cache import source_key
from persistent_engine.executor.launch import (Executor, ExecutorDied, ExecutorPool, ExecutorStartFailed,
                                              ExecutorTimeout)
from persistent_engine.io_struct import Prepare, PrepareReply
from persistent_engine.judge import memory
from persistent_engine.judge.types import CandidateRaised, ExecutorCandidate

__all__ = ["POOL_SIZE", "AHEAD", "AHEAD_ENV", "PRECOMPILE", "EXECUTOR_START_S", "DEFAULT_CALL_S", "Ahead",
           "ExecutorSide", "Precompiling",
           "ahead_default", "elog", "split_pool"]

# warm candidate executors kept ready: one warms in ~8-9 s on the H200 box (imports ~5 s, CUDA context,
# weights, the first Triton compile ~2 s), a cycle should take < 1 s, so twelve warming at once on its 16
# cores (~1.3 per second) keep the judge from waiting;
# on CPU one (the CI machine has two cores). On CUDA fewer when memory is short (``memory.pool_plan``: each
# takes its KV caches, activations and context; the weights are mapped, device_share.py).
POOL_SIZE = {"cuda": 12, "cpu": 1}
# candidates waiting for the engine (``Prepare.sources``: told while they wait for the device, and again when
# the next one's turn comes) each get an executor of their own ahead, which loads the candidate and compiles
# its kernels (the executor's ``warm``) while the judge verifies and times another. On the H200 (llama-1b,
# 2026-12-04) verify was 5.9 s of a 6.3 s fast-tier evaluation, Triton compiling in the fresh executor, the
# device idle; a torch-only candidate verified in 0.14 s. At most this many at once, beside the pool (out of
# its memory room: ``split_pool``). They are paused (their whole tree, one killpg) while a point is timed, on
# CUDA as on CPU (issue 38): an ahead executor runs another candidate's code, which could otherwise load the
# host or the device exactly while a rival is timed; they compile during verification and between points.
# On CPU none by default (nothing compiles under TRITON_INTERPRET).
AHEAD = {"cuda": 4, "cpu": 0}
AHEAD_ENV = "TKCC_AHEAD"                 # overrides AHEAD (a count >= 0), e.g. to measure a run without them
# compiled mode: trusted compiles of queued candidates' op sets at once (executor/compile_cache.py), each a
# fresh pool executor for ~20-40 s (llama-1b 2-layer fast tier on the H100), paused like those compiling ahead
PRECOMPILE = {"cuda": 2, "cpu": 1}
EXECUTOR_START_S = 900.0
DEFAULT_CALL_S = 600.0


def elog(line: str) -> None:
    """One line on the engine's stderr (the supervisor keeps it and shows its tail on a crash)."""
    print(f"tkcc-engine[{os.getpid()}]: {line}", file=sys.stderr, flush=True)


def ahead_default(device_type: str) -> int:
    """``AHEAD`` of the device, or the count in ``TKCC_AHEAD`` (a value that is no count >= 0 is named on
    stderr and passed over)."""
    raw = os.environ.get(AHEAD_ENV, "").strip()
    if raw:
        if raw.isdigit():
            return int(raw)
        elog(f"{AHEAD_ENV}={raw!r} is not a count >= 0; using {AHEAD.get(device_type, 0)}")
    return AHEAD.get(device_type, 0)


def split_pool(room: int, ahead: int) -> tuple[int, int]:
    """(warm pool, executors compiling ahead) of ``room`` executors the device has room for: ``ahead`` at
    most half of it, the pool at least one."""
    ahead = max(0, min(ahead, room // 2))
    return max(1, room - ahead), ahead


@dataclass
class Precompiling:
    """A fresh executor compiling the step for an op set (``wire.Precompile``), its reply still to be read."""
    executor: Executor
    ops: tuple[str, ...]
    t0_ns: int


@dataclass
class Ahead:
    """An executor loading and compiling a queued candidate's source: its ``load`` and ``warm`` replies are
    still to be read (in that order) when the source's own load comes."""
    executor: Executor
    source: str


class ExecutorSide:
    """Starting, sizing and handing out the judge's executors (module doc)."""

    def _new_executor(self, role: str) -> Executor:
        capture = role == "baseline" and self.device.type == "cuda" and self.config.cuda_graph
        init = {**self._init, "capture": capture}
        if getattr(self, "batch", None):        # calibrated: the ring holds the largest sample, no more
            init["ring_bytes"] = ring_bytes_for(self.batch, [row[0] for row in self.ref])
        return Executor(init, self.arena, self._dir, role=role)

    def _start_baseline(self) -> None:
        """The baseline executor: the reference code only, in a process of the same kind as a candidate's
        (so both sides of an A/B pay the same overheads); replaced if it ever dies."""
        if self.baseline is not None:
            self.baseline.kill()
        ex = self._new_executor("baseline")
        ex.wait_ready(EXECUTOR_START_S)
        self.baseline = ex
        graphs = self.device.type == "cuda" and self.config.cuda_graph
        if graphs or self.compiled:
            r = ex.call(wire.Capture(points=list(range(len(self.points)))), DEFAULT_CALL_S)
            if isinstance(r, wire.Failed):
                raise ExecutorDied(f"the baseline executor's capture raised: {r.error}")
            uncompiled = {int(k): v for k, v in r.uncompiled.items() if k.isdigit()}
            if uncompiled:                      # every later executor runs these points eagerly too
                elog(f"compiled step: point(s) {sorted(uncompiled)} run eagerly on both sides: "
                     + "; ".join(f"{i}: {why}" for i, why in sorted(uncompiled.items())))
            self._init["eager_points"] = sorted(set(self._init.get("eager_points") or ()) | set(uncompiled))
        if graphs:
            self.base_graphed = set(r.graphed)
            self.graph_errors = {int(k): v for k, v in r.errors.items() if k.isdigit()}
        else:
            why = timing.graph_plan(self.points, self.device.type, self.config.cuda_graph)
            self.graph_errors = {i: w for i, w in enumerate(why) if w}

    def _pool(self) -> ExecutorPool:
        if self.pool is None:
            size = self.config.pool_size or POOL_SIZE.get(self.device.type, 1)
            ahead = self.config.ahead if self.config.ahead is not None else ahead_default(self.device.type)
            if self.device.type == "cuda" and not self.config.pool_size:
                # the baseline executor's measured footprint each, from what the other tier's weights and
                # the op checks leave (the other tier's engine and its pool use this GPU too); the executors
                # compiling ahead come out of the same room, at most half of it
                plan = self._pool_plan(size + ahead)
                elog(plan.line())
                self.prepare_ahead = plan.held_out >= memory.HELD_OUT
                size, ahead = split_pool(plan.size, ahead if self.prepare_ahead else 0)
            self.pool_size, self.ahead_max = size, max(0, ahead)
            self.pool = ExecutorPool(lambda: self._new_executor("candidate"), size, EXECUTOR_START_S,
                                     note=self._memory_note)
        return self.pool

    def _measured_overhead(self) -> int:
        """The warmed baseline executor's own overhead beyond its tensors (``memory.measured_overhead`` of
        its ``memory`` report; the constant where it cannot answer)."""
        if self.device.type != "cuda":
            return memory.EXECUTOR_OVERHEAD_BYTES
        try:
            report = self.baseline.call(wire.Memory(), DEFAULT_CALL_S)
        except (ExecutorDied, ExecutorTimeout) as e:
            elog(f"the baseline executor did not report its memory ({e}); counting "
                 f"{memory.EXECUTOR_OVERHEAD_BYTES / memory.GIB:.1f} GiB of overhead per executor")
            return memory.EXECUTOR_OVERHEAD_BYTES
        return memory.measured_overhead({"allocated": report.allocated, "peak_reserved": report.peak_reserved}
                                        if isinstance(report, wire.MemoryReply) else None)

    def _executor_each(self) -> int:
        return memory.executor_bytes(self.executor_bytes, self.arena.size,
                                     getattr(self, "executor_overhead", memory.EXECUTOR_OVERHEAD_BYTES))

    def _weights_to_come(self, free: int) -> int:
        """The co-tenants' weights not on the device yet (this process's own holdings: the allocator's
        reserve, the exported weights, its context, the baseline executor and the started candidate ones)."""
        started = (self.pool_size - self.pool.warming_count()) if self.pool is not None else 0
        started += (self.candidate is not None) + (self._next is not None) + len(self._ahead)   # taken from the pool
        own = (torch.cuda.memory_reserved(self.device) + (self.device_weights.nbytes if self.device_weights else 0)
               + memory.CONTEXT_BYTES + self.executor_bytes + started * self._executor_each())
        return memory.to_come(gpu_bytes(self.device) or 0, free, own, self.config.co_tenant_weights)

    def _pool_plan(self, wanted: int) -> memory.PoolPlan:
        """Warm executors from what is left once the co-tenants' weights have landed and the op-level
        checks' reserve is kept."""
        free = free_gpu_bytes(self.device)
        reserve = memory.op_check_reserve(self.op_check_floor)
        return memory.pool_plan(wanted, free, self._executor_each(), reserve, self._weights_to_come(free))

    def _memory_note(self) -> str:
        """What was free when an executor failed to start (for the reason the judge reports)."""
        return memory.describe_memory(free_gpu_bytes(self.device) if self.device.type == "cuda" else None,
                                      guards.host_bytes_available())

    def start_pool(self) -> None:
        """Start warming candidate executors now (else on the first candidate)."""
        self._pool()

    def _take(self) -> Executor:
        """The executor ``prepare`` set aside, else a warm one from the pool (waiting for it)."""
        ex, self._next = self._next, None
        if ex is not None and ex.alive():
            return ex
        if ex is not None:
            self._pool().discard(ex)
        t0 = timing.now_ns()
        try:
            ex = self._pool().take()
        except ExecutorStartFailed as e:        # not the candidate's doing: the pool started another at once
            elog(str(e))
            ex = self._pool().take()            # a second failure is the reply's reason
        self.pool_wait_s = (timing.now_ns() - t0) / 1e9
        return ex

    def prepare(self, req: Prepare | None) -> PrepareReply:
        """Executors that load and compile ``req.sources`` ahead, first come first, as the pool's ready ones
        allow (``_warm_ahead``); then, unless the next source (the first) has one, an executor set aside for
        its load (waiting for the pool). Ahead executors of sources no longer listed are discarded (their
        compiled kernels kept for the source: another engine of the tier may be judging it)."""
        self._pool()
        sources = [s for s in (getattr(req, "sources", None) or []) if isinstance(s, str) and s]
        self._drop_ahead(keep={source_key(s) for s in sources})
        if self.compiled:                       # the queued op sets' graphs compiled once, trusted
            self._precompile([ops for ops in map(self._op_set, sources) if ops is not None])
        if not self.prepare_ahead:              # memory short (memory.pool_plan): the load takes one itself
            return PrepareReply(message="no executor prepared ahead: device memory short", pool_wait_s=0.0)
        started = self._warm_ahead(sources)
        ready = "executor ready"
        if sources and source_key(sources[0]) in self._ahead:
            self.pool_wait_s, ready = 0.0, "the next source is loading ahead"
        elif self._next is None or not self._next.alive():
            self._next = None
            self._next = self._take()
        return PrepareReply(message=ready + (f"; {started} started compiling ahead" if started else ""),
                            pool_wait_s=self.pool_wait_s, ahead=len(self._ahead))

    def _call(self, req: wire.ExecutorRequest, deadline: float) -> wire.ExecutorReply:
        """One request to the candidate's executor, within ``deadline`` (its ``Failed`` replies raised)."""
        self._send(req, deadline)
        return self._receive(deadline, req.KIND)

    def _send(self, req: wire.ExecutorRequest, deadline: float) -> None:
        """``_call``'s first half: the request sent, the judge free to work until ``_receive``."""
        if deadline - timing.now_ns() / 1e9 <= 0:
            raise ExecutorTimeout(f"no answer during {req.KIND}")
        self.candidate.executor.send(req)

    def _receive(self, deadline: float, what: str) -> wire.ExecutorReply:
        left = deadline - timing.now_ns() / 1e9
        if left <= 0:
            raise ExecutorTimeout(f"no answer during {what}")
        reply = self.candidate.executor.receive(left, what)
        if isinstance(reply, wire.Failed):

            raise CandidateRaised(reply.error, reply.kind)
        return reply

    def _seed_kernels(self, source: str, ex: Executor) -> None:
        """The kernels an earlier executor compiled for this same source, copied into ``ex``'s Triton cache
        before it imports the source (executor/kernel_cache.py)."""
        try:
            n = self.kernel_cache.seed(source, ex.triton_dir, ex.own_triton_dir)
        except OSError as e:
            elog(f"kernel cache: not seeded ({e})")
            return
        if n:
            elog(f"kernel cache: {n} compiled kernel(s) of this source seeded")

    def _harvest_kernels(self, source: str, ex: Executor) -> None:
        """What the killed executor ``ex`` compiled, kept for the next executor of the same source."""
        if not source:
            return
        try:
            self.kernel_cache.harvest(source, ex.triton_dir)
        except OSError as e:
            elog(f"kernel cache: not kept ({e})")

    # ------------------------------------------------------------------------------ compiled graphs per op set
    def _op_set(self, source: str) -> tuple[str, ...] | None:
        """The ops a source's ``OVERRIDES`` literal names (what its compiled graphs depend on); None when they
        cannot be read statically (then it compiles on its own)."""
        parsed = cand_mod.CandidateSource.parse(source)
        if not parsed.parses or any(op not in self.op_params for op in parsed.overrides):
            return None
        return tuple(sorted(set(parsed.overrides)))

    def _seed_compiled(self, source: str, ex: Executor) -> None:
        """Compiled mode: the trusted graphs of the source's op set copied into ``ex``'s caches before it
        compiles (executor/compile_cache.py); else a trusted compile of that op set started for the next."""
        ops = self._op_set(source) if self.compiled else None
        if ops is None:
            return
        self._collect_precompiled()
        key = op_set_key(ops)
        try:
            workdir = ex.proc.workdir_view
            owner = os.stat(workdir).st_uid if os.geteuid() == 0 else None
            if self.compile_cache.seed(key, workdir, owner or None, own_workdir=ex.tmp):
                self.compiled_seeded += 1
                return
        except OSError as e:
            elog(f"compile cache: not seeded ({e})")
            return
        self._precompile([ops])

    def _precompile(self, op_sets: list[tuple[str, ...]], ahead: bool = False) -> None:
        """A trusted compile for each op set not kept, not compiling and not failed before: wanted now, started
        as ``PRECOMPILE`` allows (``_start_precompiles``; those that must wait start as others end). A
        candidate's op set goes before those compiled ``ahead`` of any candidate (``Engine.profile``)."""
        for ops in (op_sets if ahead else list(reversed(op_sets))):      # a block at the front, in order
            if ops in self._precompile_wanted:
                self._precompile_wanted.remove(ops)
            if ahead:
                self._precompile_wanted.append(ops)
            else:
                self._precompile_wanted.insert(0, ops)
        self._collect_precompiled()

    def _start_precompiles(self) -> None:
        """Start the wanted trusted compiles: each in an executor that never loads a candidate, a ready one
        of the pool, else (CPU) one started for it (on CUDA the pool's memory plan holds no extra one: it
        waits for a ready one)."""
        limit = PRECOMPILE.get(self.device.type, 1)
        while self._precompile_wanted and len(self._precompiling) < limit:
            ops = self._precompile_wanted[0]
            key = op_set_key(ops)
            if key in self._precompiling or key in self.precompile_failed or self.compile_cache.has(key):
                self._precompile_wanted.pop(0)
                continue
            try:
                if self.pool is not None and self.pool.ready_count() > 0:
                    ex = self.pool.take(timeout_s=0.001)
                elif self.device.type == "cpu":
                    ex = self._new_executor("precompile")
                else:
                    return
                ex.send(wire.Precompile(ops=list(ops), points=list(range(len(self.points)))))
            except (queue.Empty, ExecutorStartFailed, ExecutorDied) as e:
                elog(f"compile cache: no executor for op set {list(ops)} now ({e or 'none ready'})")
                return
            self._precompile_wanted.pop(0)
            self._precompiling[key] = Precompiling(ex, ops, timing.now_ns())

    def _collect_precompiled(self) -> None:
        """Keep the caches of each trusted compile that has replied (its executor killed first), then start
        the wanted ones there is room for."""
        for key, job in list(self._precompiling.items()):
            ex = job.executor
            try:
                if not ex.ready and ex.has_reply():         # one started for it: its start-up reply first
                    ex.wait_ready(5.0)
                if ex.alive() and (not ex.ready or not ex.has_reply()):
                    continue
                reply = ex.receive(5.0, "precompile")
            except (ExecutorDied, ExecutorTimeout) as e:
                reply = wire.Failed(error=str(e))
            del self._precompiling[key]
            ok = isinstance(reply, wire.Captured)
            ex.kill(keep_files=ok)
            if ok:
                try:
                    kept = self.compile_cache.keep(key, ex.proc.workdir_view, own_workdir=ex.tmp)
                except OSError as e:
                    kept = False
                    elog(f"compile cache: not kept ({e})")
                finally:
                    ex.remove_files()
                secs = (timing.now_ns() - job.t0_ns) / 1e9
                elog(f"compile cache: op set {list(job.ops) or '(none)'} compiled in {secs:.1f} s"
                     + ("" if kept else ", nothing to keep"))
            else:
                self.precompile_failed.add(key)
                elog(f"compile cache: op set {list(job.ops)} not compiled: {str(getattr(reply, 'error', ''))[:200]}")
        self._start_precompiles()

    def _kill_precompiling(self) -> None:
        for job in self._precompiling.values():
            job.executor.kill()
        self._precompiling.clear()
        self._precompile_wanted.clear()

    # ------------------------------------------------------------------------------ compiling ahead
    def _warm_ahead(self, sources: list[str]) -> int:
        """For each source without one (at most ``ahead_max`` at once): a ready executor of the pool
        (never waited for) loads it and compiles its kernels (``warm``), both sent now, read at its load.
        Sources the static checks refuse get none (their load refuses them without an executor). Returns
        how many started."""
        started = 0
        for source in sources:
            key = source_key(source)
            if len(self._ahead) >= self.ahead_max or self.pool.ready_count() < 1:
                break
            if key in self._ahead or cand_mod.static_check(source, self.op_params):
                continue
            try:
                ex = self.pool.take(timeout_s=0.001)
            except (queue.Empty, ExecutorStartFailed) as e:
                if isinstance(e, ExecutorStartFailed):
                    elog(str(e))
                break
            self._seed_kernels(source, ex)
            self._seed_compiled(source, ex)
            try:
                ex.send(wire.Load(source=source, name="candidate"))
                ex.send(wire.Warm(seed=self._rng.randrange(1, 2**31), budget=self._warm_budget(),
                                  ops_at=[sorted(at) for at in self.ops_at]))
            except ExecutorDied as e:
                elog(f"a pool executor died before loading a candidate ahead ({e.how}); discarded")
                self.pool.discard(ex)
                continue
            self._ahead[key] = Ahead(ex, source)
            started += 1
        return started

    def _warm_budget(self) -> int | None:
        """Bytes one warm-up's op cases may hold: the executors compiling ahead share one op-level check's
        budget (``_op_budget``), so that together with the check the judge runs meanwhile they stay within
        what is free. A fitted shape then may be smaller than verify's (more rarely a kernel compiled twice,
        never a wrong one)."""
        budget = self._op_budget()
        return None if budget is None else budget // max(1, self.ahead_max)

    def _drop_ahead(self, keep: set[str] = frozenset()) -> None:
        """Discard the ahead executors of sources not in ``keep`` (killed off the judge's cycle, what they
        compiled harvested for their source)."""
        for key in [k for k in self._ahead if k not in keep]:
            ahead = self._ahead.pop(key)
            self._discard(ahead.executor, ahead.source)

    def _discard(self, ex: Executor, source: str) -> None:
        """Kill ``ex`` (the tree on the pool's reaper thread) and keep what it compiled for ``source``."""
        if self.pool is not None:
            self.pool.discard(ex, then=lambda: self._harvest_kernels(source, ex))
        else:
            ex.kill()
            self._harvest_kernels(source, ex)

    def _loaded_ahead(self, source: str, name: str, deadline: float) -> dict | None:
        """The load reply of the executor that loaded ``source`` ahead, once its compiling is done, that
        executor made the candidate's; None when there is none or it is unusable: it died, or its load or
        warm-up raised (discarded; the load starts over in a fresh executor, so the verdict is the one a fresh
        executor gives). A hang is the candidate's: ``ExecutorTimeout`` with the executor loaded as the
        candidate's, which the request's handler kills."""

        ahead = self._ahead.pop(source_key(source), None)
        if ahead is None:
            return None
        ex = ahead.executor
        self.candidate = ExecutorCandidate(name, ex, [], {}, "", source)
        warmed: wire.ExecutorReply = wire.Warmed()
        try:
            loaded = ex.receive(deadline - timing.now_ns() / 1e9, "load")
            if not isinstance(loaded, wire.Failed):
                warmed = ex.receive(deadline - timing.now_ns() / 1e9, "warm-up")
        except ExecutorDied as e:               # ExecutorBroke too: a fresh executor judges it
            elog(f"an executor loading a candidate ahead died ({e.how}); loading it afresh")
            loaded = wire.Failed(error=e.how)
        if isinstance(loaded, wire.Failed) or isinstance(warmed, wire.Failed):
            self.candidate = None
            failed = loaded if isinstance(loaded, wire.Failed) else warmed
            elog(f"a candidate's ahead load or warm-up failed ({failed.error[:200]}); loading it afresh")
            self._discard(ex, source)
            return None
        self.warmed = warmed
        self.ahead_used += 1
        return loaded

    def reference_routes(self, i: int, v: int, deadline: float) -> list | None:
        """The reference's MoE routing at point i, variant v, as the baseline EXECUTOR computes it: a
        process of the kind a candidate runs in (same environment, same mapped weights, same workloads), so
        for a candidate that overrides nothing upstream of a router that router sees the same logits bit
        for bit. This process's own re-run can round differently (another cuBLAS algorithm, another
        environment): on the H200 a GLM-5.2 fused-MoE candidate, which changes nothing above its one router,
        had a first-layer flip of 0.0583 x the logit RMS. Taken only when the executor's logits match the
        start-up reference as ``ReferenceRoutes`` asks of its re-run; else (or when it cannot answer) this
        process's routing. Recorded on first use."""
        from persistent_engine.executor.routes import calls_from_wire

        key = (i, v)
        if key in self.executor_routes:
            return self.executor_routes[key]
        routes = None
        left = deadline - timing.now_ns() / 1e9
        if self.baseline is not None and left > 0:
            try:
                reply = self.baseline.call(wire.Steps(steps=[wire.StepAsk(i=i, v=v, moe=True)]), left)
                r = reply.results[0] if isinstance(reply, wire.StepResults) and reply.results else wire.StepResult()
            except (ExecutorDied, ExecutorTimeout):
                r = wire.StepResult()
            calls = calls_from_wire(r.routes.calls if r.routes is not None else None, self.device)
            out = r.logits
            if (calls and all(c is not None for c in calls) and isinstance(out, torch.Tensor)
                    and verify.compare_logits(out.to(self.device), self.ref[i][v], self.dtype, "",
                                              verify.LOGIT_RTOL.get(self.dtype, 5e-2) / 50) is None):
                routes = calls
        if routes is None:
            routes = self.moe_routes.get(key, self.model, self.workloads[i][v], self.ref[i][v], self.dtype)
        self.executor_routes[key] = routes
        return routes

    def _op_budget(self) -> int | None:
        """Bytes one op-level check may hold (``memory.op_check_budget``): a quarter of the GPU, and at most
        half of what is free once the pool's warming executors and the co-tenants' weights still to come
        have landed. A GLM-5.2 run's fast and slow tiers hold ~71 GB of weights on a 150 GB H200; half of
        the free memory alone (~65 GB when a check began) let moe_experts' check keep 27 real-size experts,
        whose bf16 w13 (1.27 GiB) then found 199 MiB free. The check runs on fewer experts (``OpDef.fit``);
        the layer level still runs the model's own shapes."""
        if self.op_check_budget is None:
            return None
        free = free_gpu_bytes(self.device)
        warming = self.pool.warming_count() * self._executor_each() if self.pool is not None else 0
        return memory.op_check_budget(self.op_check_budget, free, warming + self._weights_to_come(free))
