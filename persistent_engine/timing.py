"""Timing in the engine, out of a candidate's reach (DESIGN.md step 4).

Every clock, event class and synchronisation function is bound to a module global when this
module is imported, which the engine does before any candidate code runs; a candidate that later
patches ``time.perf_counter_ns``, ``torch.cuda.Event.elapsed_time`` or ``torch.cuda.synchronize``
changes nothing here (and the global-state guard rejects it for trying).

GPU: a sample is ``flush L2 -> event -> replay CUDA graph -> event -> synchronize the device`` (all
streams). Without a graph (capture refused) the end event is recorded after a device-wide
synchronize, so work a candidate pushed onto another stream is inside the sample.
CPU: ``perf_counter_ns`` around one eager step.
A/B: baseline and candidate alternate ABBA within one loop, so drift (clocks, thermals, other
processes) hits both sides alike; median and IQR per side.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch

_perf_counter_ns = time.perf_counter_ns
_cuda_available = torch.cuda.is_available
_Event = torch.cuda.Event
_event_record = torch.cuda.Event.record
_event_elapsed = torch.cuda.Event.elapsed_time
_synchronize = torch.cuda.synchronize
_tensor_zero = torch.Tensor.zero_
_tensor_clone = torch.Tensor.clone

DEFAULT_SAMPLES = {"cpu": 15, "cuda": 50}
# On the GPU a point's sample count shrinks for long steps so that timing one side of one point
# costs about SAMPLE_BUDGET_MS of step time (an eager 512-token prefill at ~4 ms gets 11 samples, a
# graphed decode step at ~0.4 ms keeps all 50); never fewer than MIN_SAMPLES, so the median and IQR
# stay meaningful. On CPU every point keeps DEFAULT_SAMPLES (its timings are noisier).
SAMPLE_BUDGET_MS = {"cpu": float("inf"), "cuda": 25.0}
MIN_SAMPLES = 11


def samples_for(device_type: str, step_ms: float, cap: int) -> int:
    """Samples per side for a point whose baseline step takes ``step_ms``, at most ``cap``."""
    fit = SAMPLE_BUDGET_MS.get(device_type, float("inf")) / max(step_ms, 1e-6)
    return int(max(MIN_SAMPLES, min(cap, fit)))


@dataclass(frozen=True)
class Stats:
    median_ms: float
    iqr_ms: float
    n: int

    @staticmethod
    def of(samples_ms: list[float]) -> "Stats":
        if len(samples_ms) >= 2:
            q1, _, q3 = statistics.quantiles(samples_ms, n=4, method="inclusive")
            iqr = q3 - q1
        else:
            iqr = 0.0
        return Stats(median_ms=statistics.median(samples_ms), iqr_ms=iqr, n=len(samples_ms))

    def to_dict(self) -> dict:
        return {"median_ms": self.median_ms, "iqr_ms": self.iqr_ms, "n": self.n}


class Timer:
    """One timed sample of ``run()`` on the engine's device; ``run`` returns the output tensor."""

    name = "perf_counter_ns"

    def __init__(self, device: torch.device):
        self.device = device

    def sample(self, run: Callable[[], torch.Tensor], graph: bool = False) -> tuple[float, torch.Tensor]:
        t0 = _perf_counter_ns()
        out = run()
        t1 = _perf_counter_ns()
        return (t1 - t0) / 1e6, out


class CudaTimer(Timer):
    name = "cuda_events"

    def __init__(self, device: torch.device, flush_bytes: int | None = None):
        super().__init__(device)
        props = torch.cuda.get_device_properties(device)
        l2 = int(getattr(props, "L2_cache_size", 0) or 0)
        n = flush_bytes or max(2 * l2, 64 * 1024 * 1024)
        self._flush = torch.empty(n // 4, dtype=torch.int32, device=device)   # n bytes
        self._start = _Event(enable_timing=True)
        self._end = _Event(enable_timing=True)

    def sample(self, run: Callable[[], torch.Tensor], graph: bool = False) -> tuple[float, torch.Tensor]:
        _tensor_zero(self._flush)               # evict the previous sample's lines from L2
        _event_record(self._start)
        out = run()
        if not graph:                           # eager: include every stream's work
            _synchronize(self.device)
        _event_record(self._end)
        _synchronize(self.device)
        return _event_elapsed(self._start, self._end), out


def capture_graph(run: Callable[[], torch.Tensor], device: torch.device | None = None, pool=None,
                  warmup: int = 2) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    """(graph, static output) of ``run()`` captured in a CUDA graph. ``warmup`` runs first on a side
    stream, as capture requires (Triton JIT, allocator, lazily sized buffers)."""
    s = torch.cuda.Stream(device)
    s.wait_stream(torch.cuda.current_stream(device))
    with torch.cuda.stream(s):
        for _ in range(warmup):
            run()
    torch.cuda.current_stream(device).wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, pool=pool):
        out = run()
    return g, out


def make_timer(device: torch.device) -> Timer:
    return CudaTimer(device) if device.type == "cuda" else Timer(device)


@dataclass
class ABResult:
    baseline: Stats
    candidate: Stats
    # (sample index, variant index, output clone) of candidate samples kept for the spot re-check
    kept: list[tuple[int, int, torch.Tensor]]

    @property
    def speedup(self) -> float:
        return self.baseline.median_ms / self.candidate.median_ms if self.candidate.median_ms > 0 else 0.0


def ab_interleaved(timer: Timer, baseline: Callable[[int], torch.Tensor],
                   candidate: Callable[[int], torch.Tensor], samples: int, variants: int = 1,
                   warmup: int = 1, keep: int = 3, graph: bool = False,
                   enter_baseline: Callable[[], None] | None = None,
                   enter_candidate: Callable[[], None] | None = None) -> ABResult:
    """Time ``baseline(v)`` and ``candidate(v)`` ABBA-interleaved, ``samples`` each.

    ``enter_*`` run before each sample of that side, outside the timed region (the engine switches
    the registry's overrides there on CPU, where the step runs eagerly).
    ``v`` cycles over ``variants`` input variants (fresh inputs per iteration, so caching across
    samples does not pay); the candidate's outputs at ``keep`` evenly spaced samples (always
    including the last) are cloned for the spot re-check. Cost: 2 * (samples + warmup) runs."""
    nothing = lambda: None  # noqa: E731
    enter_a, enter_b = enter_baseline or nothing, enter_candidate or nothing
    for i in range(warmup):
        enter_a()
        baseline(i % variants)
        enter_b()
        candidate(i % variants)
    keep_at = {samples - 1 - (j * samples) // max(keep, 1) for j in range(keep)} if keep else set()
    a: list[float] = []
    b: list[float] = []
    kept: list[tuple[int, int, torch.Tensor]] = []
    for i in range(samples):
        v = i % variants
        order = (((baseline, enter_a, a), (candidate, enter_b, b)) if i % 2 == 0
                 else ((candidate, enter_b, b), (baseline, enter_a, a)))
        for fn, enter, acc in order:
            enter()
            ms, out = timer.sample(lambda: fn(v), graph=graph)
            acc.append(ms)
            if fn is candidate and i in keep_at:
                kept.append((i, v, _tensor_clone(out)))
    return ABResult(Stats.of(a), Stats.of(b), kept)


def time_one(timer: Timer, run: Callable[[], torch.Tensor], samples: int, graph: bool = False) -> Stats:
    return Stats.of([timer.sample(run, graph=graph)[0] for _ in range(samples)])


def now_ns() -> int:
    """The engine's own wall clock (bound before candidates load)."""
    return _perf_counter_ns()
