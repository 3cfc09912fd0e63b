"""Where the time goes: per-op time of the baseline forward at each workload point.

Every registry op is wrapped (through ``registry.override``, so each call site of the model is
reached) by a wrapper that synchronises the device before and after the reference and reads the
engine's own clock. The synchronisation inflates short ops on a GPU by the launch+sync latency
(~10 µs), so ``share`` is of the summed op time and ``step_ms`` (one graph replay or eager step,
unwrapped) is reported beside it for scale. Cost: ``reps`` wrapped steps per point.
"""

from __future__ import annotations

import statistics
from collections import defaultdict

import torch

from persistent_engine import timing


def op_calls(model, workload) -> dict[str, int]:
    """How often each registry op is called by one step at this workload (counting wrappers)."""
    from persistent_engine.ops import registry

    counts: dict[str, int] = defaultdict(int)

    def counting(name, ref):
        def wrapper(*args, **kwargs):
            counts[name] += 1
            return ref(*args, **kwargs)
        return wrapper

    with registry.override({n: counting(n, registry.get(n).reference) for n in registry.names()}):
        model.step(workload)
    return dict(counts)


def profile_point(model, workload, device: torch.device, reps: int = 3) -> dict[str, dict]:
    """{op: {"ms": per-step time, "calls": per step}} for one workload (median over ``reps``)."""
    from persistent_engine.ops import registry

    sync = (lambda: timing._synchronize(device)) if device.type == "cuda" else (lambda: None)
    per_rep: list[dict[str, float]] = []
    calls: dict[str, int] = defaultdict(int)

    def timed(name, ref, acc):
        def wrapper(*args, **kwargs):
            sync()
            t0 = timing.now_ns()
            out = ref(*args, **kwargs)
            sync()
            acc[name] += (timing.now_ns() - t0) / 1e6
            calls[name] += 1
            return out
        return wrapper

    for _ in range(reps + 1):                   # first rep warms up
        acc: dict[str, float] = defaultdict(float)
        calls.clear()
        with registry.override({n: timed(n, registry.get(n).reference, acc) for n in registry.names()}):
            model.step(workload)
        per_rep.append(dict(acc))
    per_rep = per_rep[1:]
    names = sorted({n for r in per_rep for n in r})
    ms = {n: statistics.median(r.get(n, 0.0) for r in per_rep) for n in names}
    total = sum(ms.values()) or 1.0
    return {n: {"ms": ms[n], "calls": calls[n], "share": ms[n] / total}
            for n in sorted(names, key=lambda n: -ms[n])}
