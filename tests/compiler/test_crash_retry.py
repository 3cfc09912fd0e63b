"""A crash verdict is retried on a fresh engine only when the judge process itself died (``crash: engine
died``: an OOM killer, an operator); a crash of the candidate's own executor, a hang or a protocol failure
is the candidate's doing and is not retried (each retry costs a judge restart or a second executor)."""

import pytest

from compiler.fleet.local import evaluate_with_retry
from persistent_engine import CandidateVerdict


class _Sup:
    def __init__(self, reason):
        self.reason, self.calls = reason, 0

    def evaluate(self, source, timeout_s, queued=()):
        self.calls += 1
        return CandidateVerdict(correct=False, reasons=[self.reason], speedup=None, per_point=[], timings={},
                                restarted=False)


@pytest.mark.parametrize("reason, calls", [
    ("crash: engine died during verify (killed by SIGKILL)", 2),
    ("crash: executor died during verify (killed by SIGSEGV); its stderr ended: ...", 1),
    ("protocol: the executor broke the protocol during load: a frame stalled for 10 s after 2 bytes", 1),
    ("hang: no answer during bench within the 60 s timeout (watchdog killed the executor)", 1),
    ("op-level: fused_add_rms_norm bf16 {'x': [5, 64]}: mismatch", 1),
])
def test_only_a_dead_judge_is_retried(reason, calls):
    sup = _Sup(reason)
    v = evaluate_with_retry(sup, "source", 60.0)
    assert sup.calls == calls and not v.correct
    assert v.restarted == (calls == 2)
