"""Kernels of one decode step from torch.profiler: count, busy time (union of kernel intervals), idle gaps.

    intervals, windows = profile_intervals(run, steps=5, cuda=True)    # ``steps`` calls of ``run``
    s = summarize(intervals, windows)      # per-step medians: kernels, busy_us, span_us, idle_us; top kernels

Each call of ``run`` sits in a ``record_function(MARK)`` window closed after a device sync, so a kernel
belongs to the call whose window holds its start (CUPTI reports the kernels a CUDA graph replay launches).
On CPU the ``aten::`` ops directly under a window stand in for kernels. Used by the engine's step profile
(``step_profile``) and the benchmarks ``step_kernels.py``, ``e2e_decode.py`` and ``e2e_variants.py``.
Cost: the profiler's start-up (~1 s) plus ``steps`` calls.
"""

from __future__ import annotations

import statistics
import time
from typing import Callable

import torch

__all__ = ["Interval", "MARK", "by_window", "profile_intervals", "summarize", "union_us"]

Interval = tuple[str, float, float]          # (kernel name, start us, end us)
MARK = "tkcc_step"                           # the record_function window around one replay


def union_us(intervals: list[Interval]) -> float:
    """Length of the union of the intervals (overlapping kernels, streams, nested CPU ops count once)."""
    total, end = 0.0, float("-inf")
    for _, s, e in sorted(intervals, key=lambda x: x[1]):
        if e > end:
            total += e - max(s, end)
            end = e
    return total


def by_window(intervals: list[Interval], windows: list[tuple[float, float]]) -> list[list[Interval]]:
    """The kernel intervals that start inside each window (one per replay), in window order; others dropped."""
    groups: list[list[Interval]] = [[] for _ in windows]
    # on CUDA the profiler also reports each MARK window as a device-side range: not a kernel
    for iv in sorted((iv for iv in intervals if iv[0] != MARK), key=lambda x: x[1]):
        for g, (w0, w1) in zip(groups, windows):
            if w0 <= iv[1] <= w1:
                g.append(iv)
                break
    return groups


def summarize(intervals: list[Interval], windows: list[tuple[float, float]], top: int = 15) -> dict:
    """Per-step medians over the replays (kernels, busy, span, idle) and per-name totals per step.
    Raises when a replay's window holds no kernel (the profiler saw none)."""
    groups = by_window(intervals, windows)
    steps = len(groups)
    if not steps or not all(groups):
        raise RuntimeError(f"the profiler saw kernels in {sum(map(bool, groups))} of {steps} replays")
    med = lambda xs: statistics.median(xs)  # noqa: E731
    busy = [union_us(g) for g in groups]
    span = [max(e for _, _, e in g) - min(s for _, s, _ in g) for g in groups]
    per_name: dict[str, list[float]] = {}
    for g in groups:
        for name, s, e in g:
            per_name.setdefault(name, []).append(e - s)
    rows = sorted(({"kernel": n[:90], "calls_per_step": len(d) / steps, "us_per_step": sum(d) / steps,
                    "us_per_call": sum(d) / len(d)} for n, d in per_name.items()), key=lambda r: -r["us_per_step"])
    return {"steps": steps, "kernels": med([len(g) for g in groups]), "busy_us": med(busy), "span_us": med(span),
            "idle_us": med([sp - b for sp, b in zip(span, busy)]), "distinct_kernels": len(rows), "top": rows[:top]}


def profile_intervals(run: Callable[[], object], steps: int,
                      cuda: bool) -> tuple[list[Interval], list[tuple[float, float]]]:
    """``steps`` calls of ``run`` under torch.profiler, each in a ``MARK`` window closed after a device
    sync: (the device kernels (cuda) or the ``aten::`` ops directly under a window (cpu) as (name,
    start, end) in microseconds, the windows)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile, record_function

    run()                                                    # warm (lazy allocations, JIT)
    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])
    with profile(activities=acts) as prof:
        for _ in range(steps):
            with record_function(MARK):
                run()
                if cuda:
                    torch.cuda.synchronize()
            time.sleep(0.001)
    out, windows = [], []
    for ev in prof.events():
        if ev.name == MARK and ev.device_type == DeviceType.CPU:
            windows.append((ev.time_range.start, ev.time_range.end))
        elif cuda and ev.device_type == DeviceType.CUDA:
            out.append((ev.name, ev.time_range.start, ev.time_range.end))
        elif (not cuda and ev.device_type == DeviceType.CPU and ev.name.startswith("aten::")
              and ev.cpu_parent is not None and ev.cpu_parent.name == MARK):
            out.append((ev.name, ev.time_range.start, ev.time_range.end))
    return out, sorted(windows)
