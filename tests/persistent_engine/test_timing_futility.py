"""The futility stop of the A/B (``timing.futile``): a sign test that ends a clear loser's timing after 6
pairs; its false-stop probability is what timing.py states; a winner or a near-tie is never cut."""

from math import comb

import pytest
import torch

from persistent_engine.measure import timing


def false_stop_probability(looks: list[int], p_close: float = 0.5) -> float:
    """Exact probability that some look in ``looks`` stops a point whose pairs are each within the margin
    (candidate/baseline <= 1 + margin) with probability ``p_close``, independently: a walk over the
    number of close pairs, the stopped paths taken out at each look."""
    dist, n, stopped = {0: 1.0}, 0, 0.0
    for look in looks:
        while n < look:
            nxt: dict[int, float] = {}
            for c, pr in dist.items():
                nxt[c] = nxt.get(c, 0.0) + pr * (1 - p_close)
                nxt[c + 1] = nxt.get(c + 1, 0.0) + pr * p_close
            dist, n = nxt, n + 1
        allow = timing.futility_allowance(look)
        stopped += sum(pr for c, pr in dist.items() if c <= allow)
        dist = {c: pr for c, pr in dist.items() if c > allow}
    return stopped


def test_the_allowance_is_the_binomial_tail_at_alpha():
    assert [timing.futility_allowance(n) for n in (5, 6, 10, 15, 20)] == [-1, 0, 1, 2, 4]
    for n in range(6, 51):
        c = timing.futility_allowance(n)
        tail = lambda c: sum(comb(n, j) for j in range(c + 1)) / 2 ** n        # noqa: E731
        assert tail(c) <= timing.FUTILITY_ALPHA < tail(c + 1)


def test_false_stop_probability_is_the_stated_one():
    judge_cpu = [n for n in range(1, 22) if timing.futility_look(n)]
    judge_gpu = [n for n in range(1, 51) if timing.futility_look(n)]
    assert judge_cpu == [6, 10, 15, 20]
    assert false_stop_probability(judge_cpu) == pytest.approx(0.026, abs=0.0005)     # timing.py's comment
    assert false_stop_probability(judge_gpu) == pytest.approx(0.040, abs=0.0005)
    in_blocks = list(range(10, 51, 5))                                # ab_interleaved's block ends
    assert false_stop_probability(in_blocks) < false_stop_probability(judge_gpu)
    # a candidate that could pass exceeds the margin in a pair less often: a 10%-spread CPU, p ~ 0.38
    assert false_stop_probability(judge_gpu, p_close=0.62) < 0.01
    # a clear loser (9 pairs in 10 slower than 1.02) is stopped almost always, most at 6 pairs
    assert false_stop_probability(judge_gpu, p_close=0.1) > 0.99
    assert false_stop_probability([6], p_close=0.1) > 0.5


def test_futile_needs_six_pairs_slower_beyond_the_margin():
    base = [1.0] * 10
    assert not timing.futile(base[:5], [1.1] * 5)                       # too few pairs
    assert timing.futile(base[:6], [1.03] * 6)
    assert not timing.futile(base[:6], [1.03] * 5 + [1.01])             # one pair within the margin
    assert timing.futile(base, [1.03] * 9 + [1.01])                     # 1 of 10 allowed
    assert not timing.futile(base, [1.03] * 8 + [1.01, 0.9])
    assert not timing.futile(base[:6], [1.01] * 6)                      # slower, but within the margin
    assert not timing.futile(base[:6], [0.8] * 6)                       # a winner
    assert timing.futile(base[:6], [1.01] * 6, margin=0.005)


class ScriptedTimer(timing.Timer):
    """Samples from a script (ms per call, in call order), handed out as deferred handles."""

    def __init__(self, script):
        super().__init__(torch.device("cpu"))
        self.script = iter(script)

    def sample_async(self, run, graph=False):
        return ("h", next(self.script)), run()

    def resolve(self, handles):
        return [h[1] for h in handles]


def _abba(n, a_ms, b_ms, jitter=0.002):
    out = []
    for i in range(n):
        a, b = a_ms * (1 + jitter * ((i * 7) % 5 - 2)), b_ms * (1 + jitter * ((i * 3) % 5 - 2))
        out += [a, b] if i % 2 == 0 else [b, a]
    return out


def test_ab_interleaved_stops_a_loser_at_its_first_block_end_and_rechecks_the_last_sample():
    cand = lambda v: torch.full((2,), 10.0 + v)                          # noqa: E731
    res = timing.ab_interleaved(ScriptedTimer(_abba(50, 1.0, 1.25)), lambda v: torch.zeros(2), cand,
                                samples=50, variants=2, warmup=0, keep=3, stop_rel_se=0.003,
                                futility_margin=timing.FUTILITY_MARGIN)
    assert res.stopped == "futility" and res.candidate.n == res.baseline.n == 10
    assert res.speedup == pytest.approx(0.8, rel=0.01)
    assert (9, 1) in {(i, v) for i, v, _ in res.kept}
    # without the rule the same loser is timed until the ratio settles
    res = timing.ab_interleaved(ScriptedTimer(_abba(50, 1.0, 1.25)), lambda v: torch.zeros(2), cand,
                                samples=50, variants=2, warmup=0, keep=3, stop_rel_se=0.003)
    assert res.stopped == "settled" and res.candidate.n == 20


def test_ab_interleaved_never_cuts_a_winner_or_a_near_tie():
    for b_ms in (0.8, 0.99, 1.015):
        res = timing.ab_interleaved(ScriptedTimer(_abba(50, 1.0, b_ms)), lambda v: torch.zeros(1),
                                    lambda v: torch.zeros(1), samples=50, warmup=0, stop_rel_se=0.003,
                                    futility_margin=timing.FUTILITY_MARGIN)
        assert res.stopped != "futility" and res.candidate.n >= timing.STOP_MIN_PAIRS, b_ms
