"""Issue 38 on the GPU: the judge's output ring is an exported driver allocation the executors write into.
A candidate that swaps its executor's handler of timed runs (``candidates/forges_the_loop.py``) is caught in
the judge's own copy (zeros while timed: the spot re-check; a reply before the work: NaN), and one that skips
the device synchronize before its replies is timed with its queued work in the window (exact: not faster
than 1.3x) or caught. Skipped without a GPU; run on the lent one:

    python3 -m pytest tests/persistent_engine/test_judge_ring_cuda.py -q
"""

import pathlib

import pytest
import torch

from persistent_engine.supervisor import Supervisor

pytestmark = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU (the ring is device memory)")
HERE = pathlib.Path(__file__).parent / "candidates"


def forged(mode: str) -> str:
    return (HERE / "forges_the_loop.py").read_text().replace('MODE = "wrong"', f'MODE = "{mode}"')


@pytest.fixture(scope="module")
def sup():
    s = Supervisor("tiny-dense", device="cuda", start_timeout_s=600)
    s.start()
    honest = s.evaluate((HERE / "good_torch.py").read_text(), timeout_s=300, samples=8)
    assert honest.correct, honest.reasons
    yield s
    s.close()


@pytest.mark.parametrize("mode, reason", [("wrong", "spot re-check"), ("lazy", "timed run(s)")])
def test_a_forged_timed_run_is_caught_on_the_gpu(sup, mode, reason):
    v = sup.evaluate(forged(mode), timeout_s=300, samples=8)
    assert not v.correct, (v.reasons, v.speedup)
    assert any(reason in r for r in v.reasons), v.reasons


def test_skipping_the_synchronize_before_the_reply_buys_no_speedup(sup):
    v = sup.evaluate(forged("nosync"), timeout_s=300, samples=8)
    assert (not v.correct) or (v.speedup is not None and v.speedup < 1.3), (v.reasons, v.speedup)


def test_changing_the_shared_weights_while_timed_is_caught(sup):
    """The weights are the judge's own allocation, mapped writable by every executor: a candidate that
    doubles one at its first timed run is caught by the fingerprint after the spot re-checks (or by the
    re-check itself), and the next candidate is judged on the judge's weights again."""
    v = sup.evaluate(forged("weights"), timeout_s=300, samples=8)
    assert not v.correct, (v.reasons, v.speedup)
    assert any("weights" in r or "spot re-check" in r for r in v.reasons), v.reasons
    nxt = sup.evaluate((HERE / "good_torch.py").read_text(), timeout_s=300, samples=8)
    assert nxt.correct, nxt.reasons
