"""Compiling queued candidates ahead (``judge/executors.py``): a source listed behind the next one in
``Prepare.sources`` is loaded and warmed (its kernels compiled) in an executor of its own while the judge
works on the next one; its own load then takes that executor. A source no longer listed loses its executor,
and a candidate whose warm-up raises or kills its executor gets the verdict a fresh executor gives it."""

import pathlib
import re
import time

import pytest

from persistent_engine import io_struct as io
from persistent_engine.io_struct import WorkloadPoint
from persistent_engine.judge.engine import Engine, EngineConfig

CANDIDATES = pathlib.Path(__file__).resolve().parents[1] / "candidates"
POINT = WorkloadPoint(phase="decode", batch=2, context=8, chunk=1, weight=1.0)


def _source(name: str) -> str:
    return (CANDIDATES / f"{name}.py").read_text()


def _engine(ahead: int) -> Engine:
    """A tiny judge with two warm executors in its pool, both ready."""
    e = Engine(EngineConfig(model="tiny-dense", layers=[0], variants=1, pool_size=2, ahead=ahead, points=[POINT]))
    e.start_pool()
    t0 = time.monotonic()
    while e.pool.ready_count() < 2:
        assert time.monotonic() - t0 < 300, "the pool did not warm"
        time.sleep(0.05)
    return e


def test_sources_are_compiled_ahead_first_come_first_and_each_load_takes_its_executor():
    first, queued = _source("good_torch"), _source("good_triton")
    e = _engine(ahead=2)
    try:
        r = e.handle(io.Prepare(sources=[first, queued]))
        assert r.ok and r.ahead == 2 and "next source is loading ahead; 2 started" in r.message, r
        assert e._next is None                  # none set aside: the next source has its own
        load = e.handle(io.LoadCandidate(source=first))
        assert load.ok and load.ahead, load
        e.handle(io.Unload())
        r = e.handle(io.Prepare(sources=[queued]))
        assert r.ahead == 1 and r.pool_wait_s == 0.0 and "started" not in r.message, r
        load = e.handle(io.LoadCandidate(source=queued))
        assert load.ok and load.ahead and load.ops == ["fused_add_rms_norm"], load
        # every op-level case of fused_add_rms_norm (bf16 and fp32) and the one point's step ran
        m = re.search(r"compiled ahead: (\d+) op case\(s\), (\d+) step\(s\), (\d+) failed, (\d+) over", load.message)
        assert m and int(m[1]) >= 4 and int(m[2]) == 1 and int(m[3]) == 0 and int(m[4]) == 0, load.message
        ver = e.handle(io.Verify(seed=11))
        assert isinstance(ver, io.VerifyReply) and ver.ok, ver
        bench = e.handle(io.Bench(samples=3))
        assert isinstance(bench, io.BenchReply) and bench.ok, bench
        e.handle(io.Unload())
        status = e.handle(io.Status())
        assert status.ahead_used == 2 and status.executors_used == 2 and status.ahead == 0
    finally:
        e.close()


def test_a_source_no_longer_listed_loses_its_executor_and_none_is_started_past_the_limit():
    first, second, third = _source("good_torch"), _source("good_triton"), _source("slow_exact")
    e = _engine(ahead=1)
    try:
        r = e.handle(io.Prepare(sources=[first, second, third]))
        assert r.ahead == 1                     # the limit: the first only
        dropped = e._ahead[next(iter(e._ahead))].executor
        r = e.handle(io.Prepare(sources=[second]))
        assert r.ahead == 1 and list(e._ahead.values())[0].source == second
        t0 = time.monotonic()
        while dropped.alive() and time.monotonic() - t0 < 30:
            time.sleep(0.05)
        assert not dropped.alive()
        load = e.handle(io.LoadCandidate(source=first))
        assert load.ok and not load.ahead      # loaded afresh
        e.handle(io.Unload())
        assert e.handle(io.Prepare()).ahead == 0 and not e._ahead     # nothing listed: none kept
    finally:
        e.close()


def test_refused_sources_get_no_executor_ahead():
    e = _engine(ahead=1)
    try:
        r = e.handle(io.Prepare(sources=["OVERRIDES = {'no_such_op': print}\n", _source("good_torch")]))
        assert r.ahead == 1 and list(e._ahead.values())[0].source == _source("good_torch")
    finally:
        e.close()


def _verdict(e: Engine, source: str) -> tuple[str, str]:
    """(kind, first clause) of the reply that ends ``source``'s load and verification."""
    load = e.handle(io.LoadCandidate(source=source))
    reply = e.handle(io.Verify(seed=11)) if load.ok else load
    e.handle(io.Unload())
    if isinstance(reply, io.ErrorReply):
        return reply.kind, reply.message.split(";")[0]
    return reply.message, "; ".join(reply.reasons)


@pytest.mark.parametrize("hostile", ["exits", "segfault"])
def test_a_warm_up_that_raises_or_kills_its_executor_changes_no_verdict(hostile):
    source = _source(hostile)
    plain = _engine(ahead=0)
    try:
        expected = _verdict(plain, source)
    finally:
        plain.close()
    e = _engine(ahead=1)
    try:
        e.handle(io.Prepare(sources=[source]))
        assert len(e._ahead) == 1
        got = _verdict(e, source)
        assert got == expected and e.ahead_used == 0, (got, expected)
    finally:
        e.close()
    assert expected[0] in ("candidate", "crash"), expected


def test_the_default_count_comes_from_the_device_or_the_environment(monkeypatch, capsys):
    from persistent_engine.judge.executors import AHEAD, AHEAD_ENV, ahead_default

    monkeypatch.delenv(AHEAD_ENV, raising=False)
    assert ahead_default("cuda") == AHEAD["cuda"] > 0 and ahead_default("cpu") == 0
    monkeypatch.setenv(AHEAD_ENV, "0")
    assert ahead_default("cuda") == 0
    monkeypatch.setenv(AHEAD_ENV, "6")
    assert ahead_default("cpu") == 6
    monkeypatch.setenv(AHEAD_ENV, "-2")
    assert ahead_default("cuda") == AHEAD["cuda"] and "is not a count" in capsys.readouterr().err


def test_the_executors_compiling_ahead_take_at_most_half_of_the_room_and_leave_a_pool():
    from persistent_engine.judge.executors import split_pool

    assert split_pool(16, 4) == (12, 4)                 # the H200 default: 12 warm + 4 ahead
    assert split_pool(6, 4) == (3, 3)                   # memory short: half each
    assert split_pool(1, 4) == (1, 0) and split_pool(5, 0) == (5, 0)


EXPERTS = """
import torch

def moe_experts(x, w13, w2, topk_weights, topk_ids):
    out = torch.zeros_like(x)
    for j in range(topk_ids.shape[-1]):
        for e in topk_ids[:, j].unique().tolist():
            rows = topk_ids[:, j] == e
            g, u = (x[rows].float() @ w13[e].float().t()).chunk(2, dim=-1)
            y = (torch.nn.functional.silu(g) * u) @ w2[e].float().t()
            out[rows] += (topk_weights[rows, j, None] * y).to(x.dtype)
    return out

OVERRIDES = {"moe_experts": moe_experts}
"""


def test_an_expert_op_whose_smallest_check_is_over_the_warm_ups_share_is_not_warmed():
    """The executors compiling ahead share one op check's memory (``_warm_budget``); an expert op's case that
    is over the share even at its smallest fit (GLM-5.2: ~19 GB at 16 experts) is skipped, the steps still run."""
    e = Engine(EngineConfig(model="tiny-moe", layers=[0, 1], variants=1, pool_size=2, ahead=1, points=[POINT]))
    try:
        e._warm_budget = lambda: 1              # one byte: every expert case is over it
        e.start_pool()
        t0 = time.monotonic()
        while e.pool.ready_count() < 2:
            assert time.monotonic() - t0 < 300
            time.sleep(0.05)
        e.handle(io.Prepare(sources=[EXPERTS]))
        load = e.handle(io.LoadCandidate(source=EXPERTS))
        m = re.search(r"compiled ahead: (\d+) op case\(s\), (\d+) step\(s\), \d+ failed, (\d+) over", load.message)
        assert load.ok and load.ahead and m, load
        assert int(m[1]) == 0 and int(m[3]) >= 2 and int(m[2]) >= 1, load.message
        e.handle(io.Unload())
    finally:
        e.close()


def test_a_candidate_step_that_did_not_compile_where_the_baseline_did_is_no_comparison(capsys):
    """Issue 39 (found on the H100, 2026-12-06): a candidate's executor whose compile of a point failed ran
    that point eagerly and was timed against the compiled baseline (0.72x for an exact copy of the
    reference). The judge now rejects the timing with inductor's words, and logs them; points every executor
    runs eagerly are not affected."""
    from persistent_engine.io_struct import WorkloadPoint
    from persistent_engine.judge.checks import uncompiled_reasons

    points = [WorkloadPoint("decode", 1, 1024), WorkloadPoint("decode", 32, 1024)]
    reasons = uncompiled_reasons(points, {"0": "BackendCompilerFailed: boom", "1": "x", "bad": "y"}, [0])
    assert len(reasons) == 1 and "did not compile at decode b1" in reasons[0] and "BackendCompilerFailed" in reasons[0]
    assert "not compiled at decode b1" in capsys.readouterr().err
    assert uncompiled_reasons(points, {}, [0, 1]) == []
