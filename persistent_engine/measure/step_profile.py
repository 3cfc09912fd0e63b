"""Where a captured step's device time goes, per op: the kernels of CUDA-graph replays of the step, each
attributed to the op that launched it.

The sync-timed profile (``profiler.profile_point``) times each op between two device synchronisations: on a
GPU every op then pays a launch and a sync (~10 us), so a llama-1b decode step's ops sum to ~2.9 ms while its
graph replays in ~0.4 ms, and the ops with many small calls look costliest. What a candidate can win is what
the replay spends, so this profile measures the replay:

1. ``labelled_kernels``: one eager step under ``torch.profiler`` with each outermost op in a window opened and
   closed by a device sync (regions running their default looked through, as the sync profile does): the
   step's kernels in launch order, each with the op whose window holds its start, or ``OUTSIDE`` (the model's
   own glue between ops: the K/V cache write, residual adds, the embedding gather).
2. The step captured in a CUDA graph, ``steps`` replays profiled (``kernel_profile.profile_intervals``).
3. ``align``: the replay's kernels matched to the eager ones by name in order (``difflib``: a graph holds
   the same kernels in the same order; a memset node or a kernel the capture dropped stays unmatched).
4. ``attribute``: per op, the busy time of its kernels and the idle gap before each (the launch and
   dependency latency the op's kernel waited on), so the ops' times sum to the replay's span.

On CPU there is no graph and no asynchrony: the ``aten::`` ops under each op window stand in for kernels
and the "replay" is a profiled eager step (the logic runs in CI). Cost: the profiler's start-up (~1 s), one
labelled step, one capture and ``steps`` + 1 replays per point.
"""

from __future__ import annotations

import difflib
import statistics
from collections import defaultdict
from typing import Callable

import torch

from persistent_engine.measure import timing
from persistent_engine.measure.kernel_profile import MARK, Interval, by_window, profile_intervals

__all__ = ["MIN_MATCHED", "OP_MARK", "OUTSIDE", "align", "attribute", "labelled_kernels", "merge", "replay_profile"]

OP_MARK = "tkcc_op:"              # the record_function window of one outermost op call: OP_MARK + op name
OUTSIDE = "(outside ops)"         # kernels the model launched between ops


def _op_windows(model, workload, sync: Callable[[], None]) -> None:
    """One step with every outermost op call in an ``OP_MARK`` window opened and closed by ``sync``."""
    from torch.profiler import record_function

    from persistent_engine.ops import registry

    depth = [0]

    def wrap(name: str, impl: Callable) -> Callable:
        def wrapper(*args, **kwargs):
            if depth[0]:
                return impl(*args, **kwargs)
            depth[0] += 1
            try:
                sync()
                with record_function(OP_MARK + name):
                    out = impl(*args, **kwargs)
                    sync()
                return out
            finally:
                depth[0] -= 1
        return wrapper

    wrapped = {}
    for n in registry.names():
        impl, d = registry.current(n), registry.get(n)
        if not (d.region and impl is d.baseline):          # a region on its default: its parts are the ops
            wrapped[n] = wrap(n, impl)
    with registry.override(wrapped):
        model.step(workload)


def labelled_kernels(model, workload, device: torch.device) -> list[tuple[str, str]]:
    """[(op or OUTSIDE, kernel name)] of one eager step, in launch order (CUDA: device kernels by start time,
    each in the op window holding its start; CPU: the ``aten::`` ops directly under an op window, and those
    directly under the step's window as OUTSIDE)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile, record_function

    cuda = device.type == "cuda"
    sync = (lambda: timing._synchronize(device)) if cuda else (lambda: None)
    _op_windows(model, workload, sync)                       # warm: lazy buffers, JIT
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
        with record_function(MARK):
            _op_windows(model, workload, sync)
            sync()
    windows, kernels = [], []
    for ev in prof.events():
        if ev.device_type == DeviceType.CPU and ev.name.startswith(OP_MARK):
            windows.append((ev.time_range.start, ev.time_range.end, ev.name[len(OP_MARK):]))
        elif cuda and ev.device_type == DeviceType.CUDA and ev.name != MARK and not ev.name.startswith(OP_MARK):
            kernels.append((ev.time_range.start, ev.name))
        elif not cuda and ev.device_type == DeviceType.CPU and ev.name.startswith("aten::") and ev.cpu_parent:
            parent = ev.cpu_parent.name
            if parent == MARK or parent.startswith(OP_MARK):
                kernels.append((ev.time_range.start, ev.name))
    windows.sort()
    out = []
    for start, name in sorted(kernels):
        op = next((w[2] for w in windows if w[0] <= start <= w[1]), OUTSIDE)
        out.append((op, name))
    return out


def align(labelled: list[tuple[str, str]], replay: list[str]) -> list[str | None]:
    """The op of each replay kernel (names in order): matching runs of names between the eager step's
    kernels and the replay's; a replay kernel with no eager counterpart gets None."""
    ops: list[str | None] = [None] * len(replay)
    matcher = difflib.SequenceMatcher(a=[n for _, n in labelled], b=replay, autojunk=False)
    for a, b, size in matcher.get_matching_blocks():
        for i in range(size):
            ops[b + i] = labelled[a + i][0]
    return ops


def attribute(replay: list[Interval], ops: list[str | None]) -> dict[str, dict]:
    """{op: {"busy_us", "idle_us", "kernels"}} of one replay: each kernel's run time (the part of it no
    earlier kernel overlaps) and the gap before it since the last kernel ended go to its op (None: OUTSIDE
    is not used, the key is "(unmatched)"). The values sum to the replay's span."""
    out: dict[str, dict] = defaultdict(lambda: {"busy_us": 0.0, "idle_us": 0.0, "kernels": 0})
    end = None
    for (_, s, e), op in sorted(zip(replay, ops), key=lambda x: x[0][1]):
        row = out[op if op is not None else "(unmatched)"]
        row["kernels"] += 1
        if end is None:
            row["busy_us"] += e - s
            end = e
            continue
        row["idle_us"] += max(0.0, s - end)
        row["busy_us"] += max(0.0, e - max(s, end))
        end = max(end, e)
    return dict(out)


def replay_profile(model, workload, device: torch.device, steps: int = 5) -> dict:
    """{"ops": {op: {"ms", "busy_ms", "idle_ms", "kernels"}}, "span_ms", "kernels", "matched"} of the step as
    a CUDA graph replays it (CPU: as an eager step runs), medians over ``steps`` replays; "matched": the
    fraction of the replay's kernels attributed to an op or to OUTSIDE. Raises where the step cannot be
    captured (the caller keeps the sync-timed profile)."""
    labelled = labelled_kernels(model, workload, device)
    cuda = device.type == "cuda"
    graph = None
    if cuda:
        graph, _ = timing.capture_graph(lambda: model.step(workload), device)
        run = graph.replay
    else:
        def run():
            return model.step(workload)
    try:
        intervals, windows = profile_intervals(run, steps, cuda)
    finally:
        del graph
    per_replay = [g for g in by_window(intervals, windows) if g]
    if not per_replay:
        raise RuntimeError("the profiler saw no kernel in any replay")
    rows, matched = [], []
    for g in per_replay:
        g = sorted(g, key=lambda iv: iv[1])
        ops = align(labelled, [n for n, _, _ in g])
        rows.append(attribute(g, ops))
        matched.append(sum(op is not None for op in ops) / len(ops))
    names = sorted({op for r in rows for op in r})
    med = statistics.median
    out = {}
    for op in names:
        busy = med(r.get(op, {}).get("busy_us", 0.0) for r in rows) / 1e3
        idle = med(r.get(op, {}).get("idle_us", 0.0) for r in rows) / 1e3
        out[op] = {"ms": busy + idle, "busy_ms": busy, "idle_ms": idle,
                   "kernels": med(r.get(op, {}).get("kernels", 0) for r in rows)}
    span = med(max(e for _, _, e in g) - min(s for _, s, _ in g) for g in per_replay) / 1e3
    return {"ops": out, "span_ms": span, "kernels": med(len(g) for g in per_replay), "matched": med(matched),
            "timed": "cuda_graph" if cuda else "eager"}


MIN_MATCHED = 0.9                  # below this share of the replay's kernels matched, the sync profile stays


def merge(sync_ops: dict[str, dict], replay: dict) -> tuple[dict[str, dict], float]:
    """The sync-timed profile's ops (``profiler.profile_point``) with their time taken from ``replay``
    (``replay_profile``): "ms" the op's replay time (its kernels' busy time and the gaps before them),
    "sync_ms" the sync-timed figure, "busy_ms", "idle_ms", "kernels"; "share" of the replay's attributed
    time. Returns (ops, ms of the kernels launched outside any op). Unchanged where fewer than
    ``MIN_MATCHED`` of the replay's kernels were matched (the graph differs from the eager step)."""
    if replay.get("matched", 0.0) < MIN_MATCHED:
        return sync_ops, 0.0
    timed = replay["ops"]
    total = sum(row["ms"] for row in timed.values()) or 1.0
    out = {}
    for op, row in sync_ops.items():
        r = timed.get(op, {"ms": 0.0, "busy_ms": 0.0, "idle_ms": 0.0, "kernels": 0})
        out[op] = {**row, "ms": r["ms"], "sync_ms": row["ms"], "busy_ms": r["busy_ms"], "idle_ms": r["idle_ms"],
                   "kernels": r["kernels"], "share": r["ms"] / total}
    outside = sum(row["ms"] for op, row in timed.items() if op not in sync_ops)
    return dict(sorted(out.items(), key=lambda kv: -kv[1]["ms"])), outside
