"""Step time of a workload point: roofline per op, efficiency factors per op class, kernel costs.

    mem(op)  = bytes / (hbm_bw * mem_eff), comp(op) = flops / (peak[dtype] * compute_eff)   compute ops
    mem(op)  = collective time (cost_model.comm), comp(op) = 0                             comm ops
    raw(op)  = max(mem(op), comp(op))                                                      (roofline)
    step     = sum_c factor[c] * sum_{op in c} raw(op) * count  +  kernel_overhead * kernels

A class listed in ``Efficiency.split`` is costed in the split form instead, with one factor for its
memory traffic and one for its arithmetic, added rather than overlapped:

    class c  = f_mem[c] * sum_{op in c} mem(op) * count  +  f_comp[c] * sum_{op in c} comp(op) * count

That is what one factor per class cannot express: a GEMV (memory-bound, small batch) and a GEMM
(compute-bound) of the same class at different efficiencies, and kernels that stream their operands
and then compute (eager CPU ops). The factors start at 1.0 (datasheet figures times the hardware's
default efficiencies) and are what ``cost_model.calibration`` fits from measured timings. In both
forms ``step`` is linear in the factors and the overhead, so the fit is a non-negative
least-squares problem over ``features``.

A pipeline of pp stages: a token's latency is the sum of the stage times; the throughput is set by
the slowest stage with pp micro-batches in flight.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cost_model.comm import collective_time
from cost_model.hardware import Hardware
from cost_model.layout import Layout
from traffic_profiles import TrafficPoint

from cost_model.ops import DEFAULT_EXPERT_SKEW, OP_CLASSES, OpCost, step_ops


@dataclass(frozen=True)
class Efficiency:
    """Per-op-class time multipliers and the fixed cost per kernel (None: the hardware's);
    ``split`` maps a class to its (memory, compute) factors, which replace its roofline factor."""

    factors: dict = field(default_factory=lambda: {c: 1.0 for c in OP_CLASSES})
    kernel_overhead_s: float | None = None
    split: dict = field(default_factory=dict)

    def factor(self, cls: str) -> float:
        return float(self.factors.get(cls, 1.0))

    def class_time(self, cls: str, feat: dict[str, float]) -> float:
        """Seconds of class ``cls`` from ``features`` (raw roofline seconds and split parts)."""
        if cls in self.split:
            f_mem, f_comp = self.split[cls]
            return float(f_mem) * feat[f"{cls}:memory"] + float(f_comp) * feat[f"{cls}:compute"]
        return self.factor(cls) * feat[cls]

    def overhead(self, hw: Hardware) -> float:
        return hw.kernel_overhead_s if self.kernel_overhead_s is None else self.kernel_overhead_s


DEFAULT_EFFICIENCY = Efficiency()


@dataclass(frozen=True)
class StepEstimate:
    stage_s: float                  # slowest pipeline stage (== whole step when pp == 1)
    latency_s: float                # one token through all stages
    by_class: dict                  # seconds of the slowest stage per op class, plus "overhead"
    ops: tuple                      # OpCost of the slowest stage, in order


def op_parts(op: OpCost, hw: Hardware, instance_gpus: int = 1) -> tuple[float, float]:
    """(memory, compute) seconds of one op (one occurrence, fixed kernel cost excluded); a
    collective's time counts as memory."""
    if op.cls == "comm":
        return collective_time(hw, op.collective, op.group, op.bytes, instance_gpus), 0.0
    t_compute = op.flops / (hw.peak_flops(op.dtype) * hw.compute_efficiency) if op.flops else 0.0
    t_memory = op.bytes / hw.mem_bw if op.bytes else 0.0
    return t_memory, t_compute


def op_time(op: OpCost, hw: Hardware, instance_gpus: int = 1) -> float:
    """Roofline seconds of one op (one occurrence, fixed kernel cost excluded)."""
    return max(op_parts(op, hw, instance_gpus))


def features(ops: list[OpCost], hw: Hardware, instance_gpus: int = 1) -> dict[str, float]:
    """The linear features of a step: per op class its raw roofline seconds (``c``) and its memory
    and compute seconds (``c:memory``, ``c:compute``), and the kernel count (``kernels``)."""
    out = {f"{c}{part}": 0.0 for c in OP_CLASSES for part in ("", ":memory", ":compute")}
    out["kernels"] = 0.0
    for o in ops:
        t_mem, t_comp = op_parts(o, hw, instance_gpus)
        out[o.cls] += max(t_mem, t_comp) * o.count
        out[f"{o.cls}:memory"] += t_mem * o.count
        out[f"{o.cls}:compute"] += t_comp * o.count
        out["kernels"] += o.kernels * o.count
    return out


def combine(feat: dict[str, float], hw: Hardware, eff: Efficiency) -> tuple[float, dict[str, float]]:
    by = {c: eff.class_time(c, feat) for c in OP_CLASSES}
    by["overhead"] = eff.overhead(hw) * feat["kernels"]
    return sum(by.values()), by


def estimate_step(spec, hw: Hardware, layout: Layout, point: TrafficPoint, layers: list[int] | None = None,
                  eff: Efficiency = DEFAULT_EFFICIENCY, skew: float = DEFAULT_EXPERT_SKEW) -> StepEstimate:
    """Seconds of one step of ``point`` (batch per instance) on ``layout``."""
    stages = []
    for s in range(layout.pp):
        ops = step_ops(spec, layout, point, layers, skew, stage=s)
        if getattr(eff, "per_op", False):        # cost_model.efficiency.CurveEfficiency: measured kernels
            t, by = eff.step_time(ops, hw, layout.gpus)
        else:
            t, by = combine(features(ops, hw, layout.gpus), hw, eff)
        stages.append((t, by, ops))
    slow = max(stages, key=lambda x: x[0])
    return StepEstimate(stage_s=slow[0], latency_s=sum(x[0] for x in stages), by_class=slow[1],
                        ops=tuple(slow[2]))


def estimate_points(spec, hw: Hardware, layout: Layout, points: list[TrafficPoint], layers: list[int] | None = None,
                    eff: Efficiency = DEFAULT_EFFICIENCY, skew: float = DEFAULT_EXPERT_SKEW) -> list[float]:
    """Latency (seconds) of one step at each workload point."""
    return [estimate_step(spec, hw, layout, p, layers, eff, skew).latency_s for p in points]


def op_table(est: StepEstimate, hw: Hardware, layout: Layout, eff: Efficiency = DEFAULT_EFFICIENCY) -> list[dict]:
    """Per-op rows of the slowest stage: FLOPs, bytes, arithmetic intensity, bound, seconds."""
    rows = []
    for o in est.ops:
        if getattr(eff, "per_op", False):
            t = eff.step_time([o], hw, layout.gpus)[0]
            rows.append({"op": o.name, "class": o.cls, "count": o.count, "flops": o.flops, "bytes": o.bytes,
                         "intensity": o.flops / o.bytes if o.bytes else 0.0, "bound": "measured", "seconds": t})
            continue
        t = eff.class_time(o.cls, features([o], hw, layout.gpus))            # all o.count occurrences
        bound = "comm" if o.cls == "comm" else (
            "compute" if o.flops / (hw.peak_flops(o.dtype) * hw.compute_efficiency) >= o.bytes / hw.mem_bw
            else "memory")
        rows.append({"op": o.name, "class": o.cls, "count": o.count, "flops": o.flops, "bytes": o.bytes,
                     "intensity": o.flops / o.bytes if o.bytes else 0.0, "bound": bound,
                     "seconds": t + eff.overhead(hw) * o.kernels * o.count})
    return rows
