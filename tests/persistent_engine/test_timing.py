"""Engine timing: medians/IQR, ABBA interleaving, kept outputs, and clocks a candidate cannot patch."""

import time

import pytest
import torch

from persistent_engine.measure import timing


def _busy(ms: float) -> torch.Tensor:
    end = time.monotonic() + ms / 1e3
    while time.monotonic() < end:
        pass
    return torch.ones(2)


def test_stats_median_and_iqr():
    s = timing.Stats.of([1.0, 2.0, 3.0, 4.0, 100.0])
    assert s.median_ms == 3.0 and s.n == 5
    assert s.iqr_ms == pytest.approx(2.0)
    assert timing.Stats.of([5.0]).iqr_ms == 0.0


def test_ab_interleaved_orders_abba_and_keeps_candidate_outputs():
    calls = []
    base = lambda v: (calls.append(("A", v)), torch.full((2,), float(v)))[1]       # noqa: E731
    cand = lambda v: (calls.append(("B", v)), torch.full((2,), 10.0 + v))[1]       # noqa: E731
    res = timing.ab_interleaved(timing.Timer(torch.device("cpu")), base, cand, samples=6, variants=3,
                                warmup=0, keep=2)
    assert [c[0] for c in calls] == list("ABBAABBAABBA")
    assert [c[1] for c in calls][::2] == [0, 1, 2, 0, 1, 2]
    assert res.baseline.n == res.candidate.n == 6
    kept = {(i, v) for i, v, _ in res.kept}
    assert (5, 2) in kept and len(kept) == 2
    for _, v, out in res.kept:
        assert torch.equal(out, torch.full((2,), 10.0 + v))


def test_enter_hooks_run_outside_each_sample():
    state = []
    res = timing.ab_interleaved(timing.Timer(torch.device("cpu")), lambda v: torch.zeros(1),
                                lambda v: torch.zeros(1), samples=4, warmup=1,
                                enter_baseline=lambda: state.append("a"), enter_candidate=lambda: state.append("b"))
    assert state == ["a", "b", "a", "b", "b", "a", "a", "b", "b", "a"]
    assert res.speedup > 0


def test_a_slow_candidate_that_patches_the_clocks_still_measures_slow():
    originals = (time.perf_counter_ns, time.perf_counter, torch.cuda.Event.elapsed_time)
    fake = [0]

    def fake_ns():
        fake[0] += 1
        return fake[0]

    def cheating_candidate(v):
        time.perf_counter_ns = fake_ns
        time.perf_counter = lambda: fake_ns() / 1e9
        torch.cuda.Event.elapsed_time = lambda self, end: 1e-6
        return _busy(20.0)

    try:
        res = timing.ab_interleaved(timing.Timer(torch.device("cpu")), lambda v: _busy(1.0),
                                    cheating_candidate, samples=5, warmup=1)
        assert time.perf_counter_ns is fake_ns          # the patch really happened
    finally:
        time.perf_counter_ns, time.perf_counter, torch.cuda.Event.elapsed_time = originals
    assert res.candidate.median_ms >= 19.9          # a patched clock would have recorded ~0.001 ms
    assert res.speedup < 1.0


@pytest.mark.gpu
def test_cuda_timer_ignores_a_patched_elapsed_time():
    dev = torch.device("cuda")
    timer = timing.make_timer(dev)
    x = torch.randn(4096, 4096, device=dev)
    original = torch.cuda.Event.elapsed_time
    try:
        torch.cuda.Event.elapsed_time = lambda self, end: 1e-6
        stats = timing.time_one(timer, lambda: x @ x, 5)
    finally:
        torch.cuda.Event.elapsed_time = original
    assert stats.median_ms > 0.05


class ScriptedTimer(timing.Timer):
    """A timer whose samples follow a script (ms per call), handed out as deferred handles, to test
    the sequential stop without a clock: ``resolve`` is called once per block."""

    def __init__(self, script):
        super().__init__(torch.device("cpu"))
        self.script, self.resolves = iter(script), 0

    def sample_async(self, run, graph=False):
        return ("h", next(self.script)), run()

    def resolve(self, handles):
        self.resolves += 1
        return [h[1] for h in handles]


def _steady(n, a_ms=1.0, b_ms=0.8, jitter=0.002):
    out = []
    for i in range(n):            # ABBA order: pair i samples (A, B) when i is even, (B, A) when odd
        a, b = a_ms * (1 + jitter * ((i * 7) % 5 - 2)), b_ms * (1 + jitter * ((i * 3) % 5 - 2))
        out += [a, b] if i % 2 == 0 else [b, a]
    return out


def test_sequential_stop_ends_a_settled_comparison_early_and_rechecks_its_last_sample():
    timer = ScriptedTimer(_steady(50))
    outs = []
    cand = lambda v: (outs.append(v), torch.full((2,), 10.0 + v))[1]          # noqa: E731
    res = timing.ab_interleaved(timer, lambda v: torch.zeros(2), cand, samples=50, variants=2, warmup=0,
                                keep=3, stop_rel_se=0.003, min_pairs=20, check_every=5)
    assert res.candidate.n == res.baseline.n == 20                 # settled at the first check allowed
    assert timer.resolves == 2 * 4                                 # one read per side per block of 5
    assert res.speedup == pytest.approx(1.25, rel=0.01)
    assert (19, 1) in {(i, v) for i, v, _ in res.kept}             # the last timed sample is re-checked
    assert all(torch.equal(o, torch.full((2,), 10.0 + v)) for _, v, o in res.kept)


def test_sequential_stop_keeps_sampling_a_noisy_comparison():
    import random
    rng = random.Random(0)
    script = [rng.uniform(0.5, 1.5) for _ in range(100)]
    res = timing.ab_interleaved(ScriptedTimer(script), lambda v: torch.zeros(1), lambda v: torch.zeros(1),
                                samples=50, warmup=0, stop_rel_se=0.003, min_pairs=20)
    assert res.candidate.n == 50
    assert not timing.ratio_settled([1.0] * 3, [1.0] * 3, 0.5)            # too few pairs to judge
    assert timing.ratio_settled([1.0, 1.01, 0.99, 1.0, 1.0], [0.8] * 5, 0.01)


@pytest.mark.gpu
def test_cuda_deferred_samples_of_graph_replays_match_synchronous_ones():
    """Graph replays timed with queued events (one sync per block) measure what one-sync-per-sample
    timing measures, and a 4x longer graph measures ~4x longer."""
    dev = torch.device("cuda")
    timer = timing.make_timer(dev)
    x = torch.randn(2048, 2048, device=dev)

    def graphed(n):
        return timing.capture_graph(lambda: [x @ x for _ in range(n)][-1], dev)

    (g1, o1), (g4, o4) = graphed(1), graphed(4)
    short = lambda: (g1.replay(), o1)[1]            # noqa: E731 - Timer.sample runs a zero-argument step
    sync = timing.Stats.of([timer.sample(short, graph=True)[0] for _ in range(20)]).median_ms
    handles = [timer.sample_async(short, graph=True)[0] for _ in range(20)]
    deferred = timing.Stats.of(timer.resolve(handles)).median_ms
    assert deferred == pytest.approx(sync, rel=0.25)
    # ab_interleaved passes each side the variant index
    res = timing.ab_interleaved(timer, lambda v: (g4.replay(), o4)[1], lambda v: short(), samples=40, graph=True,
                                stop_rel_se=0.003)
    assert 3.0 < res.speedup < 5.0 and res.candidate.n <= 40


def test_speedup_q1_is_the_lower_quartile_of_the_pair_ratios():
    from persistent_engine.measure.timing import ABResult, Stats
    stats = Stats.of([1.0, 1.0])
    res = ABResult(baseline=stats, candidate=stats, kept=[],
                   pairs=[(2.0, 1.0), (1.0, 1.0), (3.0, 1.0), (1.5, 1.0), (1.2, 1.0)])
    assert res.speedup == 1.5 and res.speedup_q1 == 1.2
    assert ABResult(baseline=stats, candidate=stats, kept=[], pairs=[(2.0, 1.0)]).speedup_q1 is None


class ColdAfterFlush:
    """A step that costs ``cold_ms`` on its first call after a cache flush and ``warm_ms`` otherwise, on a fake
    clock (the timer's perf_counter_ns, patched) so the figures are exact; counts its calls and the flushes
    (a FairTimer on CPU, its flush spied on)."""

    def __init__(self, timer: timing.FairTimer, monkeypatch, cold_ms: float, warm_ms: float):
        self.cold, self.calls, self.flushes, self.now_ns = False, 0, 0, 0
        self.cold_ms, self.warm_ms = cold_ms, warm_ms
        monkeypatch.setattr(timing, "_perf_counter_ns", lambda: self.now_ns)
        real = timer.flush

        def flush():
            real()
            self.flushes += 1
            self.cold = True
        timer.flush = flush

    def __call__(self) -> torch.Tensor:
        self.calls += 1
        ms, self.cold = (self.cold_ms if self.cold else self.warm_ms), False
        self.now_ns += int(ms * 1e6)
        return torch.ones(2)


def test_fair_timer_back_to_back_amortises_what_one_replay_pays_after_each_flush(monkeypatch):
    """The two modes of the benchmarks' timer on CPU: back to back (no flush inside a window, divided by the
    window's calls) sees the warm cost, one replay (a flush before every sample) the cold one; no dispatch
    figure and no hold on CPU; every call accounted for."""
    timer = timing.FairTimer(torch.device("cpu"), flush_bytes=1 << 16)
    step = ColdAfterFlush(timer, monkeypatch, cold_ms=4.0, warm_ms=0.5)
    t = timer.time(step, steps=8, samples=5, repeats=3, warmup=2)
    assert step.calls == 2 + 3 * 8 + 5 and step.flushes == 5
    assert t.steps == 8 and t.back_to_back_runs_ms == (0.5, 0.5, 0.5) and t.one_replay.n == 5
    assert t.back_to_back_ms == 0.5 and t.one_replay.median_ms == 4.0 and t.one_replay.iqr_ms == 0.0
    assert t.dispatch is None and not t.held and t.queued_ahead is None
    d = t.to_dict()
    assert d["back_to_back_ms"] == 0.5 and d["one_replay_ms"] == 4.0 and d["back_to_back_runs_ms"] == [0.5] * 3
    assert d["dispatch_ms"] is None and d["one_replay_samples"] == 5 and d["steps"] == 8


def test_a_window_is_divided_by_its_calls_and_the_median_of_windows_is_the_headline(monkeypatch):
    timer = timing.FairTimer(torch.device("cpu"), flush_bytes=1 << 16)
    step = ColdAfterFlush(timer, monkeypatch, cold_ms=3.0, warm_ms=1.0)
    assert timer.window(step, calls=4, flush=False) == (1.0, None)
    assert timer.window(step, calls=4, flush=True) == (1.5, None)       # (3 + 1 + 1 + 1) / 4: one cold call
    costs = iter([1.0] * 4 + [9.0] * 4 + [2.0] * 4)                     # three windows of 4 calls

    def uneven():
        step.now_ns += int(next(costs, 1.0) * 1e6)
    t = timer.time(uneven, steps=4, samples=1, repeats=3, warmup=0)
    assert t.back_to_back_runs_ms == (1.0, 9.0, 2.0) and t.back_to_back_ms == 2.0


def test_the_hold_covers_the_host_time_of_the_window_it_holds():
    d = [0.1, 0.3, 0.2]
    assert timing.hold_ms(d, 1) == pytest.approx(timing.HOLD_MARGIN * 0.3 + timing.HOLD_MIN_MS)     # slowest
    assert timing.hold_ms(d, 100) == pytest.approx(timing.HOLD_MARGIN * 100 * 0.2 + timing.HOLD_MIN_MS)
    assert timing.hold_ms([20.0], 100) == timing.HOLD_MAX_MS
    assert not timing.can_hold(torch.device("cpu")) and not timing.hold_stream(torch.device("cpu"), 5.0)


@pytest.mark.gpu
def test_held_graph_replays_keep_host_dispatch_out_of_the_window():
    """A graph replay behind 2 ms of host work per call: held, both timings are the device's (well under the
    host's 2 ms, which ``dispatch`` reports) and the host queued ahead; unheld, the host paces the loop."""
    dev = torch.device("cuda")
    x = torch.randn(1024, 1024, device=dev)
    g, out = timing.capture_graph(lambda: [x @ x for _ in range(4)][-1], dev)       # ~0.1-0.3 ms of device work
    timer = timing.FairTimer(dev)
    plain = timer.time(lambda: (g.replay(), out)[1], steps=20, samples=10)

    def slow_host():
        end = time.perf_counter() + 2e-3
        while time.perf_counter() < end:
            pass
        g.replay()
        return out
    held = timer.time(slow_host, steps=20, samples=10, held=True)
    unheld = timer.time(slow_host, steps=20, samples=10, held=False)
    assert held.held and held.queued_ahead and held.dispatch.median_ms >= 2.0
    assert plain.back_to_back_ms < 1.0
    assert held.back_to_back_ms == pytest.approx(plain.back_to_back_ms, rel=0.2)
    assert held.one_replay.median_ms == pytest.approx(plain.one_replay.median_ms, rel=0.3)
    assert not unheld.held and unheld.queued_ahead is None and unheld.back_to_back_ms >= 1.9
