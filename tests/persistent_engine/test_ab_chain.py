"""The judge's A/B protocol (``judge/ab.py``) against fake executors whose "step" is a fixed function of
the token ids: k is chosen so a sample lasts the target; the k runs of a sample are chained (run r's ids
depend on run r-1's output), so an executor that batches them (ids fixed up front) is caught by the
fetched link, while an honest one passes; a lying link is caught by the argmax band."""

import random

import pytest
import torch

from persistent_engine.judge import ab

V, T = 97, 3                                    # vocabulary, tokens per step (decode batch 3)
TABLE = torch.randn(V, V, generator=torch.Generator().manual_seed(1))


def step(ids):                                  # "logits" [T, V] of one step on ids [T]
    return TABLE[ids]


class FakeExecutor:
    """Answers ``run`` and ``fetch`` like worker.Worker; ``batches``: computes every run from the bare
    draws up front (what one batched forward of k runs would need) instead of the chain."""

    def __init__(self, batches: bool = False, lies: bool = False):
        self.batches, self.lies, self.ring = batches, lies, []

    def call(self, msg, timeout):
        if msg["op"] == "run":
            ids, chain, self.ring = msg["ids"], msg["chain"], []
            for r in range(msg["k"]):
                x = ids[r] if ids is not None else torch.zeros(T, dtype=torch.long)
                if chain is not None and r > 0 and not self.batches:
                    x = torch.remainder(x + torch.argmax(self.ring[-1][0]), chain)
                self.ring.append(step(x))
            return {"k": len(self.ring)}
        j = msg["j"]
        reply = {"logits": self.ring[j][msg["rows"]]}
        if msg["links"]:
            prev = [None if j - d < 0 else self.ring[j - d][0].clone() for d in (1, 2)]
            if self.lies and prev[0] is not None:   # claims the chain value 0 it used: argmax forced to 0
                prev[0][0] = prev[0].max() + 0.01
            reply["row0_prev"], reply["row0_prev2"] = prev
        return reply

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
                        rows=T, vocab=V)


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
