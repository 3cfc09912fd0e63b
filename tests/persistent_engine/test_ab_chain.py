"""The judge's A/B protocol (``judge/ab.py``) against fake executors whose "step" is a fixed function of
the token ids: k is chosen so a sample lasts the target; the k runs of a sample are chained (run r's ids
depend on run r-1's output), so an executor that batches them (ids fixed up front) is caught by the
kept link, while an honest one passes; a lying link is caught by the argmax band; outputs live in the
judge's ring, so a reply sent before the runs wrote them is rejected at the reply."""

import random

import pytest
import torch

from persistent_engine.measure import timing
from persistent_engine.executor import wire
from persistent_engine.executor.out_ring import OutRing, ring_bytes
from persistent_engine.judge import ab
from persistent_engine.judge.types import CandidateRaised

V, T = 97, 3                                    # vocabulary, tokens per step (decode batch 3)
TABLE = torch.randn(V, V, generator=torch.Generator().manual_seed(1))
LIKE = torch.empty(T, V)                        # one run's output as the judge's reference holds it


def step(ids):                                  # "logits" [T, V] of one step on ids [T]
    return TABLE[ids]


class FakeExecutor:
    """Answers ``run`` like worker.Worker: run r's output into slot r of the judge's ring. ``batches``:
    computes every run from the bare draws up front (what one batched forward of k runs would need) instead
    of the chain; ``lies``: and doctors each run's row 0 so that its argmax is the chain value 0 it used;
    ``defers``: replies before writing (the work done "later"); ``rows_written``: writes only these rows."""

    def __init__(self, batches: bool = False, lies: bool = False, defers: bool = False, rows_written=None):
        self.batches, self.lies, self.defers, self.rows_written = batches, lies, defers, rows_written
        self.out = OutRing.create(ring_bytes("cpu", T * V * 4), "cpu")

    def call(self, msg, timeout):
        assert isinstance(msg, wire.TimedRun)
        ring = self.out.runs(msg.k, msg.shape, getattr(torch, msg.dtype))
        if self.defers:
            return wire.Ran(k=msg.k)
        ids, chain = msg.ids, msg.chain
        for r in range(msg.k):
            x = ids[r] if ids is not None else torch.zeros(T, dtype=torch.long)
            if chain is not None and r > 0 and not self.batches:
                x = torch.remainder(x + torch.argmax(ring[r - 1][0]), chain)
            out = step(x).clone()
            if self.lies:
                out[0][0] = out[0].max() + 0.01
            rows = self.rows_written if self.rows_written is not None else list(range(T))
            ring[r][rows] = out[rows]
        return wire.Ran(k=msg.k)

    def members(self):
        return []

    def stop(self):
        pass

    def cont(self):
        pass


def judge_catches(kept) -> bool:
    """The judge's spot re-check (``checks.spot_check``) with ``step`` as the reference."""
    for f in kept:
        if f.link is not None:
            ids_prev, row0 = f.link
            ref0 = step(ids_prev)[:1]
            if not torch.allclose(row0.reshape(ref0.shape), ref0, atol=0.05) or ab.chain_argmax_reason(
                    row0, ref0, "t"):
                return True
        if not torch.equal(f.out, step(f.ids)[f.rows]):
            return True
    return False


def run_ab(cand, k=8, samples=12, seed=0):
    gen = torch.Generator().manual_seed(seed)
    fresh = lambda n: torch.randint(0, V, (n, T), generator=gen)      # noqa: E731
    return ab.ab_remote(FakeExecutor(), cand, 0, 1, samples, k, False, fresh, random.Random(seed), 1e12,
                        LIKE, vocab=V)


def test_k_amortises_the_request_to_the_target():
    assert ab.run_batch("cpu", 2.0) == 3 and ab.run_batch("cuda", 0.05) == 40
    assert ab.run_batch("cpu", 100.0) == 1 and ab.run_batch("cpu", None) == 1
    assert ab.run_batch("cuda", 0.001) == ab.MAX_RUNS
    assert ab.run_batch("cuda", 0.05, out_bytes=ab.RING_BYTES["cuda"] // 3) == 3    # the ring bounds k


def test_an_honest_chained_executor_passes_and_is_paired():
    res = run_ab(FakeExecutor())
    assert res.kept and not judge_catches(res.kept)
    assert any(f.link is not None for f in res.kept)     # some fetched run past run 0 carried its link
    assert len(res.pairs) == 12 and res.speedup > 0


@pytest.mark.parametrize("seed", range(3))
def test_batching_the_runs_is_caught(seed):
    res = run_ab(FakeExecutor(batches=True), seed=seed)
    assert judge_catches(res.kept)


def test_a_lying_link_is_caught_by_the_argmax_band():
    res = run_ab(FakeExecutor(batches=True, lies=True), samples=20)
    assert judge_catches(res.kept)


def test_a_reply_before_the_work_is_done_is_rejected_at_the_reply():
    with pytest.raises(CandidateRaised, match="had not written their output"):
        run_ab(FakeExecutor(defers=True))


def test_a_run_that_writes_row_0_only_is_rejected_at_the_reply():
    with pytest.raises(CandidateRaised, match="had not written their output"):
        run_ab(FakeExecutor(rows_written=[0]))


def test_the_ring_is_sealed_and_refuses_more_runs_than_it_holds():
    ring = OutRing.create(ring_bytes("cpu", T * V * 4), "cpu")
    holds = ring.flat.numel() // (T * V * 4)
    assert ring.sealed() and ab.MAX_RUNS <= holds <= ab.MAX_RUNS + 4096 // (T * V * 4) + 1   # whole pages
    with pytest.raises(ValueError, match="output ring has"):
        ring.runs(holds + 1, (T, V), torch.float32)
    ring.arm(3, (T, V), torch.float32)
    assert bool(ring.runs(3, (T, V), torch.float32).isnan().all())
    ring.close()


def test_the_argmax_band_excuses_a_near_tie_only():
    ref = torch.randn(4096, generator=torch.Generator().manual_seed(2))
    top = int(torch.argmax(ref))
    second = int(torch.topk(ref, 2).indices[1])
    ref[second] = ref[top] - 1e-3                        # a near-tie of the reference's top two
    close = ref + 1e-3 * torch.randn(4096, generator=torch.Generator().manual_seed(3))
    close[second] = close[top] + 1e-4                    # a correct kernel's rounding flipped it
    assert ab.chain_argmax_reason(close, ref, "t") is None
    far = ref.clone()
    low = int(torch.argmin(ref))
    far[low] = ref[top] + 0.1                             # a made-up chain value forced to the maximum
    assert "chain of timed runs is broken" in ab.chain_argmax_reason(far, ref, "t")
    assert ab.chain_argmax_reason(ref, ref, "t") is None


class Clock:
    """The judge's clock in these tests: advanced by the timed executors, read by ``ab`` (``now_ns``)."""

    def __init__(self):
        self.ns = 0

    def now(self):
        return self.ns


class TimedExecutor(FakeExecutor):
    """A chained executor whose runs take ``ms`` each (times a small deterministic jitter per request) on
    ``clock``; records the ops it was asked for."""

    def __init__(self, clock, ms, jitter=0.002):
        super().__init__()
        self.clock, self.ms, self.jitter, self.requests, self.ops = clock, ms, jitter, 0, []

    def call(self, msg, timeout):
        self.ops.append(msg.KIND)
        if isinstance(msg, wire.TimedRun):
            self.requests += 1
            wobble = 1 + self.jitter * ((self.requests * 7) % 5 - 2)
            self.clock.ns += int(self.ms * wobble * msg.k * 1e6)
        return super().call(msg, timeout)


def timed_ab(monkeypatch, cand_ms, seed=0, samples=50, futility=True):
    clock = Clock()
    monkeypatch.setattr(ab, "now_ns", clock.now)
    base, cand = TimedExecutor(clock, 1.0), TimedExecutor(clock, cand_ms)
    gen = torch.Generator().manual_seed(seed)
    fresh = lambda n: torch.randint(0, V, (n, T), generator=gen)      # noqa: E731
    res = ab.ab_remote(base, cand, 0, 1, samples, 4, False, fresh, random.Random(seed), 1e12, LIKE,
                       stop_rel_se=0.003, vocab=V,
                       futility_margin=timing.FUTILITY_MARGIN if futility else None)
    return res, cand


@pytest.mark.parametrize("seed", range(4))
def test_a_clear_loser_stops_after_six_pairs_with_its_first_and_last_pair_rechecked(monkeypatch, seed):
    res, cand = timed_ab(monkeypatch, 1.1, seed=seed)
    assert res.stopped == "futility" and len(res.pairs) == timing.FUTILITY_MIN_PAIRS
    assert res.speedup == pytest.approx(1 / 1.1, rel=0.01) and res.speedup_q1 is not None
    assert res.candidate.n == res.baseline.n == 6 and res.candidate.median_ms > res.baseline.median_ms
    assert {0, 5} <= {f.pair for f in res.kept}                 # the pair it stopped on is re-checked
    assert not judge_catches(res.kept)                          # deferred fetches still carry their chain
    assert cand.ops == ["run"] * (6 + 1)                        # one warm-up run request, six timed: no fetch


def test_without_the_rule_a_loser_is_timed_until_it_settles(monkeypatch):
    res, _ = timed_ab(monkeypatch, 1.1, futility=False)
    assert res.stopped == "settled" and len(res.pairs) == timing.STOP_MIN_PAIRS
    assert len(res.pairs) - 1 in {f.pair for f in res.kept}


@pytest.mark.parametrize("cand_ms", [0.8, 0.99, 1.0, 1.015])
def test_a_winner_or_a_near_tie_gets_the_full_sequential_measurement(monkeypatch, cand_ms):
    res, _ = timed_ab(monkeypatch, cand_ms)
    assert res.stopped != "futility" and len(res.pairs) >= timing.STOP_MIN_PAIRS
    assert res.speedup == pytest.approx(1 / cand_ms, rel=0.01)
    assert len(res.pairs) - 1 in {f.pair for f in res.kept}
