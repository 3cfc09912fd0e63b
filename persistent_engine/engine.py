"""The engine: one model slice and its workload points, built once, judging candidates by hot reload.

Start-up (stages timed for the log): weights (``build_model``), KV cache (``make_workload`` for
every point and input variant), warm-up (baseline logits kept as the verification reference, which
ops each point calls, baseline step time), calibration (the layer-level logits bound of each point and
variant, ``tolerance.py``), graph capture (CUDA: one graph per point and variant,
sharing one memory pool; decode and prefill alike, a point whose capture fails is timed eagerly).
Then the guards snapshot the global state: from here on, anything a candidate changes is seen.

A candidate's life: ``load`` (static checks, fresh module, guards, CONFIG applied) -> ``verify`` (op
level, layer level with every override's calls counted, guards) -> ``bench`` (graphs of the affected
points captured again with the overrides, A/B timing, roofline floor, spot re-check, guards) ->
``unload`` (overrides cleared, candidate graphs freed, re-laid KV caches dropped, global state,
weights and workloads restored). Nothing else is rebuilt: no weight reload, no re-warm-up.

CONFIG: ``cuda_graph`` and ``cuda_graph_batch_sizes`` pick which affected points are graphed on the
candidate's side; ``kv_block_size`` re-lays every point's KV cache (same content, new paging) for
the candidate's side of verification and timing; ``max_num_seqs`` and ``max_num_batched_tokens``
are scheduler knobs no single step shows (``CONFIG_NOTES``).
"""

from __future__ import annotations

import faulthandler
import inspect
import os
import random
import sys
import tempfile
import traceback
from dataclasses import dataclass, field

import torch

from persistent_engine import candidate as cand_mod
from persistent_engine import guards, tier_inputs, timing, tolerance, verify
from persistent_engine.workloads import relayout_workload
from persistent_engine.io_struct import (Bench, BenchReply, ErrorReply, LoadCandidate, LoadReply, Profile,
                                         ProfileReply, Reply, Request, Status, StatusReply, Unload,
                                         UnloadReply, Verify, VerifyReply)

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
# what the engine does with each CONFIG knob, as reported in the load and bench replies
CONFIG_NOTES = {
    "cuda_graph": "applied: candidate points captured in CUDA graphs (CUDA only)",
    "cuda_graph_batch_sizes": "applied: only points of these batch sizes are graphed on the candidate side",
    "kv_block_size": "applied: the candidate's KV caches re-laid with this block size",
    "max_num_seqs": "not measurable by the engine; judged by compiler config search",
    "max_num_batched_tokens": "not measurable by the engine; judged by compiler config search",
    "max_chunk_tokens": "not measurable by the engine; judged by compiler config search",
}
# roofline floor: bytes a step must read at least / this bandwidth (GB/s); CUDA when unset
DEFAULT_PEAK_BANDWIDTH_GBS = {"cuda": 5000.0}
DEVICE_ERRORS = ("CUDA error", "illegal memory access", "device-side assert", "CUBLAS_STATUS",
                 "unspecified launch failure", "misaligned address", "illegal instruction")


def default_points(device: str) -> list[dict]:
    if device.startswith("cuda"):
        return [{"phase": "decode", "batch": 1, "context": 1024, "chunk": 1, "weight": 0.4},
                {"phase": "decode", "batch": 32, "context": 1024, "chunk": 1, "weight": 0.4},
                {"phase": "prefill", "batch": 1, "context": 0, "chunk": 512, "weight": 0.2}]
    return [{"phase": "decode", "batch": 1, "context": 24, "chunk": 1, "weight": 0.5},
            {"phase": "decode", "batch": 3, "context": 40, "chunk": 1, "weight": 0.3},
            {"phase": "prefill", "batch": 1, "context": 0, "chunk": 16, "weight": 0.2}]


def point_label(p: dict) -> str:
    if p.get("phase") == "prefill":
        return f"prefill b{p['batch']} ctx{p.get('context', 0)} chunk{p.get('chunk', 1)}"
    return f"decode b{p['batch']} ctx{p.get('context', 0)}"


@dataclass(frozen=True)
class EngineConfig:
    model: str
    layers: list[int] | None = None     # None: every layer
    device: str = "cpu"
    dtype: str = "bf16"
    points: list[dict] = field(default_factory=list)   # empty: default_points(device)
    seed: int = 0
    variants: int = 2                   # input variants per point (fresh inputs across samples)
    cuda_graph: bool = True
    # roofline plausibility floor (GB/s): None = DEFAULT_PEAK_BANDWIDTH_GBS of the device (off on CPU)
    peak_bandwidth_gbs: float | None = None
    inputs: dict = field(default_factory=dict)     # tier_inputs.TierInputs as JSON ({}: uniform, random routers)


def elog(line: str) -> None:
    """One line on the engine's stderr (the supervisor keeps it and shows its tail on a crash)."""
    print(f"tkcc-engine[{os.getpid()}]: {line}", file=sys.stderr, flush=True)


def _gpu_bytes(device: torch.device) -> int | None:
    """Total memory of the engine's GPU; None on CPU (where the tiny and one-layer models stay small)."""
    return torch.cuda.get_device_properties(device).total_memory if device.type == "cuda" else None


def _warm_triton(device: torch.device) -> None:
    """Compile and launch one trivial Triton kernel (~2 s on a GPU the first time in a process)."""
    try:
        import triton
        import triton.language as tl
    except ImportError:
        return

    @triton.jit
    def _copy(src, dst, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        tl.store(dst + offs, tl.load(src + offs, mask=offs < n), mask=offs < n)

    try:
        x = torch.arange(16, dtype=torch.float32, device=device)
        y = torch.empty_like(x)
        _copy[(1,)](x, y, 16, BLOCK=16)
    except Exception:  # noqa: BLE001 - no Triton backend here (CPU without the interpreter)
        pass


class Engine:
    def __init__(self, config: EngineConfig, log=lambda stage, seconds: None):
        from persistent_engine.models.decoder import build_model
        from persistent_engine.models.spec import ModelSpec
        from persistent_engine.ops import registry

        self.config = config
        self.registry = registry
        if not faulthandler.is_enabled():       # a segfault or abort leaves its stack on stderr
            faulthandler.enable(file=sys.stderr)
        self.device = torch.device(config.device)
        self.dtype = DTYPES[config.dtype]
        self.spec = ModelSpec.from_name(config.model)
        self.layers = list(config.layers) if config.layers is not None else list(range(self.spec.num_layers))
        self.points = [dict(p) for p in (config.points or default_points(config.device))]
        self.startup: dict[str, float] = {}
        self._rng = random.Random(int.from_bytes(os.urandom(8), "little"))   # fresh verification seeds
        self._dir = tempfile.mkdtemp(prefix="tkcc-candidates-")
        self.op_params = {n: cand_mod.param_names(inspect.signature(registry.get(n).reference))
                          for n in registry.names()}

        def stage(name, t0):
            s = (timing.now_ns() - t0) / 1e9
            self.startup[name] = s
            log(name, s)

        t0 = timing.now_ns()
        if self.device.type == "cpu":           # one thread: steadier timings, no oversubscription
            torch.set_num_threads(int(os.environ.get("TKCC_ENGINE_THREADS", "1")))
        torch.manual_seed(config.seed)
        self.inputs = tier_inputs.TierInputs.from_dict(config.inputs)       # a checkpoint, tokens, routing
        self.model = build_model(self.spec, layers=self.layers, device=self.device, dtype=self.dtype,
                                 seed=config.seed, weights=self.inputs.weights)
        if isinstance(self.model, torch.nn.Module):
            self.model.eval()
        torch.set_grad_enabled(False)
        self._sync()
        stage("weights", t0)

        t0 = timing.now_ns()
        self.workloads, self.routing = self.inputs.build(self.model, self.points, config.variants, config.seed)
        self._sync()
        stage("kv_cache", t0)

        t0 = timing.now_ns()
        from persistent_engine import profiler
        for ws in self.workloads:               # first step: kernels warm, new-token KV slots written
            for w in ws:
                self.model.step(w)
        self.ref = [[self.model.step(w).clone() for w in ws] for ws in self.workloads]
        self.ops_at = [set(profiler.op_calls(self.model, ws[0])) for ws in self.workloads]
        self.timer = timing.make_timer(self.device)
        _warm_triton(self.device)               # Triton's one-off start-up is not a candidate's cost
        self._sync()
        stage("warmup", t0)

        t0 = timing.now_ns()
        self.moe_routes = verify.ReferenceRoutes(self.registry)   # the reference's routing, recorded on first use
        # layer-level logits bound per point and variant: the slice's own rounding noise (tolerance.py)
        self.logit_noise = tolerance.calibrate(self.registry, self.model, self.workloads, self.ref, self.moe_routes,
                                               self.ops_at, self.device, self.dtype, config.seed)
        self.logit_tol = [[tolerance.tolerance(self.dtype, n) for n in row] for row in self.logit_noise]
        self._sync()
        stage("calibration", t0)

        t0 = timing.now_ns()
        # per point: one (graph, static output) per variant, or None (timed eagerly: no CUDA, graphs
        # off, or its capture failed; the reason in graph_errors). Candidates get a pool of their
        # own, kept for the engine's life: each candidate's graphs are freed at unload and the next
        # one's reuse that memory, no pool is ever dropped while graphs may use it.
        self.base_graphs: list[list | None] = [None] * len(self.points)
        self.graph_errors: dict[int, str] = {}
        self.graphs_healthy = True
        self._cand_pool = None
        plan = timing.graph_plan(self.points, self.device.type, config.cuda_graph)
        for i, why in enumerate(plan):
            if why is not None:
                self.graph_errors[i] = why
        todo = [i for i, why in enumerate(plan) if why is None]
        if todo:
            pool = torch.cuda.graph_pool_handle()
            self._cand_pool = torch.cuda.graph_pool_handle()
            graphs, self.graphs_healthy = timing.capture_points(
                todo, lambda i: [self._capture(w, pool) for w in self.workloads[i]],
                lambda: timing.recover_after_capture(self.device), self.graph_errors, elog)
            for i, g in graphs.items():
                self.base_graphs[i] = g
            if not self.graphs_healthy:
                raise RuntimeError(f"CUDA graph capture left the device unusable: {self.graph_errors}")
        stage("graph_capture", t0)
        # baseline step time per point, as bench times it (graph replay where captured): what an
        # unaffected point costs on both sides
        self.base_ms = []
        for i, ws in enumerate(self.workloads):
            g = self.base_graphs[i]
            run = (lambda g=g: (g[0][0].replay(), g[0][1])[1]) if g else (lambda w=ws[0]: self.model.step(w))
            self.base_ms.append(timing.time_one(self.timer, run, 5, graph=g is not None).median_ms)

        gpu_bytes = _gpu_bytes(self.device)
        # an op-level check may hold a quarter of the GPU beside the weights (verify.op_level's budget)
        self.op_check_budget = gpu_bytes // 4 if gpu_bytes else None
        # the weights' copy stays on the device up to a tenth of its memory (llama-1b: 2.5 GB), else in
        # host memory with a device-side fingerprint (a deepseek tier: tens of GB)
        weights = guards.model_weights(self.model)
        self.weight_guard = guards.TensorGuard(weights, device_budget=gpu_bytes // 10 if gpu_bytes else None)
        self.workload_guard = guards.TensorGuard(
            {f"point{i}.v{v}.{k}": t for i, ws in enumerate(self.workloads) for v, w in enumerate(ws)
             for k, t in guards.tensors_of(w).items()})
        model_objects = [self.model] + [o for b in getattr(self.model, "blocks", [])
                                        for o in (b, getattr(b, "attn", None), getattr(b, "mlp", None))
                                        if o is not None and hasattr(o, "__dict__")]
        self.state_guard = guards.GlobalStateGuard(guards.default_namespaces() + model_objects)
        # the registry as built: each op's OpDef and baseline (a candidate reaching the registry
        # module could slow the baseline down or swap a reference)
        self._opdefs = {n: registry.get(n) for n in registry.names()}
        self.thread_guard = guards.ThreadGuard()
        self.candidate: cand_mod.LoadedCandidate | None = None
        self.cand_graphs: dict[int, list | None] = {}      # point -> candidate graphs (or None)
        self.cand_graph_errors: dict[int, str] = {}
        self.tie_kept_rows: dict = {}                       # (point, variant) -> rows the MoE tie check kept
        self.cand_workloads: list[list] | None = None       # kv_block_size: re-laid per candidate
        self.peak_bandwidth_gbs = (config.peak_bandwidth_gbs if config.peak_bandwidth_gbs is not None
                                   else DEFAULT_PEAK_BANDWIDTH_GBS.get(self.device.type))
        # roofline floor per point (ms); 0 where the check is off
        self.floor_ms = [guards.min_step_bytes(weights, ws[0], self.spec) / (self.peak_bandwidth_gbs * 1e9) * 1e3
                         if self.peak_bandwidth_gbs else 0.0 for ws in self.workloads]
        self.served = 0
        self.poisoned = False                   # a device error: exit after replying
        self.poison_cause = ""
        self._release_cached()

    # ------------------------------------------------------------------------------ helpers
    def _sync(self) -> None:
        if self.device.type == "cuda":
            timing._synchronize(self.device)

    def _release_cached(self) -> None:
        """Hand the caching allocator's free blocks back to the device (after start-up and after each
        candidate): the two tiers' engines share one GPU, and memory one holds cached is memory the other
        cannot get (deepseek on an H200: the slow engine held 87.7 GB beside ~53 GB of weights, the fast one
        51.6 GB, and candidates failed with OOM at 0.7 GB free). Cost: the next candidate's first allocations."""
        if self.device.type == "cuda":
            torch.cuda.empty_cache()

    def _poison(self, cause: str) -> None:
        """This process is done after the current reply (the supervisor starts a fresh one)."""
        if not self.poisoned:
            elog(f"leaving after this reply: {cause}")
        self.poisoned = True
        self.poison_cause = self.poison_cause or cause

    def _put_weights_back(self, names: list[str]) -> bool:
        """Restore changed weights from the guard's copies (True); where none were kept (too large for the
        host) this process leaves after the reply and the supervisor starts a fresh one (False)."""
        if self.weight_guard.restorable:
            self.weight_guard.restore(names)
            return True
        self._poison("the weights changed and no copy was kept to restore them")
        return False

    def _capture(self, workload, pool):
        """(graph, static output) of one step."""
        return timing.capture_graph(lambda: self.model.step(workload), self.device, pool)

    def _guard_reasons(self, phase: str) -> list[str]:
        """Threads, global state, weights: named reasons, and everything put back for the next one."""
        reasons = []
        threads = self.thread_guard.new_threads()
        if threads:
            reasons.append(f"{phase}: candidate left {len(threads)} thread(s) running: "
                           f"{', '.join(threads)[:300]}")
            self._poison("a candidate thread is still running")     # a Python thread cannot be killed
        changed = self.state_guard.check()
        if changed:
            reasons.append(f"{phase}: candidate changed global state: {', '.join(changed[:8])}"
                           + (f" (+{len(changed) - 8} more)" if len(changed) > 8 else ""))
            self.state_guard.restore()
        bad_ops = self._registry_changed()
        if bad_ops:
            reasons.append(f"{phase}: candidate changed the op registry: {', '.join(bad_ops[:8])}")
            self._poison("the op registry was changed")  # its tables are private: start a clean engine
        self._sync()
        bad = self.weight_guard.changed()
        if bad:
            reasons.append(f"{phase}: candidate changed the weights: {', '.join(bad[:5])}"
                           + (f" (+{len(bad) - 5} more)" if len(bad) > 5 else ""))
            self._put_weights_back(bad)
        bad_inputs = [k for k in self.workload_guard.changed()
                      if not self.workload_guard._live[k].is_floating_point()]
        if bad_inputs:
            reasons.append(f"{phase}: candidate changed workload inputs: {', '.join(bad_inputs[:5])}")
        self.workload_guard.restore()           # KV slots the candidate's step wrote are put back
        return reasons

    def _registry_changed(self) -> list[str]:
        """Ops whose OpDef was swapped, or that run something other than the reference or the
        candidate's override (the registry's own state, read outside any override)."""
        wanted = self.candidate.overrides if self.candidate else {}
        active = self.registry.active_overrides()
        bad = [n for n, d in self._opdefs.items() if self.registry.get(n) is not d]
        bad += [n for n, fn in active.items() if wanted.get(n) is not fn]
        bad += [n for n, d in self._opdefs.items()
                if n not in active and self.registry.current(n) is not getattr(d, "baseline", d.reference)]
        return sorted(set(bad))

    def _affected(self) -> list[int]:
        """Points whose step the candidate changes: an overridden op runs there, or (kv_block_size)
        every point, whose KV cache it re-lays."""
        if self.candidate is None:
            return []
        if self.cand_workloads is not None:
            return list(range(len(self.points)))
        ops = set(self.candidate.overrides)
        return [i for i, at in enumerate(self.ops_at) if at & ops]

    def _cand_ws(self, i: int) -> list:
        """The workloads of point ``i`` as the candidate's side runs them."""
        return self.cand_workloads[i] if self.cand_workloads is not None else self.workloads[i]

    def _apply_config(self, config: dict) -> list[str]:
        """Apply the knobs that change a step (kv_block_size); reasons when a value is unusable."""
        bs = config.get("kv_block_size")
        if bs is None:
            return []
        if not 1 <= bs <= 4096:
            return [f"load: CONFIG['kv_block_size'] = {bs} is outside 1..4096"]
        if all(w.cache.block_size == bs for ws in self.workloads for w in ws):
            return []
        self.cand_workloads = [[relayout_workload(self.model, w, bs, seed=self.config.seed + 31 * i + v)
                                for v, w in enumerate(ws)] for i, ws in enumerate(self.workloads)]
        self._sync()
        return []

    def _config_notes(self) -> dict[str, str]:
        return {k: CONFIG_NOTES[k] for k in (self.candidate.config if self.candidate else {}) if k in CONFIG_NOTES}

    def _free_cand_graphs(self) -> None:
        """Candidate graphs go only once the device is idle (none may still run when freed); their
        memory returns to the engine's candidate pool for the next candidate."""
        self._sync()
        for graphs in self.cand_graphs.values():
            for g, _out in graphs or []:
                g.reset()
        self.cand_graphs.clear()
        self.cand_graph_errors.clear()
        self.tie_kept_rows = {}

    # ------------------------------------------------------------------------------ requests
    def handle(self, req: Request) -> Reply:
        handlers = {LoadCandidate: self.load, Verify: self.verify, Bench: self.bench, Unload: self.unload,
                    Profile: self.profile, Status: self.status}
        try:
            reply = handlers[type(req)](req)
        except torch.OutOfMemoryError as e:
            elog(f"{type(req).__name__}: out of memory: {str(e)[:300]}")
            self.registry.clear_overrides()
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            return ErrorReply(message=f"out of memory: {str(e)[:300]}", kind="oom")
        except (Exception, SystemExit, KeyboardInterrupt) as e:  # noqa: BLE001 - a verdict, not a crash
            self.registry.clear_overrides()
            text = f"{type(e).__name__}: {e}"
            elog(f"{type(req).__name__} raised:\n" + "".join(traceback.format_exception(e))[-4000:])
            if self.device.type == "cuda" and any(s in text for s in DEVICE_ERRORS):
                self._poison(f"device error: {text[:300]}")
                return ErrorReply(message=f"device error (engine restarts): {text[:500]}", kind="device")
            return ErrorReply(message=f"candidate raised {text[:1000]}", kind="candidate")
        self.served += 1
        bad = [r for r in getattr(reply, "reasons", []) if any(m in r for m in DEVICE_ERRORS)]
        if self.device.type == "cuda" and bad:
            self._poison(f"device error: {bad[0][:300]}")                # a sticky CUDA error
        return reply

    def load(self, req: LoadCandidate) -> LoadReply:
        t0 = timing.now_ns()
        if self.candidate is not None:
            self.unload(Unload())
        reasons = cand_mod.static_check(req.source, self.op_params)
        if not reasons:
            loaded = cand_mod.load_candidate(req.source, req.name, self._dir, self.op_params)
            reasons = self._guard_reasons("load")
            if isinstance(loaded, list):
                reasons = loaded + reasons
            else:
                reasons = reasons or self._apply_config(loaded.config)
                if reasons:
                    self.cand_workloads = None
                    cand_mod.unload_candidate(loaded)
                else:
                    self.candidate = loaded
        secs = (timing.now_ns() - t0) / 1e9
        if reasons:
            return LoadReply(ok=False, message="candidate refused", reasons=reasons, seconds=secs)
        c = self.candidate
        notes = "; ".join(f"{k}: {v}" for k, v in self._config_notes().items())
        return LoadReply(ok=True, message=f"loaded {c.name}" + (f" (CONFIG {notes})" if notes else ""),
                         ops=sorted(c.overrides), config=c.config, description=c.description[:2000],
                         seconds=secs)

    def _need_candidate(self) -> ErrorReply | None:
        if self.candidate is None:
            return ErrorReply(message="no candidate loaded", kind="no_candidate")
        return None

    def verify(self, req: Verify) -> Reply:
        if (err := self._need_candidate()) is not None:
            return err
        t0 = timing.now_ns()
        seed = req.seed if req.seed is not None else self._rng.randrange(1, 2**31)
        c = self.candidate
        checks = verify.op_level(sorted(c.overrides), c.overrides, self.spec, self.points, self.device,
                                 self.dtype, seed, budget=self.op_check_budget)
        reasons = [ch.detail for ch in checks if not ch.passed]
        reasons += self._guard_reasons("op-level verification")
        if not reasons:                         # layer level: the slice with the overrides
            # every override wrapped to count its calls: one the model never reaches is rejected
            counted = {n: guards.Counted(fn) for n, fn in c.overrides.items()}
            layer_reasons: list[str] = []
            # MoE points: moe_route wrapped to record the candidate's routing; flips at near-ties of the
            # reference's routing (recorded once per point and variant) are excused (verify.TieCheck);
            # a candidate that keeps the reference router then runs with the reference's experts
            # (verify.RouteReplay), so a flip cannot cascade through later MoE layers
            ties = verify.TieCheck(self.dtype)
            # one run per variant: determinism is checked at op level (every op twice) and the outputs
            # produced while timed are checked again by bench's spot re-check
            for i in self._affected():
                for v, w in enumerate(self._cand_ws(i)):
                    where, rec, replayed = f"layer-level {point_label(self.points[i])} variant {v}", None, False
                    if "moe_route" in self.ops_at[i]:
                        refs = self.moe_routes.get((i, v), self.model, self.workloads[i][v], self.ref[i][v],
                                                   self.dtype)
                        # a candidate that keeps the reference router runs with the reference's experts
                        out, rec = verify.routed_step(self.registry, self.model, w, counted, refs)
                        replayed = isinstance(rec, verify.RouteReplay)
                    else:
                        with self.registry.override(counted):
                            out = self.model.step(w)
                    self._sync()
                    tol = self.logit_tol[i][v]
                    r = (ties.compare(out, self.ref[i][v], where, refs, rec.calls, w.cu_seqlens_q, key=(i, v),
                                      replayed=replayed, tol=tol) if rec
                         else verify.compare_logits(out, self.ref[i][v], self.dtype, where, tol))
                    self.workload_guard.restore()
                    if r:
                        layer_reasons.append(r)
                        break
            self.tie_kept_rows = dict(ties.kept_rows)      # for bench's spot re-check of this candidate
            if not layer_reasons:
                layer_reasons += [r for r in (ties.budget_reason(),) if r]
                layer_reasons += guards.never_called(counted, self.ops_at)
            checks.append(verify.Check("layer", not layer_reasons,
                                       "; ".join(layer_reasons)[:2000] or ties.summary()))
            reasons += layer_reasons
            reasons += self._guard_reasons("layer-level verification")
        return VerifyReply(ok=not reasons, message="correct" if not reasons else "rejected", reasons=reasons,
                           checks=[ch.to_dict() for ch in checks], seed=seed,
                           seconds=(timing.now_ns() - t0) / 1e9)

    def bench(self, req: Bench) -> Reply:
        if (err := self._need_candidate()) is not None:
            return err
        t0 = timing.now_ns()
        c = self.candidate
        samples = req.samples or timing.DEFAULT_SAMPLES[self.device.type]
        affected = set(self._affected())
        plan = timing.graph_plan(self.points, self.device.type, c.config.get("cuda_graph", True),
                                 c.config.get("cuda_graph_batch_sizes"))
        per_point, reasons = [], []
        clear, apply = self.registry.clear_overrides, (lambda: self.registry.set_overrides(c.overrides))
        notes = self._config_notes()
        # captured once per candidate, with its overrides, where the baseline side is graphed too
        todo = [i for i in sorted(affected)
                if self.base_graphs[i] is not None and plan[i] is None and i not in self.cand_graphs]
        if todo:
            apply()
            try:
                graphs, healthy = timing.capture_points(
                    todo, lambda i: [self._capture(w, self._cand_pool) for w in self._cand_ws(i)],
                    lambda: timing.recover_after_capture(self.device), self.cand_graph_errors, elog)
            finally:
                clear()
            self.cand_graphs.update(graphs)
            if not healthy:                     # timed eagerly below; this process is then replaced
                self._poison(f"a failed candidate graph capture left the device unusable: "
                             f"{self.cand_graph_errors}")
        for i, p in enumerate(self.points):
            if i not in affected:
                per_point.append({"point": p, "label": point_label(p), "affected": False,
                                  "baseline_ms": self.base_ms[i], "candidate_ms": self.base_ms[i],
                                  "speedup": 1.0})
                continue
            ws, cws = self.workloads[i], self._cand_ws(i)
            bg, cg = self.base_graphs[i], self.cand_graphs.get(i)
            n = samples if req.samples else timing.samples_for(self.device.type, self.base_ms[i], samples)
            if bg is not None and cg is not None:
                base = lambda v, bg=bg: (bg[v][0].replay(), bg[v][1])[1]    # noqa: E731
                cand = lambda v, cg=cg: (cg[v][0].replay(), cg[v][1])[1]    # noqa: E731
                res = timing.ab_interleaved(self.timer, base, cand, n, variants=len(ws),
                                            warmup=req.warmup or 2, graph=True,
                                            stop_rel_se=None if req.samples else
                                            timing.STOP_REL_SE.get(self.device.type))
            else:
                base = lambda v, ws=ws: self.model.step(ws[v])              # noqa: E731
                cand = lambda v, cws=cws: self.model.step(cws[v])           # noqa: E731
                res = timing.ab_interleaved(self.timer, base, cand, n, variants=len(ws),
                                            warmup=req.warmup or 1, enter_baseline=clear,
                                            enter_candidate=apply)
                clear()
            for k, v, out in res.kept:          # spot re-check of outputs produced while timed
                keep = self.tie_kept_rows.get((i, v))   # rows verification compared (MoE ties)
                ref = self.ref[i][v]
                if keep is not None:
                    if not bool(keep.any()):
                        continue
                    out, ref = out[keep], ref[keep]
                r = verify.compare_logits(out, ref, self.dtype, f"spot re-check {point_label(p)} timed sample {k}",
                                          self.logit_tol[i][v])
                if r:
                    reasons.append(r)
                    break
            r = guards.implausibly_fast(point_label(p), res.candidate.median_ms, self.floor_ms[i])
            if r:
                reasons.append(r + (f" ({self.peak_bandwidth_gbs:g} GB/s ceiling)" if self.peak_bandwidth_gbs else ""))
            self.workload_guard.restore()
            graphed = bg is not None and cg is not None
            per_point.append({"point": p, "label": point_label(p), "affected": True, "graph": graphed,
                              "graph_error": None if graphed else (self.cand_graph_errors.get(i)
                                                                   or self.graph_errors.get(i) or plan[i]),
                              "baseline_ms": res.baseline.median_ms, "baseline_iqr_ms": res.baseline.iqr_ms,
                              "candidate_ms": res.candidate.median_ms,
                              "candidate_iqr_ms": res.candidate.iqr_ms, "samples": res.candidate.n,
                              "floor_ms": self.floor_ms[i], "speedup": res.speedup,
                              **({"config": notes} if notes else {})})
        reasons += self._guard_reasons("timing")
        # a point's weight is already its share of GPU time, so the step-time ratio at each point is
        # weighted by it alone: new time / old time = sum(w * cand/base) / sum(w)
        wsum = sum(pp["point"].get("weight", 1.0) for pp in per_point)
        rsum = sum(pp["point"].get("weight", 1.0) * pp["candidate_ms"] / pp["baseline_ms"]
                   for pp in per_point if pp["baseline_ms"] > 0)
        speedup = wsum / rsum if rsum > 0 else None
        message = "timed" if not reasons else "rejected while timed"
        if notes:
            message += "; CONFIG " + "; ".join(f"{k}: {v}" for k, v in notes.items())
        return BenchReply(ok=not reasons, message=message, reasons=reasons, per_point=per_point,
                          speedup=speedup, timer=self.timer.name, samples=samples,
                          seconds=(timing.now_ns() - t0) / 1e9)

    def unload(self, req: Unload) -> UnloadReply:
        self.registry.clear_overrides()
        self._free_cand_graphs()                # before the module whose kernels they launch goes
        self.cand_workloads = None
        restored = []
        if self.candidate is not None:
            cand_mod.unload_candidate(self.candidate)
            restored.append(f"candidate {self.candidate.name}")
            self.candidate = None
        restored += self.state_guard.restore()
        bad = self.weight_guard.changed()
        if bad and self._put_weights_back(bad):
            restored += [f"weight {b}" for b in bad]
        self.workload_guard.restore()
        self._release_cached()
        return UnloadReply(message="unloaded", restored=restored)

    def profile(self, req: Profile) -> ProfileReply:
        from persistent_engine import profiler

        per_point = []
        for i, p in enumerate(self.points):
            ops = profiler.profile_point(self.model, self.workloads[i][0], self.device)
            self.workload_guard.restore()
            per_point.append({"point": p, "label": point_label(p), "step_ms": self.base_ms[i],
                              "total_ms": sum(o["ms"] for o in ops.values()), "ops": ops})
        return ProfileReply(message="baseline profile", per_point=per_point,
                            timer=self.timer.name + "+sync per op")

    def status(self, req: Status) -> StatusReply:
        return StatusReply(message="ready", model=self.config.model, layers=self.layers,
                           device=str(self.device), dtype=self.config.dtype, points=self.points,
                           startup=self.startup, logit_noise=self.logit_noise, logit_tol=self.logit_tol,
                           served=self.served, pid=os.getpid(),
                           candidate=self.candidate.name if self.candidate else None)
