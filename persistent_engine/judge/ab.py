"""A/B timing of two executors from the judge, out of the candidate's reach (DESIGN.md step 4).

One sample of a side is one ``run`` request to its executor: ``k`` steps (CUDA-graph replays where both
sides captured the point, else eager steps) of one input variant, each on token ids the judge drew for
it, every output cloned into the executor's ring, the device idle before the reply. The judge's clock
(``timing.now_ns``, bound at import, in this process) spans the request from send to reply; the sample is
that wall time / k. What the candidate's process does with its own clocks changes nothing here.

Both sides are executor processes of the same kind (the baseline one runs only the reference code), so
the request, the copy of the token ids, the clone of each output and the reply cost the same on both.
Per pair the order is drawn from the judge's generator (unknown to the executors); while one side is
timed, the other's whole process group is SIGSTOPped, so no thread of the candidate can run during a
baseline sample. After a sample, with probability CHECK_P (and always for the first and last pair),
one run of it, picked at random, is fetched for the spot re-check against the judge's own reference on
the same token ids: an executor that skips, caches or shortcuts a run cannot know which will be asked.
Sequential stop as ``timing.ab_interleaved``: the median per-pair ratio known to ``stop_rel_se``.
"""

from __future__ import annotations

import math

from persistent_engine import timing
from persistent_engine.timing import ABResult, Stats, now_ns, ratio_settled

TIMER = "judge_wall_clock"
# runs per sample on CUDA: enough for ~TARGET_SAMPLE_MS of work, so the request's fixed cost (~0.1 ms of
# socket round trip) is a small, equal share of both sides; at most MAX_RUNS (the ring holds them all)
TARGET_SAMPLE_MS = {"cuda": 2.0, "cpu": 0.0}
MAX_RUNS = 16
CHECK_P = 0.15
# rows (sequences) of a fetched run's logits that are compared, picked after the run (a decode b32 step's
# logits are 16 MB on llama-1b: four rows cross the socket instead of 32)
SPOT_ROWS = 4


def run_batch(device_type: str, step_ms: float | None) -> int:
    """Runs per sample for a point whose step takes ``step_ms`` (None: not measured yet -> 1)."""
    target = TARGET_SAMPLE_MS.get(device_type, 0.0)
    if step_ms is None or target <= 0 or step_ms <= 0:
        return 1
    return int(max(1, min(MAX_RUNS, math.ceil(target / step_ms))))


def _sample(ex, i: int, v: int, k: int, graph: bool, ids, deadline: float | None) -> float:
    """Wall milliseconds per run of one ``run`` request."""
    msg = {"op": "run", "i": i, "v": v, "k": k, "ids": ids, "eager": not graph}
    left = 600.0 if deadline is None else deadline - now_ns() / 1e9
    if left <= 0:
        from persistent_engine.executor.launch import ExecutorTimeout

        raise ExecutorTimeout("no answer during bench")
    t0 = now_ns()
    reply = ex.call(msg, left)
    t1 = now_ns()
    if "error" in reply:
        from persistent_engine.judge.engine import CandidateRaised

        raise CandidateRaised(reply["error"], reply.get("kind", "candidate"))
    return (t1 - t0) / 1e6 / k


def time_side(ex, i: int, v: int, samples: int, k: int) -> float:
    """Median wall ms per run of ``samples`` run requests to one executor (start-up: the baseline's step)."""
    _sample(ex, i, v, k, True, None, None)
    return Stats.of([_sample(ex, i, v, k, True, None, None) for _ in range(samples)]).median_ms


def ab_remote(base, cand, i: int, variants: int, samples: int, k: int, graph: bool, fresh, rng,
              deadline: float, warmup: int = 1, stop_rel_se: float | None = None,
              min_pairs: int = timing.STOP_MIN_PAIRS, check_every: int = timing.STOP_CHECK_EVERY,
              rows: int = 1) -> ABResult:
    """Time point ``i`` on ``base`` and ``cand`` A/B, at most ``samples`` pairs. ``fresh(k)``: [k, T] token ids
    per sample (None: the variants' own ids, MoE points). ``rows``: sequences in a step's logits. ``kept``:
    (pair, variant, ids or None, row indices, those rows of the output) of the runs fetched for the spot
    re-check. Cost: 2 x (pairs + warmup) x k steps, plus the fetched outputs."""
    for j in range(warmup):
        for ex in (base, cand):
            _sample(ex, i, j % variants, k, graph, fresh(k) if fresh else None, deadline)
    a: list[float] = []
    b: list[float] = []
    kept: list = []
    base.members()                              # a fresh scan of both trees before the first stop
    cand.members()
    try:
        for s in range(samples):
            v = rng.randrange(variants)
            sides = [(base, cand, a), (cand, base, b)]
            if rng.random() < 0.5:
                sides.reverse()
            for ex, other, acc in sides:
                ids = fresh(k) if fresh else None
                other.stop()
                try:
                    acc.append(_sample(ex, i, v, k, graph, ids, deadline))
                finally:
                    other.cont()
                if ex is cand and (s == 0 or s == samples - 1 or rng.random() < CHECK_P):
                    j = rng.randrange(k)
                    picked = sorted(rng.sample(range(rows), min(rows, SPOT_ROWS)))
                    out = ex.call({"op": "fetch", "j": j, "rows": picked},
                                  max(1.0, deadline - now_ns() / 1e9))["logits"]
                    kept.append((s, v, None if ids is None else ids[j], picked, out))
            if (stop_rel_se is not None and s + 1 < samples and len(a) >= min_pairs
                    and (s + 1) % check_every == 0 and ratio_settled(a, b, stop_rel_se)):
                break
    finally:
        base.cont()
        cand.cont()
    return ABResult(Stats.of(a), Stats.of(b), kept)
