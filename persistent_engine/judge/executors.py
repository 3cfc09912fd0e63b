"""The judge's executors (``engine.Engine`` inherits this side): the baseline executor, the pool of warm
candidate executors sized from the device's memory (``memory.py``), the one taken for a candidate or prepared
ahead of its load, the op-level checks' byte budget, and the reference routing asked of the baseline
executor. Nothing here runs candidate code: it starts, sizes and hands out the processes that do.

``ExecutorSide`` reads what ``Engine`` sets up: ``config``, ``device``, ``points``, ``arena``, ``_init``,
``_dir``, ``baseline``, ``pool``, ``pool_size``, ``candidate``, ``_next``, ``executor_bytes``,
``device_weights``, ``op_check_floor``, ``op_check_budget``, the reference (``ref``, ``model``,
``workloads``, ``moe_routes``, ``executor_routes``, ``dtype``).
"""

from __future__ import annotations

import os
import sys

import torch

from persistent_engine import guards, timing, verify
from persistent_engine.devices import free_gpu_bytes, gpu_bytes
from persistent_engine.executor.launch import (Executor, ExecutorDied, ExecutorPool, ExecutorStartFailed,
                                              ExecutorTimeout)
from persistent_engine.io_struct import Prepare, PrepareReply
from persistent_engine.judge import memory

__all__ = ["POOL_SIZE", "EXECUTOR_START_S", "DEFAULT_CALL_S", "ExecutorSide", "elog"]

# warm candidate executors kept ready: one warms in ~8-9 s on the H200 box (imports ~5 s, CUDA context,
# weights, the first Triton compile ~2 s), a cycle should take < 1 s, so twelve warming at once on its 16
# cores (~1.3 per second) keep the judge from waiting;
# on CPU one (the CI machine has two cores). On CUDA fewer when memory is short (``memory.pool_plan``: each
# takes its KV caches, activations and context; the weights are mapped, device_share.py).
POOL_SIZE = {"cuda": 12, "cpu": 1}
EXECUTOR_START_S = 900.0
DEFAULT_CALL_S = 600.0


def elog(line: str) -> None:
    """One line on the engine's stderr (the supervisor keeps it and shows its tail on a crash)."""
    print(f"tkcc-engine[{os.getpid()}]: {line}", file=sys.stderr, flush=True)


class ExecutorSide:
    """Starting, sizing and handing out the judge's executors (module doc)."""

    def _new_executor(self, role: str) -> Executor:
        capture = role == "baseline" and self.device.type == "cuda" and self.config.cuda_graph
        return Executor({**self._init, "capture": capture}, self.arena, self._dir, role=role)

    def _start_baseline(self) -> None:
        """The baseline executor: the reference code only, in a process of the same kind as a candidate's
        (so both sides of an A/B pay the same overheads); replaced if it ever dies."""
        if self.baseline is not None:
            self.baseline.kill()
        ex = self._new_executor("baseline")
        ex.wait_ready(EXECUTOR_START_S)
        self.baseline = ex
        if self.device.type == "cuda" and self.config.cuda_graph:
            r = ex.call({"op": "capture", "points": list(range(len(self.points)))}, DEFAULT_CALL_S)
            self.base_graphed = set(r["graphed"])
            self.graph_errors = {int(k): v for k, v in r["errors"].items()}
        else:
            why = timing.graph_plan(self.points, self.device.type, self.config.cuda_graph)
            self.graph_errors = {i: w for i, w in enumerate(why) if w}

    def _pool(self) -> ExecutorPool:
        if self.pool is None:
            size = self.config.pool_size or POOL_SIZE.get(self.device.type, 1)
            if self.device.type == "cuda" and not self.config.pool_size:
                # the baseline executor's measured footprint each, from what the other tier's weights and
                # the op checks leave (the other tier's engine and its pool use this GPU too)
                plan = self._pool_plan(size)
                elog(plan.line())
                size, self.prepare_ahead = plan.size, plan.held_out >= memory.HELD_OUT
            self.pool_size = size
            self.pool = ExecutorPool(lambda: self._new_executor("candidate"), size, EXECUTOR_START_S,
                                     note=self._memory_note)
        return self.pool

    def _measured_overhead(self) -> int:
        """The warmed baseline executor's own overhead beyond its tensors (``memory.measured_overhead`` of
        its ``memory`` report; the constant where it cannot answer)."""
        if self.device.type != "cuda":
            return memory.EXECUTOR_OVERHEAD_BYTES
        try:
            report = self.baseline.call({"op": "memory"}, DEFAULT_CALL_S)
        except (ExecutorDied, ExecutorTimeout) as e:
            elog(f"the baseline executor did not report its memory ({e}); counting "
                 f"{memory.EXECUTOR_OVERHEAD_BYTES / memory.GIB:.1f} GiB of overhead per executor")
            return memory.EXECUTOR_OVERHEAD_BYTES
        return memory.measured_overhead(report if isinstance(report, dict) and "error" not in report else None)

    def _executor_each(self) -> int:
        return memory.executor_bytes(self.executor_bytes, self.arena.size,
                                     getattr(self, "executor_overhead", memory.EXECUTOR_OVERHEAD_BYTES))

    def _weights_to_come(self, free: int) -> int:
        """The co-tenants' weights not on the device yet (this process's own holdings: the allocator's
        reserve, the exported weights, its context, the baseline executor and the started candidate ones)."""
        started = (self.pool_size - self.pool.warming_count()) if self.pool is not None else 0
        started += (self.candidate is not None) + (self._next is not None)     # taken from the pool
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

    def prepare(self, req: Prepare) -> PrepareReply:
        self._pool()
        if not self.prepare_ahead:              # memory short (memory.pool_plan): the load takes one itself
            return PrepareReply(message="no executor prepared ahead: device memory short", pool_wait_s=0.0)
        if self._next is None or not self._next.alive():
            self._next = None
            self._next = self._take()
        return PrepareReply(message="executor ready", pool_wait_s=self.pool_wait_s)

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
                results = self.baseline.call({"op": "steps", "steps": [{"i": i, "v": v, "moe": True, "refs": None}]},
                                             left).get("results")
                r = results[0] if isinstance(results, list) and results and isinstance(results[0], dict) else {}
            except (ExecutorDied, ExecutorTimeout):
                r = {}
            calls = calls_from_wire((r.get("routes") or {}).get("calls"), self.device)
            out = r.get("logits")
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
