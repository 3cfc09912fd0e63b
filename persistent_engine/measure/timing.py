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

``FairTimer`` is the benchmarks' timer (DESIGN.md "Timing everywhere"): every variant timed the same
two ways, N calls back to back (the headline) and one call after a cache flush, host dispatch beside.
"""

from __future__ import annotations

import functools
import math
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from persistent_engine.io_struct import WorkloadPoint

_perf_counter_ns = time.perf_counter_ns
_cuda_available = torch.cuda.is_available
_Event = torch.cuda.Event
_event_record = torch.cuda.Event.record
_event_elapsed = torch.cuda.Event.elapsed_time
_synchronize = torch.cuda.synchronize
_tensor_zero = torch.Tensor.zero_
_tensor_clone = torch.Tensor.clone

DEFAULT_SAMPLES = {"cpu": 21, "cuda": 50}
# A point's sample count shrinks for long samples so that timing one side of one point costs about
# SAMPLE_BUDGET_MS (GPU: an eager 512-token prefill at ~4 ms gets 11 samples, a graphed decode sample
# of ~2 ms keeps all 50; CPU: a 5 ms sample of chained decode steps keeps all 21, a 100 ms prefill
# step gets 11); never fewer than MIN_SAMPLES, so the median and IQR stay meaningful.
SAMPLE_BUDGET_MS = {"cpu": 500.0, "cuda": 25.0}
MIN_SAMPLES = 11
# Sequential stop for graph-timed A/B on the GPU: after at least STOP_MIN_PAIRS pairs, checked every
# STOP_CHECK_EVERY pairs, timing stops once the standard error of the median per-pair ratio
# (~0.93 * IQR / sqrt(n)) is below STOP_REL_SE of the median, i.e. the speedup is known to about
# +-2 x STOP_REL_SE. Graph replays with L2 flushed spread ~1%, so most points stop near 20 pairs
# instead of the 50 cap; a noisy point still gets all of them. CPU: 0.5% (a quiet machine stops early,
# a busy one takes every sample).
STOP_REL_SE = {"cpu": 0.005, "cuda": 0.003}
STOP_MIN_PAIRS = 20
STOP_CHECK_EVERY = 5
# Futility stop: most search candidates lose, and a loser needs no precise speedup (the compiler accepts
# only speedup > 1 + max(1% floor, noise): compiler/search/acceptance.py). From FUTILITY_MIN_PAIRS pairs on, at
# each look, timing stops when at most ``futility_allowance(n)`` of the n pairs have candidate/baseline
# time <= 1 + FUTILITY_MARGIN (a sign test: the one-sided lower confidence bound, level FUTILITY_ALPHA, of
# the median time ratio is above 1.02, i.e. the point's speedup below 1/1.02 = 0.98; at 6 pairs: all 6
# slower by more than 2%). Its speedup is then the median of the pairs taken (< 0.98).
# False stops, pairs independent (each pair's order is drawn afresh): a candidate whose true median ratio
# is 1.02 (speedup 0.98: it could not pass anyway) exceeds 1.02 in a pair with probability 1/2, and some
# look stops it with probability 2.6% over looks at 6, 10, 15, 20 pairs (CPU: 21 pairs at most) and
# 4.0% over looks at 6, 10, ..., 50 (exact: tests/persistent_engine/test_timing_futility.py); fewer looks
# (``ab_interleaved``: block ends 10, 15, ...) stop less. A candidate that could pass (speedup > 1.01:
# median ratio < 0.99) exceeds 1.02 in a pair with probability below 1/2, so its false-stop probability
# is lower still: with the ~1% spread of graph replays a pair 3% above its median has p ~ 0.001 and 6 of
# them ~1e-18; on a busy CPU (10% spread) p ~ 0.38 and at most ~1%.
FUTILITY_MARGIN = 0.02
FUTILITY_MIN_PAIRS = 6
FUTILITY_ALPHA = 1 / 64


# A point whose weight is below MINOR_WEIGHT of the heaviest point's moves the plan's speedup by at most that
# share of its own error: it is timed with at least MINOR_MIN_SAMPLES (a 0.5%-weight CPU prefill of 300 ms
# had cost more bench time than the decode point that decides the verdict).
MINOR_WEIGHT = 0.05
MINOR_MIN_SAMPLES = 5


def samples_for(device_type: str, step_ms: float, cap: int, weight_share: float = 1.0) -> int:
    """Samples per side for a point whose baseline sample takes ``step_ms``, at most ``cap``;
    ``weight_share``: its weight over the heaviest point's."""
    fit = SAMPLE_BUDGET_MS.get(device_type, float("inf")) / max(step_ms, 1e-6)
    floor = MINOR_MIN_SAMPLES if weight_share < MINOR_WEIGHT else MIN_SAMPLES
    return int(max(floor, min(cap, fit * min(1.0, max(weight_share, 0.0) / MINOR_WEIGHT))))


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

    def sample_async(self, run: Callable[[], torch.Tensor], graph: bool = False) -> tuple[Any, torch.Tensor]:
        """Like ``sample`` but the time may be read later, by ``resolve`` (a handle instead of ms)."""
        return self.sample(run, graph=graph)

    def resolve(self, handles: list) -> list[float]:
        """Milliseconds of ``sample_async`` handles, in order."""
        return [float(h) for h in handles]


class CudaTimer(Timer):
    name = "cuda_events"

    def __init__(self, device: torch.device, flush_bytes: int | None = None):
        super().__init__(device)
        n = flush_bytes or flush_size(device)
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

    def sample_async(self, run: Callable[[], torch.Tensor], graph: bool = False) -> tuple[Any, torch.Tensor]:
        """A graph replay between two fresh events with no host sync: consecutive samples queue back to
        back on the stream (flush, event, replay, event), and ``resolve`` synchronizes once. A captured
        graph joins every stream it forked before it ends, so the end event still follows all its
        work. Eager steps keep the synchronous path (their other streams need the device sync)."""
        if not graph:
            return self.sample(run, graph=False)
        start, end = _Event(enable_timing=True), _Event(enable_timing=True)
        _tensor_zero(self._flush)
        _event_record(start)
        out = run()
        _event_record(end)
        return (start, end), out

    def resolve(self, handles: list) -> list[float]:
        if any(isinstance(h, tuple) for h in handles):
            _synchronize(self.device)
        return [_event_elapsed(*h) if isinstance(h, tuple) else float(h) for h in handles]


def flush_size(device: torch.device) -> int:
    """Bytes whose write evicts the caches a step could reuse: twice the GPU's L2 (at least 64 MiB), or
    twice the CPU's largest cache (sysfs; 32 MiB where unknown)."""
    if device.type == "cuda":
        l2 = int(getattr(torch.cuda.get_device_properties(device), "L2_cache_size", 0) or 0)
        return max(2 * l2, 64 << 20)
    largest = 0
    for f in Path("/sys/devices/system/cpu/cpu0/cache").glob("index*/size"):
        text = f.read_text().strip().upper()
        scale = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}.get(text[-1:], 1)
        digits = text.rstrip("KMG")
        largest = max(largest, int(digits) * scale if digits.isdigit() else 0)
    return 2 * (largest or 32 << 20)


def capture_graph(run: Callable[[], torch.Tensor], device: torch.device | None = None, pool=None,
                  warmup: int = 2) -> tuple[torch.cuda.CUDAGraph, torch.Tensor]:
    """(graph, static output) of ``run()`` captured in a CUDA graph. ``warmup`` runs first on a side
    stream, as capture requires (Triton JIT, allocator, lazily sized buffers).

    A capture that raises (a host sync such as ``.item()`` inside ``run``, an op CUDA graphs refuse)
    is abandoned before the exception leaves: capture mode ended, the caller's stream current again
    (``torch.cuda.graph`` skips that when ``capture_end`` itself raises), the half graph freed. Then
    ``recover_after_capture`` says whether the device is usable."""
    prev = torch.cuda.current_stream(device)
    s = torch.cuda.Stream(device)
    s.wait_stream(prev)
    with torch.cuda.stream(s):
        for _ in range(warmup):
            run()
    prev.wait_stream(s)
    g = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(g, pool=pool):
            out = run()
    except BaseException:
        if torch.cuda.is_current_stream_capturing():
            try:
                g.capture_end()
            except Exception:  # noqa: BLE001 - an invalidated capture still leaves capture mode
                pass
        torch.cuda.set_stream(prev)
        try:
            g.reset()
        except Exception:  # noqa: BLE001 - nothing was instantiated
            pass
        raise
    return g, out


def recover_after_capture(device: torch.device) -> bool:
    """After a failed capture: True when the device takes work again. A refused capture leaves a
    non-sticky CUDA error that the next kernel launch check would report, so a tiny kernel runs
    (twice at most: the first may surface that stale error) and the device is synchronized. False:
    a sticky error or a stream still capturing (the process must be replaced)."""
    if torch.cuda.is_current_stream_capturing():
        return False
    for _ in range(2):
        try:
            torch.ones(1, device=device).add_(1)
            _synchronize(device)
            return True
        except Exception:  # noqa: BLE001 - the stale error of the failed capture, once
            continue
    return False


def graph_plan(points: list[WorkloadPoint], device_type: str, enabled: bool,
               batch_sizes: list[int] | None = None) -> list[str | None]:
    """Per point: None to capture it in a CUDA graph, else why it is timed eagerly."""
    if device_type != "cuda":
        return [f"{device_type}: no CUDA graphs"] * len(points)
    if not enabled:
        return ["CUDA graphs off"] * len(points)
    return [None if batch_sizes is None or int(p.batch) in batch_sizes
            else f"batch {p.batch} not in cuda_graph_batch_sizes" for p in points]


def describe_error(e: BaseException, limit: int = 300) -> str:
    """``Type: message``, with the exception it was raised during (capture_end's error hides the
    one that invalidated the capture)."""
    text = f"{type(e).__name__}: {e}"[:limit]
    ctx = e.__context__
    if ctx is not None and ctx is not e:
        text += f" (during {type(ctx).__name__}: {str(ctx)[:limit]})"
    return text


def capture_points(indices: list[int], capture: Callable[[int], list], recover: Callable[[], bool],
                   errors: dict[int, str], log: Callable[[str], None] = lambda line: None
                   ) -> tuple[dict[int, list | None], bool]:
    """``capture(i)`` (every variant of point ``i``) for each index. A point whose capture raises is
    None (timed eagerly), the reason in ``errors[i]``, after ``recover()`` made the device usable;
    once ``recover()`` says it is not, nothing more is captured and ``healthy`` is False.
    Returns ({point: graphs or None}, healthy)."""
    graphs: dict[int, list | None] = {}
    healthy = True
    for i in indices:
        if not healthy:
            graphs[i] = None
            errors[i] = "not captured: an earlier failed capture left the device unusable"
            continue
        try:
            graphs[i] = capture(i)
        except Exception as e:  # noqa: BLE001 - not capturable: this point is timed eagerly
            graphs[i] = None
            errors[i] = describe_error(e)
            healthy = recover()
            log(f"capture of point {i} failed ({errors[i]}); device "
                f"{'usable, timed eagerly' if healthy else 'NOT usable: the engine will be replaced'}")
    return graphs, healthy


def make_timer(device: torch.device) -> Timer:
    return CudaTimer(device) if device.type == "cuda" else Timer(device)


@dataclass
class ABResult:
    baseline: Stats
    candidate: Stats
    # (sample index, variant index, output clone) of candidate samples kept for the spot re-check
    kept: list
    # per pair (baseline ms, candidate ms), when the speedup is the median per-pair ratio (the judge's A/B)
    pairs: list[tuple[float, float]] = field(default_factory=list)
    # why timing ended before ``samples``: "settled" (the ratio known to stop_rel_se), "futility" (slower
    # than 1 + FUTILITY_MARGIN: ``futile``), "" (every sample taken)
    stopped: str = ""

    @property
    def speedup(self) -> float:
        """Median of the per-pair ratios where ``pairs`` are given (the two samples of a pair ran within a
        few ms of each other, so load that drifts over the point's timing cancels in each ratio); else the
        ratio of the two medians."""
        ratios = [x / y for x, y in self.pairs if y > 0]
        if ratios:
            return statistics.median(ratios)
        return self.baseline.median_ms / self.candidate.median_ms if self.candidate.median_ms > 0 else 0.0

    @property
    def speedup_q1(self) -> float | None:
        """Lower quartile of the per-pair ratios (> 1: three pairs in four saw the candidate faster); None
        with fewer than 4 pairs."""
        ratios = [x / y for x, y in self.pairs if y > 0]
        return statistics.quantiles(ratios, n=4, method="inclusive")[0] if len(ratios) >= 4 else None


def ratio_settled(a: list[float], b: list[float], rel_se: float) -> bool:
    """True when the median of the per-pair ratios b/a is known to within ``rel_se`` (standard error of
    the median from the ratios' IQR: 1.2533 * IQR / 1.349 / sqrt(n))."""
    ratios = [y / x for x, y in zip(a, b) if x > 0]
    if len(ratios) < 4:
        return False
    q1, med, q3 = statistics.quantiles(ratios, n=4, method="inclusive")
    return med > 0 and 0.929 * (q3 - q1) / len(ratios) ** 0.5 / med < rel_se


@functools.lru_cache(maxsize=None)
def futility_allowance(n: int, alpha: float = FUTILITY_ALPHA) -> int:
    """The most of n pairs that may be within the margin for a futility stop: the largest c with
    P(Binomial(n, 1/2) <= c) <= alpha, -1 when even c = 0 is too likely (n < 6 at alpha 1/64)."""
    c, tail = -1, 0.0
    while c + 1 <= n:
        tail += math.comb(n, c + 1) / 2 ** n
        if tail > alpha:
            break
        c += 1
    return c


def futile(a: list[float], b: list[float], margin: float = FUTILITY_MARGIN) -> bool:
    """True when candidate times ``b`` against baseline times ``a`` (pairs) show the candidate slower than
    1 + ``margin`` beyond the sign test's doubt (module constants: FUTILITY_*), at FUTILITY_MIN_PAIRS pairs
    or more."""
    ratios = [y / x for x, y in zip(a, b) if x > 0]
    n = len(ratios)
    if n < FUTILITY_MIN_PAIRS:
        return False
    return sum(1 for r in ratios if r <= 1.0 + margin) <= futility_allowance(n)


def futility_look(n: int, check_every: int = STOP_CHECK_EVERY) -> bool:
    """Whether the futility rule is checked after ``n`` pairs of a point timed pair by pair: at
    FUTILITY_MIN_PAIRS, then every ``check_every`` pairs (the looks its false-stop figure counts)."""
    return n == FUTILITY_MIN_PAIRS or (n > FUTILITY_MIN_PAIRS and n % max(check_every, 1) == 0)


def ab_interleaved(timer: Timer, baseline: Callable[[int], torch.Tensor],
                   candidate: Callable[[int], torch.Tensor], samples: int, variants: int = 1,
                   warmup: int = 1, keep: int = 3, graph: bool = False,
                   enter_baseline: Callable[[], None] | None = None,
                   enter_candidate: Callable[[], None] | None = None,
                   stop_rel_se: float | None = None, min_pairs: int = STOP_MIN_PAIRS,
                   check_every: int = STOP_CHECK_EVERY, futility_margin: float | None = None) -> ABResult:
    """Time ``baseline(v)`` and ``candidate(v)`` ABBA-interleaved, at most ``samples`` each.

    ``enter_*`` run before each sample of that side, outside the timed region (the engine switches
    the registry's overrides there on CPU, where the step runs eagerly).
    ``v`` cycles over ``variants`` input variants (fresh inputs per iteration, so caching across
    samples does not pay); the candidate's outputs at ``keep`` evenly spaced samples (always
    including the last one taken) are cloned for the spot re-check, in stream order right after the
    sample that produced them. Samples are read in blocks of ``check_every`` pairs (one host sync per
    block on the GPU); with ``stop_rel_se`` timing stops early once ``ratio_settled`` after at least
    ``min_pairs`` pairs, with ``futility_margin`` once ``futile`` (checked at block ends). A stopped
    comparison re-checks the candidate's last sample. Cost: 2 * (pairs + warmup) runs."""
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
    block = max(1, check_every)
    i = 0
    while i < samples:
        ha: list = []
        hb: list = []
        last = min(i + block, samples) - 1
        pending = None              # the block's last candidate output, re-checked if timing stops here
        for i in range(i, last + 1):
            v = i % variants
            order = (((baseline, enter_a, ha), (candidate, enter_b, hb)) if i % 2 == 0
                     else ((candidate, enter_b, hb), (baseline, enter_a, ha)))
            for fn, enter, acc in order:
                enter()
                h, out = timer.sample_async(lambda: fn(v), graph=graph)
                acc.append(h)
                if fn is candidate and i in keep_at:
                    kept.append((i, v, _tensor_clone(out)))
                elif (fn is candidate and i == last and keep
                      and (stop_rel_se is not None or futility_margin is not None)):
                    pending = (i, v, _tensor_clone(out))
        i = last + 1
        a += timer.resolve(ha)
        b += timer.resolve(hb)
        stopped = ""
        if i < samples and futility_margin is not None and futile(a, b, futility_margin):
            stopped = "futility"
        elif (stop_rel_se is not None and i < samples and len(a) >= min_pairs
                and ratio_settled(a, b, stop_rel_se)):
            stopped = "settled"
        if stopped:
            if pending is not None:
                kept.append(pending)
            return ABResult(Stats.of(a), Stats.of(b), kept, stopped=stopped)
    return ABResult(Stats.of(a), Stats.of(b), kept)


def time_one(timer: Timer, run: Callable[[], torch.Tensor], samples: int, graph: bool = False) -> Stats:
    return Stats.of([timer.sample(run, graph=graph)[0] for _ in range(samples)])


# ---------------------------------------------------------------------------- the benchmarks' fair timer
# FairTimer.time times one variant (a CUDA-graph replay, a compiled call, an eager step) both ways:
#   back to back  ``steps`` calls queued between two marks, divided by ``steps``: a decode loop's steady
#                 state, the headline; the median over ``repeats`` windows.
#   one replay    the caches flushed, then one call between two marks; the median over ``samples``.
# GPU: the marks are CUDA events on the current stream, the device synchronised after each window. A held
# call (a graph replay; a torch.compile reduce-overhead call, which replays its own graphs) is queued while
# a spin kernel holds the stream (``hold_ms``: HOLD_MARGIN x the host time of the window's calls), so the
# window holds the device's work only, whichever side dispatches more from the host; that dispatch (host
# ms of one call, queued on an idle device) is reported beside, and ``queued_ahead`` says whether the host
# finished queueing every window before its hold ran out (False: the host, not the device, paced some
# window). An eager step is timed unheld: its dispatch is part of its cost. Work a call leaves on another
# stream without joining it is not in the window (a captured graph joins the streams it forks).
# CPU: perf_counter_ns around the window; the flush writes twice the largest cache; no dispatch figure.
HOLD_MARGIN = 1.5
HOLD_MIN_MS = 0.05
HOLD_MAX_MS = 250.0
DISPATCH_SAMPLES = 10
_CALIBRATION_CYCLES = 10_000_000            # ~5 ms of spinning at 2 GHz


@functools.lru_cache(maxsize=None)
def _cycles_per_ms(index: int) -> float | None:
    """Clock cycles of ``torch.cuda._sleep`` per ms on device ``index``, from its fastest of 3 timed spins
    (so a hold lasts at least what is asked); None where torch has no spin kernel."""
    sleep = getattr(torch.cuda, "_sleep", None)
    if sleep is None:
        return None
    with torch.cuda.device(index):
        start, end = _Event(enable_timing=True), _Event(enable_timing=True)
        sleep(1000)
        best = float("inf")
        for _ in range(3):
            _event_record(start)
            sleep(_CALIBRATION_CYCLES)
            _event_record(end)
            _synchronize(index)
            best = min(best, _event_elapsed(start, end))
    return _CALIBRATION_CYCLES / best if 0 < best < float("inf") else None


def can_hold(device: torch.device) -> bool:
    """Whether ``hold_stream`` can hold this device's streams (a CUDA device with torch's spin kernel)."""
    return device.type == "cuda" and _cycles_per_ms(_index(device)) is not None


def _index(device: torch.device) -> int:
    return device.index if device.index is not None else torch.cuda.current_device()


def hold_stream(device: torch.device, ms: float) -> bool:
    """Queue a spin kernel of at least ``ms`` on the current stream; False (nothing queued) where none."""
    cpm = _cycles_per_ms(_index(device)) if ms > 0 and device.type == "cuda" else None
    if cpm is None:
        return False
    torch.cuda._sleep(int(ms * cpm))
    return True


def hold_ms(dispatch_ms: list[float], calls: int) -> float:
    """How long to hold the stream while the host queues ``calls`` calls whose dispatch samples (host ms
    per call) are ``dispatch_ms``: HOLD_MARGIN x the calls' expected host time (the slowest sample for one
    call, the mean for several) + HOLD_MIN_MS, at most HOLD_MAX_MS."""
    per_call = max(dispatch_ms) if calls == 1 else statistics.fmean(dispatch_ms)
    return min(HOLD_MAX_MS, HOLD_MARGIN * calls * per_call + HOLD_MIN_MS)


@dataclass(frozen=True)
class FairTiming:
    back_to_back_ms: float                  # median over the windows of (window ms / steps): the headline
    back_to_back_runs_ms: tuple[float, ...]
    one_replay: Stats                       # one call after a cache flush
    dispatch: Stats | None                  # host ms of one call on an idle device (GPU); None on CPU
    steps: int                              # calls per back-to-back window
    held: bool                              # the stream was held while the host queued each window
    queued_ahead: bool | None               # every held window was queued before its hold ran out

    def to_dict(self) -> dict:
        return {"back_to_back_ms": self.back_to_back_ms, "back_to_back_runs_ms": list(self.back_to_back_runs_ms),
                "one_replay_ms": self.one_replay.median_ms, "one_replay_iqr_ms": self.one_replay.iqr_ms,
                "one_replay_samples": self.one_replay.n, "steps": self.steps,
                "dispatch_ms": self.dispatch.median_ms if self.dispatch else None, "held": self.held,
                "queued_ahead": self.queued_ahead}


class FairTimer:
    """The benchmarks' timer (the section's comment): ``time(run, steps, samples, held=...)``."""

    def __init__(self, device: torch.device, flush_bytes: int | None = None):
        self.device = device
        self.cuda = device.type == "cuda"
        self._flush = torch.empty((flush_bytes or flush_size(device)) // 4, dtype=torch.int32, device=device)

    def flush(self) -> None:
        _tensor_zero(self._flush)

    def dispatch_samples(self, run: Callable[[], Any], samples: int) -> list[float]:
        """Host ms of ``samples`` calls, each queued on an idle device (synchronised before it)."""
        out = []
        for _ in range(samples):
            _synchronize(self.device)
            t0 = _perf_counter_ns()
            run()
            out.append((_perf_counter_ns() - t0) / 1e6)
        _synchronize(self.device)
        return out

    def window(self, run: Callable[[], Any], calls: int, flush: bool, hold: float = 0.0) -> tuple[float, bool | None]:
        """(ms per call of ``calls`` calls queued back to back, after a cache flush when ``flush``; whether
        the host queued them before a hold of ``hold`` ms ran out, None when not held)."""
        if flush:
            self.flush()
        if not self.cuda:
            t0 = _perf_counter_ns()
            for _ in range(calls):
                run()
            return (_perf_counter_ns() - t0) / 1e6 / calls, None
        start, end = _Event(enable_timing=True), _Event(enable_timing=True)
        t0 = _perf_counter_ns()
        held = hold_stream(self.device, hold)
        _event_record(start)
        for _ in range(calls):
            run()
        _event_record(end)
        queued = (_perf_counter_ns() - t0) / 1e6 < hold if held else None
        _synchronize(self.device)
        return _event_elapsed(start, end) / calls, queued

    def time(self, run: Callable[[], Any], steps: int, samples: int, repeats: int = 3, held: bool = True,
             warmup: int = 2) -> FairTiming:
        """``run`` timed both ways. Cost: warmup + DISPATCH_SAMPLES (GPU) + repeats x steps + samples calls."""
        for _ in range(warmup):
            run()
        dispatch = self.dispatch_samples(run, DISPATCH_SAMPLES) if self.cuda else None
        held = bool(held and dispatch) and can_hold(self.device)
        many, one = (hold_ms(dispatch, steps), hold_ms(dispatch, 1)) if held else (0.0, 0.0)
        runs, queued = [], []
        for _ in range(repeats):
            ms, q = self.window(run, steps, flush=False, hold=many)
            runs.append(ms)
            queued.append(q)
        singles = []
        for _ in range(samples):
            ms, q = self.window(run, 1, flush=True, hold=one)
            singles.append(ms)
            queued.append(q)
        return FairTiming(statistics.median(runs), tuple(runs), Stats.of(singles),
                          Stats.of(dispatch) if dispatch else None, steps, held,
                          all(q is True for q in queued) if held else None)


def now_ns() -> int:
    """The engine's own wall clock (bound before candidates load)."""
    return _perf_counter_ns()
