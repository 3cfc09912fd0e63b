"""Engine timing: medians/IQR, ABBA interleaving, kept outputs, and clocks a candidate cannot patch."""

import time

import pytest
import torch

from persistent_engine import timing


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
