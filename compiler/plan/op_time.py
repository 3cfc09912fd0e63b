"""Time per op over the traffic, weighted as the workload table weighs the points: one function for the
report's op-time chart (plan.json ``baseline.op_ms``/``op_ms_after``), the engine baseline's per-op
profile and the UI's before/after breakdown.

A workload point's ``weight`` is its share of the traffic's GPU time (the report's and the UI's workload
table). Multiplying a point's per-step op times by that share would count a slow point twice (its steps
are long *and* its share is large); instead each point's steps are counted: a point with weight ``w`` and
step time ``t`` runs ``w / t`` steps per unit of GPU time, and the chart shows the op times of the mean
step of that mix. Then the ops of a point hold exactly its table weight of the chart's total.
Cost: O(points x ops).
"""

from __future__ import annotations

from typing import Mapping, Sequence

__all__ = ["step_mix", "op_ms_per_step", "point_weights"]


def point_weights(rows: Sequence[Mapping], table: Mapping[tuple, float] | None = None) -> list[float]:
    """Each row's (a per-point profile's JSON: its point's fields) share of GPU time: from ``table`` (point
    key -> weight, the run's workload points) when given, else the row's own ``weight``; a row with none
    weighs 0 when others have one, and all rows weigh the same when none has. Normalised to sum 1, as the
    table shows them."""
    from persistent_engine import point_key

    got = [table.get(point_key(r)) if table is not None else r.get("weight") for r in rows]
    if not any(isinstance(w, (int, float)) and w > 0 for w in got):
        return [1.0 / len(rows)] * len(rows) if rows else []
    ws = [float(w) if isinstance(w, (int, float)) and w > 0 else 0.0 for w in got]
    total = sum(ws)
    return [w / total for w in ws]


def step_mix(weights: Sequence[float], step_ms: Sequence[float]) -> list[float]:
    """The share of the traffic's steps each point is: ``(w_i / t_i) / sum_j (w_j / t_j)`` (a point with no
    measured step time counts none)."""
    counts = [w / t if t and t > 0 else 0.0 for w, t in zip(weights, step_ms)]
    total = sum(counts) or 1.0
    return [c / total for c in counts]


def op_ms_per_step(mix: Sequence[float], per_point_ops: Sequence[Mapping[str, float]]) -> dict[str, float]:
    """Per-op milliseconds of the traffic's mean step: ``sum_i mix_i * ms_i(op)`` (``mix`` from
    :func:`step_mix`; the plan's "after" uses the reference's mix: the same traffic, the same steps)."""
    out: dict[str, float] = {}
    for f, ops in zip(mix, per_point_ops):
        for op, ms in ops.items():
            out[op] = out.get(op, 0.0) + f * float(ms)
    return {k: round(v, 6) for k, v in out.items()}
