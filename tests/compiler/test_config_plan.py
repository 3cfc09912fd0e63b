"""compiler/search/config_plan.py: CONFIG-only candidates accepted by replaying the bundled Azure code trace,
with their projected TTFT/TPOT/tokens/s, and composed into the plan's source."""

from __future__ import annotations

from pathlib import Path

import pytest

from agents.offline import ConfigJudge, MeasuredStepTime, engine_config
from agents.templates import render_candidate
from compiler.search.acceptance import Acceptor
from compiler.search.config_plan import ConfigAcceptor, config_only, replay_key, slo_of
from persistent_engine.supervisor import CandidateVerdict
from traffic_profiles import Slo
from traffic_profiles.readers import read_trace

CODE = Path(__file__).resolve().parents[2] / "examples" / "traffic" / "azure2023_code.csv"


@pytest.fixture(scope="module")
def judge():
    # a decode step of 2 ms + 20 us per new token: the shape the engine's fit gives on small models
    return ConfigJudge(read_trace(str(CODE)), MeasuredStepTime(2e-3, 2e-5, 1e-8))


def _source(judge, **knobs):
    return render_candidate([], config=engine_config({**judge.space.default(), **knobs}), description="c")


def _acceptor(judge, seen):
    def evaluate(tier, source):
        seen.append(tier)
        return CandidateVerdict(correct=True, reasons=[], speedup=2.0)
    return ConfigAcceptor(Acceptor(evaluate, [], {"fast": 0.02, "slow": 0.02}), judge)


def test_a_config_that_shortens_tpot_without_a_loss_is_accepted_with_its_projected_effect(judge):
    seen: list = []
    acc = _acceptor(judge, seen)
    src = _source(judge, max_chunk_tokens=1024)
    assert config_only(src) == engine_config({**judge.space.default(), "max_chunk_tokens": 1024})
    d = acc.consider(src, CandidateVerdict(correct=True, reasons=[], speedup=0.97), author="config-search")
    assert d.accepted, d.reason
    assert seen == []                                   # scheduler knobs: no slow-tier timing asked for
    [best] = acc.best()
    p = best.projected
    assert p["tpot_mean_ms"]["after"] < p["tpot_mean_ms"]["before"]
    assert p["ttft_mean_ms"]["after"] >= 0.98 * p["ttft_mean_ms"]["before"]   # within the tolerance
    assert p["tokens_per_s"]["before"] > 0 and p["ratios"]["tpot"] > 1.01
    assert best.targets == ("config",) and "max_chunk_tokens" in best.config_keys
    comp = acc.compose()
    assert comp is not None and comp.parts == (best,) and "max_chunk_tokens" in comp.source
    assert "1024" in comp.source


def test_configs_that_trade_something_away_or_fail_in_the_engine_are_rejected(judge):
    acc = _acceptor(judge, [])
    ok = CandidateVerdict(correct=True, reasons=[], speedup=1.0)
    worse = acc.consider(_source(judge, max_num_batched_tokens=2048), ok, author="c")
    assert not worse.accepted and "does not beat" in worse.reason
    bad = acc.consider(_source(judge, max_chunk_tokens=1024),
                       CandidateVerdict(correct=False, reasons=["load: boom"], speedup=None), author="c")
    assert not bad.accepted and "boom" in bad.reason
    slow = acc.consider(_source(judge, max_chunk_tokens=1024, kv_block_size=32),
                        CandidateVerdict(correct=True, reasons=[], speedup=0.5), author="c")
    assert not slow.accepted and "slows a step" in slow.reason
    assert acc.best() == [] and acc.compose() is None


def test_kernel_candidates_go_to_the_kernel_acceptor(judge):
    seen: list = []
    acc = _acceptor(judge, seen)
    kernel = 'import torch\n\ndef rms_norm(x, weight, eps):\n    return x\n\nOVERRIDES = {"rms_norm": rms_norm}\n'
    assert config_only(kernel) is None
    acc.consider(kernel, CandidateVerdict(correct=True, reasons=[], speedup=2.0), author="k")
    assert seen == ["slow"] and [a.targets for a in acc.accepted] == [("rms_norm",)]


def test_under_an_slo_a_setting_that_trades_ttft_for_tpot_is_scored_by_its_goodput(judge):
    """Fewer sequences and small prompt chunks: every request's TPOT within 20 ms, its first token later.
    Without an SLO that trade is refused; with the user's TPOT bound the goodput (tokens/s of requests within
    it) decides, and it is better by a quarter."""
    ok = CandidateVerdict(correct=True, reasons=[], speedup=1.0)
    src = _source(judge, max_num_seqs=8, max_chunk_tokens=128)
    refused = _acceptor(judge, []).consider(src, ok, author="c")
    assert not refused.accepted and "without a loss" in refused.reason
    slo_judge = ConfigJudge(judge.trace, judge.step_time, slo=slo_of(None, 20.0))
    assert slo_judge.slo == Slo(tpot_s=0.02)
    acc = _acceptor(slo_judge, [])
    d = acc.consider(src, ok, author="c")
    assert d.accepted and "goodput x1.2" in d.reason, d.reason
    p = acc.best()[0].projected
    assert p["slo_attained"]["before"] < 0.8 and p["slo_attained"]["after"] == 1.0
    assert p["goodput_tokens_per_s"]["after"] > 1.2 * p["goodput_tokens_per_s"]["before"]
    assert p["ttft_mean_ms"]["after"] > p["ttft_mean_ms"]["before"]          # the trade the SLO allows
    worse = acc.consider(_source(slo_judge, max_num_batched_tokens=1024), ok, author="c")
    assert not worse.accepted and "in goodput under TPOT <= 20 ms" in worse.reason


def test_an_slo_is_part_of_what_a_remembered_config_verdict_depends_on():
    assert slo_of(None, None) is None and slo_of(500.0, None) == Slo(ttft_s=0.5)
    assert replay_key("abc", None, None) == "abc"
    assert replay_key("abc", None, 50.0) != replay_key("abc", None, 40.0) != "abc"


def test_no_setting_is_accepted_on_a_projection_from_an_overloaded_replay():
    """Issue 46: a step so slow that the trace's queue never drains (mean TTFT far above 30 s): the
    replay's ratios measure the queue, so no setting is accepted on them, and the reason says so."""
    slow = ConfigJudge(read_trace(str(CODE)), MeasuredStepTime(0.5, 2e-3, 1e-6))
    why = slow.overloaded()
    assert "overloaded" in why and slow.baseline()["ttft_mean_s"] > 30
    d = _acceptor(slow, []).consider(_source(slow, max_chunk_tokens=1024),
                                     CandidateVerdict(correct=True, reasons=[], speedup=1.0), author="c")
    assert not d.accepted and "overloaded" in d.reason
    fitted = ConfigJudge(read_trace(str(CODE)), MeasuredStepTime(0.05, 2e-4, 1e-7))
    assert fitted.overloaded() and fitted.fit_load() < 1.0      # the arrivals slowed until the queue drains
    assert fitted.overloaded() == "" and fitted.baseline()["ttft_mean_s"] <= 30


def test_a_replay_the_engine_keeps_up_with_is_not_overloaded(judge):
    assert judge.overloaded() == ""
