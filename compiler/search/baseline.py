"""The baseline measurements of the optimize loop: the A/A noise probe of each tier and the per-op
time of the engine's baseline profile weighted over the workload points."""

from __future__ import annotations

import time
from typing import Any, Callable

from persistent_engine import WorkloadPoint

__all__ = ["measure_noise", "op_ms"]


def _identity_candidate() -> str:
    """A candidate that recomputes ``linear`` the reference way: timing it A/B against the reference
    measures the tier's noise (its true speedup is 1). ``linear`` is called by every architecture (the
    attention output projection of GQA, MLA's projections, the MoE router), so the engine's "override
    never called" guard accepts it on every model and every workload point is timed."""
    import inspect

    from persistent_engine.ops import registry

    x, w, b = list(inspect.signature(registry.get("linear").reference).parameters)
    return (f'"""A/A probe: linear as the reference computes it."""\nimport torch\n\n\n'
            f"def linear({x}, {w}, {b}):\n"
            f"    return torch.nn.functional.linear({x}, {w}, {b})\n\n\n"
            f'OVERRIDES = {{"linear": linear}}\n')


def measure_noise(evaluate: Callable[[str, str], Any], runs: int,
                  on_event: Callable[[str], None] | None = None, deadline: float = float("inf"),
                  tiers: tuple[str, ...] = ("fast", "slow")) -> dict[str, float]:
    """Relative A/A spread per tier: the median over ``runs`` of |speedup - 1| of the identity
    candidate (the median, so that one disturbed run, e.g. the engine's first, does not decide).
    Rounds alternate the tiers (fast, slow, fast, slow, ...), so that ``deadline`` leaves both with as many
    runs (before, the fast tier took all its rounds and the slow one got one). Cost: ``runs`` evaluations per
    tier (fewer past ``deadline``: one round of both at least)."""
    import statistics

    src = _identity_candidate()
    spreads: dict[str, list[float]] = {t: [] for t in tiers}
    for i in range(max(runs, 1)):
        if i and time.monotonic() > deadline:         # the run's budget: one round per tier at least
            break
        for tier in tiers:
            v = evaluate(tier, src)
            if getattr(v, "correct", False) and getattr(v, "speedup", None):
                spreads[tier].append(abs(float(v.speedup) - 1.0))
            elif on_event is not None:
                on_event(f"warning: the A/A probe was rejected on the {tier} tier: "
                         f"{(getattr(v, 'reasons', None) or ['no speedup'])[0]}")
    noise = {}
    for tier, got in spreads.items():
        noise[tier] = round(statistics.median(got), 4) if got else 0.05   # unmeasurable: 5%
        if not got and on_event is not None:
            on_event(f"warning: {tier}-tier noise unmeasured; assuming 5% (only gains above it are accepted)")
    return noise


def op_ms(profile: dict, points: list[WorkloadPoint]) -> dict[str, float]:
    """Per-op milliseconds of the traffic's mean step (``compiler.plan.op_time``: the points weighted as the
    workload table weighs them), from the engine's profile document (``Supervisor.profile()``:
    ``{"per_point": [{"point": {...}, "step_ms", "ops": {op: {"ms", "calls", "share"}}}]}``); a row whose
    point is not among ``points`` weighs nothing (all rows the same when none is)."""
    from compiler.plan.op_time import op_ms_per_step, point_weights, step_mix

    rows = profile.get("per_point") or []
    ops = [{op: float(v["ms"]) for op, v in row["ops"].items()} for row in rows]
    steps = [float(row.get("step_ms") or sum(o.values())) for row, o in zip(rows, ops)]
    weights = point_weights([row["point"] for row in rows], {p.key: p.weight for p in points})
    return op_ms_per_step(step_mix(weights, steps), ops)
