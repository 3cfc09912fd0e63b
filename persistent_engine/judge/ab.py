"""A/B timing of two executors from the judge, out of the candidate's reach (DESIGN.md step 4).

One sample of a side is one ``run`` request to its executor: ``k`` back-to-back steps (CUDA-graph replays
where both sides captured the point, else eager steps) of one input variant, every output copied into the
judge's output ring (``executor/out_ring.py``: memory the judge owns, its k slots NaN when the request
leaves), the device idle before the reply. The judge's clock (``timing.now_ns``, bound at import, in this
process) spans the request from send to reply (on CUDA to the end of the judge's copy of the ring, which
is taken right after the reply); the sample is that wall time / k. What the candidate's process does with
its own clocks changes nothing here, and what the judge checks is what the timed runs left at the reply.

``k`` is the judge's: ``calibrate`` picks it per point at start-up so that one sample lasts at least
``TARGET_SAMPLE_MS`` of the baseline's steps (5 ms on CPU, 2 ms on CUDA). The request's fixed cost (the
socket round trip, msgpack, the executor's Python dispatch: 0.1 ms on CUDA, up to ~1 ms on a busy CPU) is
then a small share of every sample instead of a third or more of a 1-2 ms CPU decode step, where it
diluted every gain and let scheduling jitter decide compositions.

Back-to-back runs must not be batchable into one (k decode steps of one point share their KV cache: done
as one batch of k they would read the weights once). So the runs are **chained**: the judge draws fresh
token ids for every run, and the executor adds to run r's ids the argmax of row 0 of run r-1's logits
(mod the vocabulary), which it cannot know before run r-1 is computed. At every reply the judge copies out
of its ring the rows of one run j it draws then, and row 0 of every run; a run not written shows as NaN and
rejects. A spot re-check of run j derives run j's ids from row 0 of run j-1 here and compares run j with the
judge's own reference on those ids: a run computed on other ids, skipped, cached, batched or deferred past
the reply is caught, and no request can ask the executor to compute an output "for the check".

Both sides are executor processes of the same kind (the baseline one runs only the reference code), so
the request, the copy of the token ids, the chain, the copy of each output and the reply cost the same on
both. Per pair the order is drawn from the judge's generator (unknown to the executors); while one side
is timed, the other's whole process group is SIGSTOPped, so no thread of the candidate can run during a
baseline sample. After a sample, with probability CHECK_P (and always for the first and last pair), the
judge's copy of it is kept for the spot re-check. Sequential stop as
``timing.ab_interleaved``: the median per-pair ratio known to ``stop_rel_se``; futility stop
(``timing.futile``, looks at ``timing.futility_look``): a candidate slower than 1 + ``futility_margin``
beyond the sign test's doubt stops after 6 pairs instead of 20 or more. The pair a stop ends on is always
re-checked.
"""

from __future__ import annotations

import math
import os
import random
from dataclasses import dataclass
from typing import Any

from persistent_engine.measure import timing
from persistent_engine.executor.out_ring import MAX_RUNS, RING_BYTES, Observed, observe
from persistent_engine.measure.timing import ABResult, Stats, futile, futility_look, now_ns, ratio_settled
from persistent_engine.judge.types import CandidateRaised

TIMER = "judge_wall_clock"
# a sample lasts at least this much of the baseline's steps: k = ceil(TARGET / step), 1 <= k <= MAX_RUNS
TARGET_SAMPLE_MS = {"cuda": 2.0, "cpu": 5.0}
CALIBRATION_SAMPLES = 5
CHECK_P = 0.15
# a chained run's argmax may differ from the reference's only at a near-tie: within this many RMS gaps
# between its row and the reference's (an honest flip needs the two logits' errors to cross the gap)
TIE_BAND_RMS = 6.0


def run_batch(device_type: str, step_ms: float | None, out_bytes: int = 0) -> int:
    """Runs per sample for a point whose step takes ``step_ms`` (None: not measured yet -> 1) and whose
    output is ``out_bytes`` (the ring keeps k of them)."""
    target = TARGET_SAMPLE_MS.get(device_type, 0.0)
    if step_ms is None or target <= 0 or step_ms <= 0:
        return 1
    k = min(MAX_RUNS, math.ceil(target / step_ms))
    if out_bytes > 0:
        k = min(k, RING_BYTES.get(device_type, RING_BYTES["cpu"]) // out_bytes)
    return int(max(1, k))


def _sample(ex, i: int, v: int, k: int, graph: bool, ids, chain: int | None, deadline: float | None, like,
            rng) -> tuple[float, Observed]:
    """Wall milliseconds per run of one ``run`` request, and the judge's copy of its outputs (``chain``: the
    vocabulary size the chained ids are taken modulo; None: the variant's own ids, unchained; ``like``: a
    tensor of one run's output shape and dtype). The k ring slots are NaN when the request leaves; the copy
    is taken at the reply before anything else reaches the executor: on CUDA inside the window (queued work
    the executor left lands before the copy and counts, or shows as NaN), on CPU with its tree stopped."""
    from persistent_engine.executor import wire

    shape, dtype = tuple(like.shape), like.dtype
    ex.out.arm(k, shape, dtype)
    msg = wire.TimedRun(i=i, v=v, k=k, ids=ids, eager=not graph, chain=chain, shape=list(shape),
                   dtype=str(dtype).removeprefix("torch."))
    left = 600.0 if deadline is None else deadline - now_ns() / 1e9
    if left <= 0:
        from persistent_engine.executor.launch import ExecutorTimeout

        raise ExecutorTimeout("no answer during bench")
    t0 = now_ns()
    reply = ex.call(msg, left)
    if isinstance(reply, wire.Failed):
        raise CandidateRaised(reply.error, reply.kind)
    if ex.out.device.type == "cuda":
        seen = observe(ex.out, k, shape, dtype, rng)
        t1 = now_ns()
    else:
        t1 = now_ns()
        ex.stop()
        try:
            seen = observe(ex.out, k, shape, dtype, rng)
        finally:
            ex.cont()
    if reply.k != k:
        raise CandidateRaised(f"the executor reported {reply.k} runs for a request of {k}", "candidate")
    if (why := seen.unwritten()) is not None:
        raise CandidateRaised(why, "candidate")
    return (t1 - t0) / 1e6 / k, seen


def side_samples(ex, i: int, v: int, samples: int, k: int, like) -> list[float]:
    """Wall ms per run of ``samples`` run requests of ``k`` runs to one executor (after one untimed one)."""
    rng = random.Random(int.from_bytes(os.urandom(8), "little"))
    _sample(ex, i, v, k, True, None, None, None, like, rng)
    return [_sample(ex, i, v, k, True, None, None, None, like, rng)[0] for _ in range(samples)]


def time_side(ex, i: int, v: int, samples: int, k: int, like) -> float:
    """Median wall ms per run of ``side_samples``."""
    return Stats.of(side_samples(ex, i, v, samples, k, like)).median_ms


def calibrate(ex, i: int, device_type: str, like, samples: int = CALIBRATION_SAMPLES) -> tuple[float, int]:
    """(median ms per run, runs per sample) of point ``i`` on the baseline executor (``like``: its output).
    k follows the fastest sample (other processes can only slow one down, so a busy machine does not shrink
    k): a first pass of single-run requests (the fixed cost included: k comes out too small, never too
    large), then passes at the k that gives (the fixed cost amortised) until k settles (two more at most)."""
    k = 1
    out_bytes = like.numel() * like.element_size()
    ms = side_samples(ex, i, 0, samples, k, like)
    for _ in range(2):
        nk = run_batch(device_type, min(ms), out_bytes)
        if nk == k:
            break
        k = nk
        ms = side_samples(ex, i, 0, samples, k, like)
    return Stats.of(ms).median_ms, k


@dataclass(frozen=True)
class Fetched:
    """One timed run kept for the spot re-check, from the judge's copy of the ring. ``ids``: its token ids as
    the judge derives them (None: the variant's own, MoE points); ``rows``: the rows drawn after the run and
    ``out`` those rows of its logits. ``link`` (chained runs j >= 1): (run j-1's ids as derived, its row 0):
    the judge checks that row against its own reference on those ids, and its argmax, which fixed run j's
    ids (``tie_band``)."""

    pair: int
    variant: int
    ids: Any
    rows: list[int]
    out: Any
    link: tuple[Any, Any] | None = None


def chained_ids(draw, row0_prev, vocab: int):
    """A chained run's token ids: the judge's draw plus argmax(row 0 of the previous run's logits), mod
    ``vocab`` (the first run of a sample: the draw itself, ``row0_prev`` None)."""
    import torch

    if row0_prev is None:
        return draw
    return torch.remainder(draw + int(torch.argmax(row0_prev).item()), vocab)


def chain_argmax_reason(claimed, ref, where: str) -> str | None:
    """None when ``claimed``'s argmax (row 0 of a chained run, which fixed the next run's ids) is one the
    reference allows: its own argmax, or a token whose reference logit is within the tie band of the
    maximum, TIE_BAND_RMS x the RMS gap between ``claimed`` and ``ref`` (a correct kernel's rounding can only
    flip a near-tie; a made-up chain value almost never lands in the band)."""
    import torch

    c, r = claimed.float().flatten(), ref.float().flatten()
    top = int(torch.argmax(c).item())
    rmax = float(r.max().item())
    band = TIE_BAND_RMS * float((c - r).pow(2).mean().sqrt().item()) + 1e-6 * max(abs(rmax), 1.0)
    if rmax - float(r[top].item()) <= band:
        return None
    return (f"{where}: the chain of timed runs is broken (the next run's ids follow token {top}, "
            f"the reference's maximum is token {int(torch.argmax(r).item())})")


def _kept(s: int, v: int, ids, chain: int | None, seen: Observed) -> Fetched:
    """The judge's copy of pair ``s``'s candidate sample as the spot re-check reads it: run ``seen.j`` with
    the links of its chain (``ids``: the sample's [k, T] draws; each sample's chain starts afresh at run 0)."""
    j = seen.j
    if ids is None:
        return Fetched(s, v, None, seen.rows, seen.out)
    if chain is None or j == 0:
        return Fetched(s, v, ids[j], seen.rows, seen.out)
    prev, prev2 = seen.row0[j - 1], (seen.row0[j - 2] if j >= 2 else None)
    ids_prev = chained_ids(ids[j - 1], prev2, chain)
    return Fetched(s, v, chained_ids(ids[j], prev, chain), seen.rows, seen.out, (ids_prev, prev))


def ab_remote(base, cand, i: int, variants: int, samples: int, k: int, graph: bool, fresh, rng,
              deadline: float, like, warmup: int = 1, stop_rel_se: float | None = None,
              min_pairs: int = timing.STOP_MIN_PAIRS, check_every: int = timing.STOP_CHECK_EVERY,
              vocab: int | None = None, futility_margin: float | None = None) -> ABResult:
    """Time point ``i`` on ``base`` and ``cand`` A/B, at most ``samples`` pairs of ``k`` runs each.
    ``fresh(k)``: [k, T] token ids per sample (None: the variants' own ids, MoE points, unchained);
    ``vocab``: the modulus of the chain (fresh ids only); ``like``: the point's reference output (shape and
    dtype of one run's logits). ``kept``: the runs kept for the spot re-check (``Fetched``); ``stopped``: why
    timing ended early ("settled", "futility", ""). Cost: 2 x (pairs + warmup) x k steps, plus the copies."""
    chain = vocab if fresh is not None else None
    for j in range(warmup):
        for ex in (base, cand):
            _sample(ex, i, j % variants, k, graph, fresh(k) if fresh else None, chain, deadline, like, rng)
    a: list[float] = []
    b: list[float] = []
    kept: list = []
    stopped = ""
    base.members()                              # a fresh scan of both trees before the first stop
    cand.members()
    try:
        for s in range(samples):
            v = rng.randrange(variants)
            sides = [(base, cand, a), (cand, base, b)]
            if rng.random() < 0.5:
                sides.reverse()
            unkept = None                       # the candidate's sample of this pair, when not kept yet
            for ex, other, acc in sides:
                ids = fresh(k) if fresh else None
                other.stop()
                try:
                    ms, seen = _sample(ex, i, v, k, graph, ids, chain, deadline, like, rng)
                finally:
                    other.cont()
                acc.append(ms)
                if ex is cand:
                    if s == 0 or s == samples - 1 or rng.random() < CHECK_P:
                        kept.append(_kept(s, v, ids, chain, seen))
                    else:
                        unkept = (ids, seen)
            n = s + 1
            if n < samples and futility_margin is not None and futility_look(n, check_every) and futile(
                    a, b, futility_margin):
                stopped = "futility"
            elif (stop_rel_se is not None and n < samples and len(a) >= min_pairs
                    and n % check_every == 0 and ratio_settled(a, b, stop_rel_se)):
                stopped = "settled"
            if stopped:
                if unkept is not None:          # the last pair taken is always re-checked
                    kept.append(_kept(s, v, unkept[0], chain, unkept[1]))
                break
    finally:
        base.cont()
        cand.cont()
    return ABResult(Stats.of(a), Stats.of(b), kept, list(zip(a, b)), stopped)


def capture(ex, points: list[int], timeout_s: float = 600) -> None:
    """Has executor ``ex`` capture its CUDA graphs at ``points`` (compiler.plan.apply: a plan's side before timing)."""
    from persistent_engine.executor import wire

    reply = ex.call(wire.Capture(points=sorted(points)), timeout_s)
    if isinstance(reply, wire.Failed):
        raise RuntimeError(reply.error)


def step_logits(ex, i: int, timeout_s: float = 600):
    """One step of point ``i`` (input variant 0) on executor ``ex``: its logits (RuntimeError with the executor's
    bounded reason when it failed or returned none)."""
    from persistent_engine.executor import wire

    reply = ex.call(wire.Steps(steps=[wire.StepAsk(i=i, v=0)]), timeout_s)
    if isinstance(reply, wire.Failed):
        raise RuntimeError(reply.error)
    if not reply.results or reply.results[0].logits is None:
        raise RuntimeError("its step returned no logits")
    return reply.results[0].logits
