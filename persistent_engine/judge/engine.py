"""The judge: one model slice and its workload points, built once, judging candidates run by executors.

Start-up (stages timed for the log): weights (``build_model``), KV cache (``make_workload`` for every
point and input variant), warm-up (baseline logits kept as the verification reference, which ops each
point calls), calibration (the layer-level logits bound of each point and variant, ``tolerance.py``),
graph_capture (the sealed arena of weights and workloads shared with executors, the baseline executor
started: it runs only the reference code, CUDA graphs of every point captured there, and its step
times measured; the pool of warm candidate executors starts warming on the first candidate).

This process never imports or runs candidate code. A candidate's life: ``load`` (static checks here;
then a fresh warm executor from the pool imports it) -> ``verify`` (op level: the executor runs each
override on inputs it draws from the op's generator with the seed the judge chose, the judge draws
the same inputs, computes the reference and compares; layer level: the executor runs the slice with
the overrides on the judge's workloads, the judge compares the logits with its reference under the
calibrated bound, MoE routing replayed from the judge's record) -> ``bench`` (``ab.py``: baseline
and candidate executors timed from here, A/B in a random order, k chained runs per sample so the request's
fixed cost is amortised, the side not timed SIGSTOPped, fresh token ids per run, random timed runs
re-checked against the judge's own reference) -> ``unload``
(the executor killed with its whole process group: nothing of it survives; the arena's seals and
bytes and the judge's own weights and workloads checked unchanged).

CONFIG: ``cuda_graph`` and ``cuda_graph_batch_sizes`` pick which affected points are graphed on the
candidate's side; ``kv_block_size`` re-lays the candidate executor's KV caches (same content, new
paging); ``max_num_seqs`` and ``max_num_batched_tokens`` are scheduler knobs no single step shows
(``CONFIG_NOTES``).
"""

from __future__ import annotations

import contextlib
import faulthandler
import inspect
import os
import random
import sys

import torch

from persistent_engine import candidate as cand_mod
from persistent_engine import scratch
from persistent_engine.inputs import tier_inputs
from persistent_engine.measure import timing
from persistent_engine.verification import guards, interpreter, tolerance, verify
from persistent_engine.devices import free_gpu_bytes, gpu_bytes, warm_triton
from persistent_engine.executor.channel import Arena, mailbox_bytes
from persistent_engine.executor.compiled_step import baseline_words, compiled_default
from persistent_engine.executor.device_share import DeviceWeights
from persistent_engine.executor.out_ring import ring_bytes, ring_bytes_for
from persistent_engine.executor.compile_cache import CompileCache, ahead_op_sets, op_sets_by_time
from persistent_engine.executor.kernel_cache import KERNEL_CACHE_ENV, KernelCache
from persistent_engine.executor import wire
from persistent_engine.executor.launch import (Executor, ExecutorBroke, ExecutorDied, ExecutorPool, ExecutorTimeout,
                                              sandbox_summary)
from persistent_engine.judge import ab
from persistent_engine.judge import checks as judging
from persistent_engine.judge import memory
from persistent_engine.judge.executors import (AHEAD, DEFAULT_CALL_S, EXECUTOR_START_S,  # noqa: F401 (public face)
                                              POOL_SIZE, ExecutorSide, elog)
from persistent_engine.judge.checks import default_points, weight_share
from persistent_engine.judge.types import (ARENA_CHUNKS_PER_CHECK, CONFIG_NOTES, DEFAULT_PEAK_BANDWIDTH_GBS, DTYPES,
                                          PAUSE_POOL_IF_READY, CandidateRaised, EngineConfig, ExecutorCandidate)
from persistent_engine.io_struct import (Bench, BenchReply, ErrorReply, LoadCandidate, LoadReply, Prepare, Profile,
                                         ProfileReply, Reply, Request, Status, StatusReply, Unload,
                                         UnloadReply, Verify, VerifyReply, PointProfile, PointTiming)

class Engine(ExecutorSide):
    def __init__(self, config: EngineConfig, log=lambda stage, seconds: None):
        """Builds the judge's slice and starts its baseline executor, stage by stage (each stage's seconds
        go to ``self.startup`` and ``log``; see the module docstring)."""
        self.config = config
        self.startup: dict[str, float] = {}
        self._log_stage = log
        self._setup()
        with self._stage("weights"):
            self._build_model()
        with self._stage("kv_cache"):
            self.workloads, self.routing = self.inputs.build(self.model, self.points, config.variants, config.seed)
        with self._stage("warmup"):
            self._warm_up()
        with self._stage("calibration"):
            self._calibrate()
        with self._stage("graph_capture"):
            weights = self._share_and_start_baseline()
        self._arm_guards(weights)
        self._reset_counters()
        self._release_cached()

    @contextlib.contextmanager
    def _stage(self, name: str):
        """Times one start-up stage (device work synchronised before the clock stops)."""
        t0 = timing.now_ns()
        yield
        self._sync()
        self.startup[name] = (timing.now_ns() - t0) / 1e9
        self._log_stage(name, self.startup[name])

    def _setup(self) -> None:
        """The process (fault handler, torch threads), the model spec, layers and points, the judge's own
        randomness and private directory, the reference signatures (the static checks read them)."""
        from persistent_engine.models.spec import ModelSpec
        from persistent_engine.ops import registry

        config = self.config
        self.registry = registry
        if not faulthandler.is_enabled():       # a segfault or abort leaves its stack on stderr
            faulthandler.enable(file=sys.stderr)
        self.device = torch.device(config.device)
        self.dtype = DTYPES[config.dtype]
        self.spec = ModelSpec.from_name(config.model)
        self.layers = list(config.layers) if config.layers is not None else list(range(self.spec.num_layers))
        self.points = list(config.points or default_points(config.device))
        self.compiled = compiled_default(self.device.type) if config.compiled is None else bool(config.compiled)
        self._rng = random.Random(int.from_bytes(os.urandom(8), "little"))   # seeds, orders: unknown to executors
        scratch.remove_stale("judge")          # those of judges that died (their lock is free)
        self._dir = scratch.owned_dir("judge")  # executors' workdirs and stderr files: removed at close
        # compiled kernels per candidate source: the run's (shared by its engines) or this judge's own
        self.kernel_cache = KernelCache(os.environ.get(KERNEL_CACHE_ENV) or os.path.join(self._dir, "kernels"))
        # compiled mode: step graphs per op set, compiled by executors no candidate ran in (compile_cache.py)
        self.compile_cache = CompileCache(os.path.join(self._dir, "compiled"))
        self._precompiling: dict = {}           # op-set key -> ``Precompiling``
        self._precompile_wanted: list[tuple[str, ...]] = []     # op sets to compile, first come first
        self.precompile_failed: set[str] = set()
        self.compiled_seeded = 0                # candidates' executors given a trusted compile
        self.op_params = {n: cand_mod.param_names(inspect.signature(registry.get(n).reference))
                          for n in registry.names()}
        self.threads = int(os.environ.get("TKCC_ENGINE_THREADS", "1"))
        if self.device.type == "cpu":           # one thread: steadier timings, no oversubscription
            torch.set_num_threads(self.threads)

    def _build_model(self) -> None:
        """The slice's weights (seeded, or the checkpoint of the tier's inputs)."""
        from persistent_engine.models.decoder import build_model

        torch.manual_seed(self.config.seed)
        self.inputs = tier_inputs.TierInputs.from_dict(self.config.inputs)       # a checkpoint, tokens, routing
        self.model = build_model(self.spec, layers=self.layers, device=self.device, dtype=self.dtype,
                                 seed=self.config.seed, weights=self.inputs.weights)
        torch.set_grad_enabled(False)

    def _warm_up(self) -> None:
        """First steps (kernels warm, new-token KV slots written); the reference logits of every point and
        variant kept; which ops each point calls."""
        from persistent_engine.measure import profiler

        for ws in self.workloads:
            for w in ws:
                self.model.step(w)
        self.ref = [[self.model.step(w).clone() for w in ws] for ws in self.workloads]
        self.ops_at = [set(profiler.op_calls(self.model, ws[0])) for ws in self.workloads]
        warm_triton(self.device)

    def _calibrate(self) -> None:
        """The layer-level logits bound per point and variant: the slice's own rounding noise (tolerance.py)."""
        self.moe_routes = verify.ReferenceRoutes(self.registry)   # the reference's routing, recorded on first use
        self.executor_routes: dict = {}         # (point, variant) -> the baseline executor's routing (or ours)
        self.logit_noise = tolerance.calibrate(self.registry, self.model, self.workloads, self.ref, self.moe_routes,
                                               self.ops_at, self.device, self.dtype, self.config.seed)
        self.logit_tol = [[tolerance.tolerance(self.dtype, n) for n in row] for row in self.logit_noise]

    def _share_and_start_baseline(self) -> dict:
        """The sealed arena of weights and workloads shared with executors, the baseline executor started
        (its CUDA graphs captured) and each point's baseline step measured; returns the model's weights."""
        from persistent_engine.models.spec import config_of_path

        config = self.config
        weights = guards.model_weights(self.model)
        self.device_weights = None                # on CUDA: one copy of the weights, mapped by every executor
        if self.device.type == "cuda":
            self.device_weights = DeviceWeights.export({k: t for k, t in weights.items() if k != "cos_sin"},
                                                     self.device)
        shared = {} if self.device_weights else {f"weight.{k}": t for k, t in weights.items()}
        shared.update(self._workload_tensors())
        self.arena = Arena.build(shared)        # sealed: no process can write it from here on
        self.arena_checksums = self.arena.checksums()
        self._arena_window = 0
        out_bytes = max(r.numel() * r.element_size() for row in self.ref for r in row)
        self._init = {"model": config.model, "model_config": config_of_path(config.model),  # executors' cwd differs
                      "layers": self.layers, "device": config.device,
                      "dtype": str(self.dtype).removeprefix("torch."), "points": [p.to_dict() for p in self.points],
                      "variants": config.variants, "seed": config.seed, "threads": self.threads,
                      "weights": self.device_weights.spec if self.device_weights else None,
                      "mailbox_bytes": mailbox_bytes(self.device.type, out_bytes),
                      "ring_bytes": ring_bytes(self.device.type, out_bytes), "compiled": self.compiled}
        self.pool: ExecutorPool | None = None   # started on the first candidate
        self.baseline: Executor | None = None
        self.graph_errors: dict[int, str] = {}
        self.base_graphed: set[int] = set()
        free_before = free_gpu_bytes(self.device)
        self._start_baseline()
        # what one executor takes on the device (its KV caches, activations, context): sizes the pool
        self.executor_bytes = max(free_before - free_gpu_bytes(self.device), 0) if free_before else 0
        # per point: the baseline's step as bench times it (request wall time / k) and k, the runs per sample
        cal = [ab.calibrate(self.baseline, i, self.device.type, self.ref[i][0]) for i in range(len(self.points))]
        self.base_ms, self.batch = [ms for ms, _ in cal], [k for _, k in cal]
        if self.device.type == "cuda":          # later executors' rings hold the calibrated samples only
            ring = ring_bytes_for(self.batch, [row[0] for row in self.ref])
            self.executor_bytes = max(self.executor_bytes - self.baseline.out.nbytes + ring, 0)
        self.executor_overhead = self._measured_overhead()
        return weights

    def _workload_tensors(self) -> dict[str, torch.Tensor]:
        """Every tensor of every point's workloads, by arena name (``point<i>.v<variant>.<name>``)."""
        return {f"point{i}.v{v}.{k}": t for i, ws in enumerate(self.workloads) for v, w in enumerate(ws)
                for k, t in guards.tensors_of(w).items()}

    def _arm_guards(self, weights: dict) -> None:
        """What the judge checks after every candidate: its weights and workloads unchanged, the op-level
        memory budget, the roofline floor of each point's step."""
        total = gpu_bytes(self.device)
        self.op_check_budget = total // 4 if total else None
        self.op_check_floor = verify.op_check_floor_bytes(sorted(set().union(*self.ops_at)), self.spec, self.points)
        self.weight_guard = guards.TensorGuard(weights, device_budget=total // 10 if total else None)
        self.workload_guard = guards.TensorGuard(self._workload_tensors())
        self.peak_bandwidth_gbs = (self.config.peak_bandwidth_gbs if self.config.peak_bandwidth_gbs is not None
                                   else DEFAULT_PEAK_BANDWIDTH_GBS.get(self.device.type))
        self.floor_ms = [guards.min_step_bytes(weights, ws[0], self.spec) / (self.peak_bandwidth_gbs * 1e9) * 1e3
                         if self.peak_bandwidth_gbs else 0.0 for ws in self.workloads]

    def _reset_counters(self) -> None:
        """No candidate loaded yet; the served / executor counters at zero."""
        self.candidate: ExecutorCandidate | None = None
        self.cand_workloads = None              # kept for callers: re-laid caches live in the executor only
        self.tie_kept_rows: dict = {}           # (point, variant) -> rows the MoE tie check kept
        self.served = 0
        self.poisoned = False                   # the judge itself is broken: exit after replying
        self.poison_cause = ""
        self.executors_used = 0
        self.pool_size = 0
        self.pool_wait_s = 0.0
        self._next: Executor | None = None      # set aside by ``prepare`` for the next load
        self.prepare_ahead = True               # False when memory is short (``memory.pool_plan``)
        self._ahead: dict = {}                  # sha256 of a queued source -> ``Ahead`` (compiling it)
        self.ahead_max = 0                      # set with the pool
        self.ahead_used = 0                     # candidates loaded from an executor that compiled them ahead
        self.warmed = wire.Warmed()             # the last such executor's warm-up counts

    def close(self) -> None:
        self._drop_candidate()
        self._kill_precompiling()
        for ahead in self._ahead.values():
            ahead.executor.kill()
        self._ahead.clear()
        if self._next is not None:
            self._next.kill()
        if self.pool is not None:
            self.pool.close()
        if self.baseline is not None:
            self.baseline.kill()
        scratch.release(self._dir)

    # ------------------------------------------------------------------------------ helpers
    def _sync(self) -> None:
        if self.device.type == "cuda":
            timing._synchronize(self.device)

    def _release_cached(self) -> None:
        """Hand the caching allocator's free blocks back to the device (after start-up and after each
        candidate): the two tiers' engines share one GPU."""
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def _poison(self, cause: str) -> None:
        """This process is done after the current reply (the supervisor starts a fresh one)."""
        if not self.poisoned:
            elog(f"leaving after this reply: {cause}")
        self.poisoned = True
        self.poison_cause = self.poison_cause or cause

    def _guard_reasons(self, phase: str) -> list[str]:
        """The judge's own state after a candidate: the arena's seals and a rotating window of its bytes, the
        judge's weights and workloads. No candidate code runs here, so any finding is a breach: named, and
        this process replaced."""
        reasons = []
        if not self.arena.sealed():
            reasons.append(f"{phase}: the shared arena lost its seals")
        n = len(self.arena_checksums)
        window = [(self._arena_window + j) % n for j in range(min(n, ARENA_CHUNKS_PER_CHECK))] if n else []
        self._arena_window = (self._arena_window + len(window)) % max(n, 1)
        bad_chunks = [j for j in window if self.arena.chunk_checksum(j) != self.arena_checksums[j]]
        if bad_chunks:
            reasons.append(f"{phase}: the shared weights / KV cache changed (arena chunks {bad_chunks[:5]})")
        self._sync()
        bad = self.weight_guard.changed()
        if bad:
            reasons.append(f"{phase}: candidate changed the weights: {', '.join(bad[:5])}"
                           + (f" (+{len(bad) - 5} more)" if len(bad) > 5 else ""))
            if self.weight_guard.restorable:
                self.weight_guard.restore(bad)
            else:
                self._poison("the weights changed and no copy was kept to restore them")
        self.workload_guard.restore()           # KV slots the judge's reference steps wrote are put back
        if reasons:
            self._poison(reasons[0])
        return reasons

    def _affected(self) -> list[int]:
        """Points whose step the candidate changes: an overridden op runs there, or (kv_block_size)
        every point, whose KV cache it re-lays."""
        if self.candidate is None:
            return []
        if self.candidate.config.get("kv_block_size") is not None:
            return list(range(len(self.points)))
        ops = set(self.candidate.ops)
        return [i for i, at in enumerate(self.ops_at) if at & ops]

    def _config_notes(self) -> dict[str, str]:
        return {k: CONFIG_NOTES[k] for k in (self.candidate.config if self.candidate else {}) if k in CONFIG_NOTES}

    def _deadline(self, req) -> float:
        t = getattr(req, "timeout_s", 0.0) or DEFAULT_CALL_S
        return timing.now_ns() / 1e9 + t

    def _drop_candidate(self) -> None:
        self.tie_kept_rows = {}
        if self.candidate is not None:
            ex, source = self.candidate.executor, self.candidate.source
            self.candidate = None
            self._discard(ex, source)

    # ------------------------------------------------------------------------------ requests
    def handle(self, req: Request) -> Reply:
        handlers = {LoadCandidate: self.load, Prepare: self.prepare, Verify: self.verify, Bench: self.bench,
                    Unload: self.unload, Profile: self.profile, Status: self.status}
        phase = {LoadCandidate: "load", Verify: "verify", Bench: "bench"}.get(type(req), type(req).__name__)
        try:
            reply = handlers[type(req)](req)
        except ExecutorTimeout:
            limit = getattr(req, "timeout_s", 0.0) or DEFAULT_CALL_S
            elog(f"candidate executor killed: no answer during {phase} within {limit:g} s")
            self._drop_candidate()
            reply = ErrorReply(message=f"no answer during {phase} within the {limit:g} s timeout (watchdog killed "
                                       "the executor)", kind="hang")
        except ExecutorBroke as e:              # its reply broke the protocol: the candidate's doing
            elog(f"candidate executor discarded: it {e.how}")
            self._drop_candidate()
            self._ensure_baseline()
            reply = ErrorReply(message=f"the executor {e.how} (executor discarded)", kind="protocol")
        except ExecutorDied as e:
            if self.baseline is not None and not self.baseline.alive():     # not the candidate's doing
                elog(f"baseline executor died during {phase}: {e}; restarting it")
                self._drop_candidate()
                self._start_baseline()
                return ErrorReply(message=f"the baseline executor died during {phase} ({e}); restarted",
                                  kind="internal")
            elog(f"candidate executor died during {phase}: {e}")
            self._drop_candidate()
            self._ensure_baseline()
            reply = ErrorReply(message=f"executor died during {phase} ({e.how})"
                                       + (f"; its stderr ended: {e.tail}" if e.tail else ""), kind="crash")
        except CandidateRaised as e:
            if e.kind == "device":              # its CUDA context is gone: so is the executor
                self._drop_candidate()
                reply = ErrorReply(message=f"device error (executor discarded): {e.text[:500]}", kind="device")
            elif e.kind == "oom":
                reply = ErrorReply(message=e.text[:300], kind="oom")
            else:
                reply = ErrorReply(message=f"candidate raised {e.text[:1000]}", kind="candidate")
        except torch.OutOfMemoryError as e:
            elog(f"{type(req).__name__}: out of memory: {str(e)[:300]}")
            self._release_cached()
            return ErrorReply(message=f"out of memory: {str(e)[:300]}", kind="oom")
        self.served += 1
        return reply

    def _ensure_baseline(self) -> None:
        if self.baseline is None or not self.baseline.alive():
            self._start_baseline()

    def load(self, req: LoadCandidate) -> LoadReply:
        t0 = timing.now_ns()
        if self.candidate is not None:
            self.unload(Unload())
        reasons = cand_mod.static_check(req.source, self.op_params)
        ahead = False
        if not reasons:
            deadline = self._deadline(req)
            r = self._loaded_ahead(req.source, req.name, deadline)      # compiled while it was queued
            ahead = r is not None
            if r is None:
                fresh = self._take()
                self._seed_kernels(req.source, fresh)
                self._seed_compiled(req.source, fresh)
                self.candidate = ExecutorCandidate(req.name, fresh, [], {}, "", req.source)
                r = self._call(wire.Load(source=req.source, name=req.name), deadline)
            ex = self.candidate.executor             # the ahead one or the fresh one
            self.executors_used += 1
            reasons = list(r.reasons) or judging.declared_ops_reasons(req.source, r.ops)
            if reasons:
                self._drop_candidate()
            else:
                self.candidate = ExecutorCandidate(req.name, ex, [o for o in r.ops if o in self.op_params],
                                                   dict(r.config), r.description, req.source)
        secs = (timing.now_ns() - t0) / 1e9
        confined = _applied(self.candidate.executor if self.candidate else None)
        if reasons:
            return LoadReply(ok=False, message="candidate refused", reasons=reasons, seconds=secs, sandbox=confined,
                             ahead=ahead)
        c = self.candidate
        notes = "; ".join(f"{k}: {v}" for k, v in self._config_notes().items())
        w = self.warmed
        return LoadReply(ok=True, message=f"loaded {c.name}"
                         + (f" (compiled ahead: {w.cases} op case(s), {w.steps} step(s), {w.failed} failed, "
                            f"{w.skipped} over its memory share)" if ahead else "")
                         + (f" (CONFIG {notes})" if notes else ""),
                         ops=sorted(c.ops), config=c.config, description=c.description[:2000], seconds=secs,
                         sandbox=confined, ahead=ahead)

    def _need_candidate(self) -> ErrorReply | None:
        if self.candidate is None:
            return ErrorReply(message="no candidate loaded", kind="no_candidate")
        return None

    def verify(self, req: Verify) -> Reply:
        if (err := self._need_candidate()) is not None:
            return err
        t0 = timing.now_ns()
        deadline = self._deadline(req)
        seed = req.seed if req.seed is not None else self._rng.randrange(1, 2**31)
        c = self.candidate
        budget = self._op_budget()
        interpreted = interpreter.runs_interpreted(c.source, self.device.type)     # the judge's copy of it
        checks = verify.op_level(sorted(c.ops), c.overrides, self.spec, self.points, self.device, self.dtype,
                                 seed, budget=budget, interpreted=interpreted,
                                 check=judging.remote_check(self, deadline, memory.references_ahead(budget)))
        reasons = [ch.detail for ch in checks if not ch.passed]
        notes = [ch.detail for ch in checks if ch.passed and ch.detail]     # the interpreter's 16-bit NaN excused
        reasons += self._call(wire.Guards(when="op-level verification"), deadline).reasons
        if not reasons:
            layer_reasons = judging.layer_level(self, deadline, interpreted_nan=bool(notes))
            checks.append(verify.Check("layer", not layer_reasons[0],
                                       "; ".join(layer_reasons[0])[:2000] or layer_reasons[1]))
            reasons += layer_reasons[0]
            if layer_reasons[1].startswith(interpreter.LAYER_NOTE[:40]):     # its bf16 logits not compared
                notes.append(layer_reasons[1].split("; ")[0])
            reasons += self._call(wire.Guards(when="layer-level verification"), deadline).reasons
        reasons += self._process_reasons("verification")
        message = "rejected" if reasons else "; ".join(["correct", *notes])
        return VerifyReply(ok=not reasons, message=message, reasons=reasons,
                           checks=checks, seed=seed,
                           seconds=(timing.now_ns() - t0) / 1e9)

    def bench(self, req: Bench) -> Reply:
        if (err := self._need_candidate()) is not None:
            return err
        t0 = timing.now_ns()
        deadline = self._deadline(req)
        c = self.candidate
        self._ensure_baseline()
        samples = req.samples or timing.DEFAULT_SAMPLES[self.device.type]
        affected = set(self._affected())
        plan = timing.graph_plan(self.points, self.device.type, c.config.get("cuda_graph", True),
                                 c.config.get("cuda_graph_batch_sizes"))
        todo = [i for i in sorted(affected) if i in self.base_graphed and plan[i] is None]
        cand_graphed, cand_errors, reasons = set(), {}, []
        if todo:                                  # compiled mode: the capture compiles the points first
            r = self._call(wire.Capture(points=todo), deadline)
            cand_graphed = set(r.graphed) & set(todo)
            cand_errors = {int(k): v for k, v in r.errors.items() if k.isdigit()}
            if self.compiled:
                eager = set(self._init.get("eager_points") or ())        # every executor's, the baseline's too
                reasons += judging.uncompiled_reasons(self.points, r.uncompiled, [i for i in todo if i not in eager])
        per_point, kept = [], []
        notes = self._config_notes()
        for i, p in enumerate(self.points):
            if i not in affected:
                per_point.append(PointTiming(p, p.label(), affected=False,
                                             baseline_ms=self.base_ms[i], candidate_ms=self.base_ms[i], speedup=1.0))
                continue
            graphed = i in cand_graphed
            k = self.batch[i]
            n = samples if req.samples else timing.samples_for(self.device.type, self.base_ms[i] * k, samples,
                                                               weight_share(self.points, i))
            # routing / indexer points: the variants' own ids, whose near-tie rows the spot re-check leaves out
            fresh = None if verify.decides(self.ops_at[i]) else self._fresh_ids(i)
            need = PAUSE_POOL_IF_READY.get(self.device.type)
            paused = (self.pool.pause() if self.pool is not None and need is not None
                      and self.pool.ready_count() >= need else [])
            if self._ahead or self._precompiling:   # executors compiling ahead: stopped, whatever the device
                compiling = [a.executor for a in self._ahead.values()] + [
                    j.executor for j in self._precompiling.values()]
                for ex in compiling:
                    ex.stop()
                paused += compiling
            try:
                res = ab.ab_remote(self.baseline, c.executor, i, len(self.workloads[i]), n, k, graphed, fresh,
                                   self._rng, deadline, self.ref[i][0], warmup=req.warmup or (2 if graphed else 1),
                                   stop_rel_se=None if req.samples else timing.STOP_REL_SE.get(self.device.type),
                                   futility_margin=None if req.samples else timing.FUTILITY_MARGIN,
                                   vocab=self.spec.vocab_size)
            finally:
                ExecutorPool.resume(paused)
            kept.append((i, p, res.kept))
            r = guards.implausibly_fast(p.label(), res.candidate.median_ms, self.floor_ms[i])
            if r:
                reasons.append(r + (f" ({self.peak_bandwidth_gbs:g} GB/s ceiling)" if self.peak_bandwidth_gbs else ""))
            per_point.append(PointTiming(
                p, p.label(), affected=True, graph=graphed,
                graph_error=None if graphed else (cand_errors.get(i) or self.graph_errors.get(i) or plan[i]),
                baseline_ms=res.baseline.median_ms, baseline_iqr_ms=res.baseline.iqr_ms,
                candidate_ms=res.candidate.median_ms, candidate_iqr_ms=res.candidate.iqr_ms,
                samples=res.candidate.n, runs_per_sample=k, floor_ms=self.floor_ms[i],
                speedup=res.speedup, speedup_q1=res.speedup_q1, config=notes or {}, stopped=res.stopped))
        reasons += judging.spot_checks(self, kept)
        reasons += self._call(wire.Guards(when="timing"), deadline).reasons
        reasons += self._process_reasons("timing")
        # a point's weight is its share of GPU time: new / old time = sum(w / point speedup) / sum(w)
        wsum = sum(pp.point.weight for pp in per_point)
        rsum = sum(pp.point.weight / pp.speedup for pp in per_point if pp.speedup > 0)
        speedup = wsum / rsum if rsum > 0 else None
        message = "timed" if not reasons else "rejected while timed"
        if notes:
            message += "; CONFIG " + "; ".join(f"{k}: {v}" for k, v in notes.items())
        return BenchReply(ok=not reasons, message=message, reasons=reasons, per_point=per_point,
                          speedup=speedup, timer=ab.TIMER, samples=samples, seconds=(timing.now_ns() - t0) / 1e9,
                          baseline=baseline_words(self.compiled))

    def _process_reasons(self, phase: str) -> list[str]:
        """Processes the candidate started in its sandbox (a kernel never forks): named, and the executor is
        killed with all of them at unload."""
        extra = self.candidate.executor.extra_processes() if self.candidate else []
        return [f"{phase}: candidate left {len(extra)} process(es) running in its executor"] if extra else []

    def _fresh_ids(self, i: int):
        """``fresh(k) -> [k, T]`` token ids drawn here for k timed runs of point i (no executor can predict
        them, so no output can be cached across runs; ``ab`` chains them so no two runs can be batched)."""
        gen = torch.Generator().manual_seed(self._rng.randrange(2**62))
        t = self.workloads[i][0].token_ids.numel()
        return lambda k: torch.randint(0, self.spec.vocab_size, (k, t), generator=gen)

    def unload(self, req: Unload) -> UnloadReply:
        restored = []
        if self.candidate is not None:
            restored.append(f"candidate {self.candidate.name}")
            self._drop_candidate()              # the executor and its process group: killed
        bad = self._guard_reasons("unload")
        restored += bad
        self._ensure_baseline()
        self._release_cached()
        return UnloadReply(message="unloaded", restored=restored, reasons=bad)

    def profile(self, req: Profile) -> ProfileReply:
        from persistent_engine.measure import profiler

        per_point = []
        for i, p in enumerate(self.points):
            ops = profiler.profile_point(self.model, self.workloads[i][0], self.device)
            self.workload_guard.restore()
            replay = self._replay_profile(i, ops) if self.device.type == "cuda" else {}
            per_point.append(PointProfile(p, p.label(), step_ms=self.base_ms[i], **replay) if replay else
                             PointProfile(p, p.label(), step_ms=self.base_ms[i],
                                          total_ms=sum(o["ms"] for o in ops.values()), ops=ops))
        if self.compiled:                       # the likeliest op sets' graphs, compiled while the baseline's A/A runs
            self._precompile(op_sets_by_time([pp.ops for pp in per_point], self.op_params,
                                             ahead_op_sets(self.device.type)), ahead=True)
        replayed = all(pp.timed == "cuda_graph" for pp in per_point)
        return ProfileReply(message="baseline profile", per_point=per_point,
                            timer="cuda graph replays, kernels per op" if replayed and per_point
                            else timing.make_timer(self.device).name + "+sync per op")

    def _replay_profile(self, i: int, sync_ops: dict) -> dict:
        """PointProfile fields of point ``i`` with the ops timed by graph replays' kernels
        (``step_profile``), or ``replay_note`` saying why the sync-timed ``sync_ops`` stay."""
        from persistent_engine.measure import step_profile

        try:
            replay = step_profile.replay_profile(self.model, self.workloads[i][0], self.device)
        except Exception as e:  # noqa: BLE001 - the sync profile still ranks the ops
            if not timing.recover_after_capture(self.device):
                raise
            note = f"not replayed: {timing.describe_error(e)}"
        else:
            ops, outside = step_profile.merge(sync_ops, replay)
            if ops is not sync_ops:
                return {"ops": ops, "total_ms": sum(o["ms"] for o in ops.values()) + outside, "timed": "cuda_graph",
                        "replay_ms": replay["span_ms"], "outside_ms": outside}
            note = f"only {replay['matched']:.0%} of the replay's kernels matched the eager step's"
        finally:
            self.workload_guard.restore()
        elog(f"profile at {self.points[i].label()}: ops timed per op with syncs ({note})")
        return {"ops": sync_ops, "total_ms": sum(o["ms"] for o in sync_ops.values()), "replay_note": note}

    def status(self, req: Status) -> StatusReply:
        self._collect_precompiled()
        return StatusReply(message="ready", model=self.config.model, layers=self.layers,
                           device=str(self.device), dtype=self.config.dtype,
                           points=list(self.points),
                           startup=self.startup, logit_noise=self.logit_noise, logit_tol=self.logit_tol,
                           served=self.served, pid=os.getpid(),
                           candidate=self.candidate.name if self.candidate else None,
                           sandbox=sandbox_summary(self.device.type), executors_used=self.executors_used,
                           pool_size=self.pool_size, pool_wait_s=self.pool_wait_s,
                           pool_ready=self.pool.ready_count() if self.pool else 0,
                           ahead=len(self._ahead), ahead_used=self.ahead_used,
                           compiled_seeded=self.compiled_seeded, compiled_kept=self.compile_cache.count())


def _applied(ex: Executor | None) -> dict:
    """What confined an executor (``SandboxCapabilities.as_dict()``), for the verdict's metadata."""
    caps = getattr(ex, "applied", None)
    return dict(caps.as_dict()) if caps is not None else {}
