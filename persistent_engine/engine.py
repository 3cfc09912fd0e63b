"""The engine: one model slice and its workload points, built once, judging candidates by hot reload.

Start-up (stages timed for the log): weights (``build_model``), KV cache (``make_workload`` for
every point and input variant), warm-up (baseline logits kept as the verification reference, which
ops each point calls, baseline step time), graph capture (CUDA: one graph per point and variant,
sharing one memory pool). Then the guards snapshot the global state: from here on, anything a
candidate changes is seen.

A candidate's life: ``load`` (static checks, fresh module, guards) -> ``verify`` (op level, layer
level, guards) -> ``bench`` (graphs of the affected points captured again with the overrides, A/B
timing, spot re-check, guards) -> ``unload`` (overrides cleared, candidate graphs freed, global
state, weights and workloads restored). Nothing else is rebuilt: no weight reload, no re-warm-up.
"""

from __future__ import annotations

import inspect
import os
import random
import tempfile
from dataclasses import dataclass, field

import torch

from persistent_engine import candidate as cand_mod
from persistent_engine import guards, timing, verify
from persistent_engine.io_struct import (Bench, BenchReply, ErrorReply, LoadCandidate, LoadReply, Profile,
                                         ProfileReply, Reply, Request, Status, StatusReply, Unload,
                                         UnloadReply, Verify, VerifyReply)

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
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


def _tensors(obj, prefix: str = "", depth: int = 0, seen: set | None = None) -> dict[str, torch.Tensor]:
    """Every tensor reachable through attributes, lists and dicts of ``obj`` (workload objects)."""
    seen = set() if seen is None else seen
    out: dict[str, torch.Tensor] = {}
    if isinstance(obj, torch.Tensor):
        if id(obj) not in seen:
            seen.add(id(obj))
            out[prefix or "tensor"] = obj
        return out
    if depth > 4 or id(obj) in seen:
        return out
    seen.add(id(obj))
    if isinstance(obj, dict):
        items = obj.items()
    elif isinstance(obj, (list, tuple)):
        items = enumerate(obj)
    elif hasattr(obj, "__dict__"):
        items = vars(obj).items()
    else:
        return out
    for k, v in items:
        out.update(_tensors(v, f"{prefix}.{k}" if prefix else str(k), depth + 1, seen))
    return out


def model_weights(model) -> dict[str, torch.Tensor]:
    """Every tensor of the model that no step may change: parameters (and the rotary table)."""
    params = getattr(model, "params", None)
    if isinstance(params, dict) and params:
        named = dict(params)
        if isinstance(getattr(model, "cos_sin", None), torch.Tensor):
            named["cos_sin"] = model.cos_sin
        return named
    if isinstance(model, torch.nn.Module):
        named = dict(model.named_parameters())
        named.update(dict(model.named_buffers()))
        if named:
            return {k: v for k, v in named.items()}
    return _tensors(model)


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
        from persistent_engine.workloads import make_workload

        self.config = config
        self.registry = registry
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
        self.model = build_model(self.spec, layers=self.layers, device=self.device, dtype=self.dtype,
                                 seed=config.seed)
        if isinstance(self.model, torch.nn.Module):
            self.model.eval()
        torch.set_grad_enabled(False)
        self._sync()
        stage("weights", t0)

        t0 = timing.now_ns()
        self.workloads = [[make_workload(self.model, p, seed=config.seed * 1000 + 17 * i + v)
                           for v in range(config.variants)] for i, p in enumerate(self.points)]
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
        # per point: one (graph, static output) per variant, or None: prefill steps read lengths on
        # the host (not capturable; a failed capture can leave the allocator mid-capture, so none is
        # tried) and are timed eagerly, as is a decode step whose capture failed
        self.base_graphs: list[list | None] = [None] * len(self.points)
        self.graph_errors: dict[int, str] = {}
        if self.device.type == "cuda" and config.cuda_graph:
            pool = torch.cuda.graph_pool_handle()
            for i, ws in enumerate(self.workloads):
                if self.points[i].get("phase", "decode") == "decode":
                    self.base_graphs[i] = self._capture_all(i, ws, pool, self.graph_errors)
                else:
                    self.graph_errors[i] = "prefill: timed eagerly"
        stage("graph_capture", t0)
        # baseline step time per point, as bench times it (graph replay where captured): what an
        # unaffected point costs on both sides
        self.base_ms = []
        for i, ws in enumerate(self.workloads):
            g = self.base_graphs[i]
            run = (lambda g=g: (g[0][0].replay(), g[0][1])[1]) if g else (lambda w=ws[0]: self.model.step(w))
            self.base_ms.append(timing.time_one(self.timer, run, 5, graph=g is not None).median_ms)

        self.weight_guard = guards.TensorGuard(model_weights(self.model))
        self.workload_guard = guards.TensorGuard(
            {f"point{i}.v{v}.{k}": t for i, ws in enumerate(self.workloads) for v, w in enumerate(ws)
             for k, t in _tensors(w).items()})
        model_objects = [self.model] + [o for b in getattr(self.model, "blocks", [])
                                        for o in (b, getattr(b, "attn", None), getattr(b, "mlp", None))
                                        if o is not None and hasattr(o, "__dict__")]
        self.state_guard = guards.GlobalStateGuard(guards.default_namespaces() + model_objects)
        # the registry as built: each op's OpDef and reference (a candidate reaching the registry
        # module could slow the baseline down or swap a reference)
        self._opdefs = {n: registry.get(n) for n in registry.names()}
        self.thread_guard = guards.ThreadGuard()
        self.candidate: cand_mod.LoadedCandidate | None = None
        self.cand_graphs: dict[int, list | None] = {}      # point -> candidate graphs (or None)
        self.cand_graph_errors: dict[int, str] = {}
        self._cand_pool = None
        self.served = 0
        self.poisoned = False                   # a device error: exit after replying

    # ------------------------------------------------------------------------------ helpers
    def _sync(self) -> None:
        if self.device.type == "cuda":
            timing._synchronize(self.device)

    def _capture_all(self, i: int, ws: list, pool, errors: dict[int, str]) -> list | None:
        try:
            return [self._capture(w, pool) for w in ws]
        except Exception as e:  # noqa: BLE001 - not capturable: time this point eagerly
            errors[i] = f"{type(e).__name__}: {str(e)[:200]}"
            self._sync()
            return None

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
            self.poisoned = True                # a Python thread cannot be killed: restart
        changed = self.state_guard.check()
        if changed:
            reasons.append(f"{phase}: candidate changed global state: {', '.join(changed[:8])}"
                           + (f" (+{len(changed) - 8} more)" if len(changed) > 8 else ""))
            self.state_guard.restore()
        bad_ops = self._registry_changed()
        if bad_ops:
            reasons.append(f"{phase}: candidate changed the op registry: {', '.join(bad_ops[:8])}")
            self.poisoned = True                # its tables are private: start a clean engine
        self._sync()
        bad = self.weight_guard.changed()
        if bad:
            reasons.append(f"{phase}: candidate changed the weights: {', '.join(bad[:5])}"
                           + (f" (+{len(bad) - 5} more)" if len(bad) > 5 else ""))
            self.weight_guard.restore(bad)
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
                if n not in active and self.registry.current(n) is not d.reference]
        return sorted(set(bad))

    def _affected(self) -> list[int]:
        ops = set(self.candidate.overrides) if self.candidate else set()
        return [i for i, at in enumerate(self.ops_at) if at & ops]

    # ------------------------------------------------------------------------------ requests
    def handle(self, req: Request) -> Reply:
        handlers = {LoadCandidate: self.load, Verify: self.verify, Bench: self.bench, Unload: self.unload,
                    Profile: self.profile, Status: self.status}
        try:
            reply = handlers[type(req)](req)
        except torch.OutOfMemoryError as e:
            self.registry.clear_overrides()
            if self.device.type == "cuda":
                torch.cuda.empty_cache()
            return ErrorReply(message=f"out of memory: {str(e)[:300]}", kind="oom")
        except (Exception, SystemExit, KeyboardInterrupt) as e:  # noqa: BLE001 - a verdict, not a crash
            self.registry.clear_overrides()
            text = f"{type(e).__name__}: {e}"
            if self.device.type == "cuda" and any(s in text for s in DEVICE_ERRORS):
                self.poisoned = True
                return ErrorReply(message=f"device error (engine restarts): {text[:500]}", kind="device")
            return ErrorReply(message=f"candidate raised {text[:1000]}", kind="candidate")
        self.served += 1
        if self.device.type == "cuda" and any(m in r for r in getattr(reply, "reasons", []) for m in DEVICE_ERRORS):
            self.poisoned = True                # a sticky CUDA error: this context is done
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
            elif reasons:
                cand_mod.unload_candidate(loaded)
            else:
                self.candidate = loaded
        secs = (timing.now_ns() - t0) / 1e9
        if reasons:
            return LoadReply(ok=False, message="candidate refused", reasons=reasons, seconds=secs)
        c = self.candidate
        return LoadReply(ok=True, message=f"loaded {c.name}", ops=sorted(c.overrides), config=c.config,
                         description=c.description[:2000], seconds=secs)

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
                                 self.dtype, seed)
        reasons = [ch.detail for ch in checks if not ch.passed]
        reasons += self._guard_reasons("op-level verification")
        if not reasons:                         # layer level: the slice with the overrides
            layer_reasons: list[str] = []
            for i in self._affected():
                for v, w in enumerate(self.workloads[i]):
                    for run in range(2):
                        with self.registry.override(c.overrides):
                            out = self.model.step(w)
                        self._sync()
                        r = verify.compare_logits(out, self.ref[i][v], self.dtype,
                                                  f"layer-level {point_label(self.points[i])} variant {v}"
                                                  + (" (second run)" if run else ""))
                        self.workload_guard.restore()
                        if r:
                            layer_reasons.append(r)
                            break
            checks.append(verify.Check("layer", not layer_reasons, "; ".join(layer_reasons)[:2000]))
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
        graphs = c.config.get("cuda_graph", True)
        batches = c.config.get("cuda_graph_batch_sizes")
        affected = set(self._affected())
        per_point, reasons = [], []
        clear, apply = self.registry.clear_overrides, (lambda: self.registry.set_overrides(c.overrides))
        if graphs and self._cand_pool is None and self.device.type == "cuda":
            self._cand_pool = torch.cuda.graph_pool_handle()
        for i, p in enumerate(self.points):
            if i not in affected:
                per_point.append({"point": p, "label": point_label(p), "affected": False,
                                  "baseline_ms": self.base_ms[i], "candidate_ms": self.base_ms[i],
                                  "speedup": 1.0})
                continue
            ws = self.workloads[i]
            bg = self.base_graphs[i]
            cg = None
            if bg is not None and graphs and (batches is None or p["batch"] in batches):
                if i not in self.cand_graphs:   # captured once per candidate, with its overrides
                    apply()
                    try:
                        self.cand_graphs[i] = self._capture_all(i, ws, self._cand_pool, self.cand_graph_errors)
                    finally:
                        clear()
                    if self.cand_graphs[i] is None:
                        # timed eagerly below; a failed capture may leave a pending CUDA error or
                        # allocator state behind, so this engine is replaced after the reply
                        self.poisoned = True
                cg = self.cand_graphs[i]
            n = samples if req.samples else timing.samples_for(self.device.type, self.base_ms[i], samples)
            if cg is not None:
                base = lambda v, bg=bg: (bg[v][0].replay(), bg[v][1])[1]    # noqa: E731
                cand = lambda v, cg=cg: (cg[v][0].replay(), cg[v][1])[1]    # noqa: E731
                res = timing.ab_interleaved(self.timer, base, cand, n, variants=len(ws),
                                            warmup=req.warmup or 2, graph=True)
            else:
                step = lambda v, ws=ws: self.model.step(ws[v])              # noqa: E731
                res = timing.ab_interleaved(self.timer, step, step, n, variants=len(ws),
                                            warmup=req.warmup or 1, enter_baseline=clear,
                                            enter_candidate=apply)
                clear()
            for k, v, out in res.kept:          # spot re-check of outputs produced while timed
                r = verify.compare_logits(out, self.ref[i][v], self.dtype,
                                          f"spot re-check {point_label(p)} timed sample {k}")
                if r:
                    reasons.append(r)
                    break
            self.workload_guard.restore()
            per_point.append({"point": p, "label": point_label(p), "affected": True, "graph": cg is not None,
                              "graph_error": self.cand_graph_errors.get(i) or self.graph_errors.get(i),
                              "baseline_ms": res.baseline.median_ms, "baseline_iqr_ms": res.baseline.iqr_ms,
                              "candidate_ms": res.candidate.median_ms,
                              "candidate_iqr_ms": res.candidate.iqr_ms, "samples": n,
                              "speedup": res.speedup})
        reasons += self._guard_reasons("timing")
        # a point's weight is already its share of GPU time, so the step-time ratio at each point is
        # weighted by it alone: new time / old time = sum(w * cand/base) / sum(w)
        wsum = sum(pp["point"].get("weight", 1.0) for pp in per_point)
        rsum = sum(pp["point"].get("weight", 1.0) * pp["candidate_ms"] / pp["baseline_ms"]
                   for pp in per_point if pp["baseline_ms"] > 0)
        speedup = wsum / rsum if rsum > 0 else None
        return BenchReply(ok=not reasons, message="timed" if not reasons else "rejected while timed",
                          reasons=reasons, per_point=per_point, speedup=speedup,
                          timer=self.timer.name, samples=samples,
                          seconds=(timing.now_ns() - t0) / 1e9)

    def unload(self, req: Unload) -> UnloadReply:
        self.registry.clear_overrides()
        self.cand_graphs.clear()
        self.cand_graph_errors.clear()
        self._cand_pool = None                  # its memory goes back with the candidate's graphs
        restored = []
        if self.candidate is not None:
            cand_mod.unload_candidate(self.candidate)
            restored.append(f"candidate {self.candidate.name}")
            self.candidate = None
        restored += self.state_guard.restore()
        bad = self.weight_guard.changed()
        if bad:
            self.weight_guard.restore(bad)
            restored += [f"weight {b}" for b in bad]
        self.workload_guard.restore()
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
                           startup=self.startup, served=self.served, pid=os.getpid(),
                           candidate=self.candidate.name if self.candidate else None)
