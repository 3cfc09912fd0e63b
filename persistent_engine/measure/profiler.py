"""Where the time goes: per-op time of the current forward (baseline, or with the active overrides) at
each workload point.

Every registry op's *current* implementation is wrapped (through ``registry.override``, so each call
site of the model is reached) by a wrapper that synchronises the device before and after the call and
reads the engine's own clock. Time goes to the OUTERMOST op only: a fine op that a composite's default
runs (``linear`` inside ``add_rms_norm_linear``) is not counted again at the top level, but appears in
the composite's ``parts`` ({fine op: ms}, direct children only). The synchronisation inflates short ops
on a GPU by the launch+sync latency (~10 µs, paid again by each part inside a composite), so ``share``
is of the summed top-level op time and ``step_ms`` (one graph replay or eager step, unwrapped) is
reported beside it for scale. A region (a decoder layer or decode step op, ``OpDef.region``) that runs its
default is looked through: its parts are the top-level ops (counted in ``all_calls`` only, and named in
their ``regions``, so a search can weigh a region by the time of the ops it would replace); overridden, it
is one op like any other. Cost: ``reps`` + 1 wrapped steps per point.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Callable

import torch

from persistent_engine.measure import timing


class _Recorder:
    """Wraps op implementations; attributes each call to the outermost op running when it starts.

    ``calls[op]``/``ms[op]``: top-level calls and time; ``part_calls[outer][op]``/``part_ms[outer][op]``:
    calls made directly inside a top-level ``outer`` (deeper calls stay inside their parent's time);
    ``all_calls[op]``: calls at any depth; ``within[op]``: the looked-through regions a top-level call of
    ``op`` ran inside."""

    def __init__(self, sync: Callable[[], None] | None):
        self.sync = sync                                   # None: count only, no clock
        self.stack: list[str] = []
        self.calls: dict[str, int] = defaultdict(int)
        self.ms: dict[str, float] = defaultdict(float)
        self.part_calls: dict[str, dict[str, int]] = defaultdict(lambda: defaultdict(int))
        self.part_ms: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.all_calls: dict[str, int] = defaultdict(int)  # at any depth (composites nest: qkv_rotary > linear)
        self.regions: list[str] = []                       # the looked-through regions running now, outermost first
        self.within: dict[str, set[str]] = defaultdict(set)

    def wrap(self, name: str, impl: Callable) -> Callable:
        def wrapper(*args, **kwargs):
            depth, outer = len(self.stack), (self.stack[0] if self.stack else None)
            self.stack.append(name)
            self.all_calls[name] += 1
            try:
                if self.sync is None:
                    return impl(*args, **kwargs)
                self.sync()
                t0 = timing.now_ns()
                out = impl(*args, **kwargs)
                self.sync()
                dt = (timing.now_ns() - t0) / 1e6
            finally:
                self.stack.pop()
                if depth == 0:
                    self.calls[name] += 1
                    self.within[name].update(self.regions)
                elif depth == 1:
                    self.part_calls[outer][name] += 1
            if depth == 0:
                self.ms[name] += dt
            elif depth == 1:
                self.part_ms[outer][name] += dt
            return out
        return wrapper

    def see_through(self, name: str, impl: Callable) -> Callable:
        """A region running its default: counted in ``all_calls`` only, its parts timed as top-level ops."""
        def wrapper(*args):
            self.all_calls[name] += 1
            self.regions.append(name)
            try:
                return impl(*args)
            finally:
                self.regions.pop()
        return wrapper

    def run(self, model, workload) -> None:
        from persistent_engine.ops import registry

        wrapped = {}
        for n in registry.names():
            impl, d = registry.current(n), registry.get(n)
            wrapped[n] = self.see_through(n, impl) if d.region and impl is d.baseline else self.wrap(n, impl)
        with registry.override(wrapped):
            model.step(workload)


def call_tree(model, workload) -> dict[str, dict]:
    """{op: {"calls": top-level calls per step, "parts": {fine op: calls inside it}}} for one step of the
    current forward; "parts" only where the op ran other ops (a composite on its default)."""
    rec = _Recorder(None)
    rec.run(model, workload)
    return {n: {"calls": c, **({"parts": dict(rec.part_calls[n])} if rec.part_calls.get(n) else {})}
            for n, c in rec.calls.items()}


def op_calls(model, workload) -> dict[str, int]:
    """How often each op runs in one step of the current forward, at any depth: the top-level calls
    plus the calls inside composites (so ``set(op_calls(...))`` is every op an override of which
    changes this step; ``call_tree`` keeps the two apart)."""
    rec = _Recorder(None)
    rec.run(model, workload)
    return dict(rec.all_calls)


def profile_point(model, workload, device: torch.device, reps: int = 3) -> dict[str, dict]:
    """{op: {"ms": per-step time, "calls": per step, "share"[, "parts": {fine op: ms}][, "regions": [region
    op, ...]]}} for one workload (median over ``reps``); only top-level ops are keys, so summing "ms" counts no
    time twice; "regions": the regions running their default that the op's calls ran inside (sorted)."""
    from persistent_engine.ops import registry

    sync = (lambda: timing._synchronize(device)) if device.type == "cuda" else (lambda: None)
    recs: list[_Recorder] = []
    for _ in range(reps + 1):                   # first rep warms up
        rec = _Recorder(sync)
        rec.run(model, workload)
        recs.append(rec)
    recs = recs[1:]
    names = sorted({n for r in recs for n in r.calls})
    ms = {n: statistics.median(r.ms.get(n, 0.0) for r in recs) for n in names}
    total = sum(ms.values()) or 1.0
    out: dict[str, dict] = {}
    for n in sorted(names, key=lambda n: -ms[n]):
        out[n] = {"ms": ms[n], "calls": recs[-1].calls.get(n, 0), "share": ms[n] / total}
        parts = sorted({p for r in recs for p in r.part_ms.get(n, {})})
        if parts or registry.get(n).composite:
            out[n]["parts"] = {p: statistics.median(r.part_ms.get(n, {}).get(p, 0.0) for r in recs) for p in parts}
        if recs[-1].within.get(n):
            out[n]["regions"] = sorted(recs[-1].within[n])
    return out
