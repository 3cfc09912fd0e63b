"""compiler/search/judging.py's confirmations on a real board with the real acceptor: a fast-tier winner found when
the search's time is up is confirmed on the slow tier after the swarm (not lost, as the v3 H200 GLM-5.2 run's
1.233x fused MoE was), no new fast-tier work starts once the time left is the confirmations', and a winner no
slow-tier time is left for is recorded as not confirmed. The fleet is scripted (its verdicts and durations):
the engines' part is tested in tests/compiler/test_loop.py and tests/persistent_engine."""

from __future__ import annotations

import io
import threading
import time

import pytest

from bulletin_board import Board
from compiler.search.acceptance import Acceptor
from compiler.search.budget import Budget
from compiler.fleet.local import FleetConfig
from compiler.search.judging import Judge
from compiler.search.loop import OptimizeConfig
from compiler.search.memory import RunMemory, shape_class
from compiler.search.progress import Progress
from compiler.search.run_state import RunContext
from persistent_engine.io_struct import WorkloadPoint
from persistent_engine.supervisor import CandidateVerdict

POINTS = [WorkloadPoint("decode", 8, 300, 1)]
WINNER = "from persistent_engine.ops import registry\n# fused MoE stand-in: a source is all the judge keys on\n"
OTHER = WINNER + "# another\n"


class ScriptedFleet:
    """The ``Fleet`` face the judge uses: per tier a speedup and the seconds an evaluation takes."""

    def __init__(self, fast_s: float = 0.0, slow_s: float = 0.0):
        self.cfg = FleetConfig(model="tiny-dense", points=tuple(POINTS), fast_layers=(0,), slow_layers=(0, 1))
        self.fast_s, self.slow_s = fast_s, slow_s
        self.calls: list[tuple[str, str]] = []

    def evaluate(self, tier: str, source: str) -> CandidateVerdict:
        self.calls.append((tier, source))
        time.sleep(self.fast_s if tier == "fast" else self.slow_s)
        return CandidateVerdict(correct=True, reasons=[], speedup=1.233 if tier == "fast" else 1.2)


@pytest.fixture
def board(tmp_path):
    b = Board(f"sqlite:///{tmp_path / 'board.db'}")
    yield b
    b.close()


def _judge(board, fleet, *, search_in: float, confirm_in: float, eval_s=None) -> tuple[Judge, io.StringIO]:
    now = time.monotonic()
    stream = io.StringIO()
    progress = Progress(now + confirm_in, stream=stream)
    row = board.create_run(model="tiny-dense", hw="cpu", traffic_hash="t")
    memory = RunMemory(board, row.id, model="tiny-dense", hw="cpu", traffic_hash="t",
                       shape=shape_class("cpu", "bf16", POINTS, [0], [0, 1]))
    cfg = OptimizeConfig(model="tiny-dense", hw="cpu", traffic="t", out="unused")
    run = RunContext(cfg, board, "sqlite://", row.id, memory, progress, threading.Event(), Budget(None), now)
    accepted: list = []
    acceptor = Acceptor(fleet.evaluate, POINTS, {"fast": 0.055, "slow": 0.002}, accepted=accepted)
    judge = Judge(run, fleet, acceptor, accepted, search_end=now + search_in, confirm_end=now + confirm_in,
                  eval_s=eval_s or {})
    return judge, stream


def test_a_winner_found_as_the_search_ends_is_confirmed_after_it(board):
    fleet = ScriptedFleet(fast_s=0.3)                    # the fast verdict lands past the search's end
    judge, stream = _judge(board, fleet, search_in=0.1, confirm_in=30)
    verdict = judge.evaluate(WINNER, author="offline-kernel-3")
    assert verdict.speedup == 1.233 and not judge.accepted and judge.owed() == 1
    assert fleet.calls == [("fast", WINNER)]             # not confirmed in the agent's thread
    refused = judge.evaluate(OTHER, author="offline-kernel-0")   # no new fast-tier work past the search's end
    assert not refused.correct and "search's time is spent" in refused.reasons[0]
    assert len(fleet.calls) == 1
    assert judge.confirm_owed() == 1
    assert fleet.calls[-1] == ("slow", WINNER) and judge.owed() == 0
    assert [a.slow for a in judge.accepted] == [1.2]
    assert "confirming 1 fast-tier winner(s) on the slow tier" in stream.getvalue()
    assert judge.estimate_s("slow") >= 0.0


def test_a_confirmation_under_way_in_an_agent_thread_is_waited_for(board):
    fleet = ScriptedFleet(slow_s=0.5)
    judge, stream = _judge(board, fleet, search_in=0.2, confirm_in=30)
    agent = threading.Thread(target=judge.evaluate, args=(WINNER,), kwargs={"author": "a"})
    agent.start()                                        # fast at once, then 0.5 s on the slow tier
    time.sleep(0.3)
    assert judge.owed() == 1
    judge.confirm_owed()                                 # the swarm gave up on the thread; the run waits
    assert [a.name for a in judge.accepted] and judge.owed() == 0
    agent.join()


def test_no_new_fast_work_when_the_time_left_is_the_owed_confirmations(board):
    fleet = ScriptedFleet(fast_s=0.3)
    judge, _ = _judge(board, fleet, search_in=0.1, confirm_in=30, eval_s={"slow": 20.0, "fast": 5.0})
    judge.evaluate(WINNER, author="a")                   # owed: one confirmation, ~20 s
    judge.search_end = time.monotonic() + 60             # search time left, but not for the confirmation
    judge.confirm_end = time.monotonic() + 15
    why = judge.refusal()
    assert why is not None and "kept to confirm 1 fast-tier winner(s)" in why
    judge.confirm_end = time.monotonic() + 40
    assert judge.refusal() is None


def test_a_winner_with_no_slow_time_left_is_recorded_unconfirmed(board):
    fleet = ScriptedFleet(fast_s=0.3)
    judge, stream = _judge(board, fleet, search_in=0.1, confirm_in=30, eval_s={"slow": 20.0})
    judge.evaluate(WINNER, author="a")
    judge.confirm_end = time.monotonic() + 5             # one slow evaluation takes ~20 s
    assert judge.confirm_owed() == 0 and not judge.accepted
    assert ("slow", WINNER) not in fleet.calls
    assert "not confirmed (no time left)" in stream.getvalue()


def test_confirmations_leave_the_composition_time_for_one_measurement_of_the_set(board):
    """With one candidate accepted, a second confirmation makes a set of two that the composition must
    measure on both tiers: it is not started when only the confirmation itself would fit."""
    fleet = ScriptedFleet(fast_s=0.3, slow_s=1.0)
    judge, stream = _judge(board, fleet, search_in=0.1, confirm_in=30, eval_s={"slow": 4.0})
    agents = [threading.Thread(target=judge.evaluate, args=(src,), kwargs={"author": a})
              for src, a in ((WINNER, "a"), (OTHER, "b"))]
    for t in agents:                                     # both win the fast tier past the search's end
        t.start()
    for t in agents:
        t.join()
    assert judge.owed() == 2
    assert judge.composition_s() == 0.0                  # nothing accepted yet: a set of one
    judge.confirm_end = time.monotonic() + 5.5           # 4 s (the estimate) fit; at 1 s, 4 s + the set's 1.3 s not
    assert judge.confirm_owed() == 1 and len(judge.accepted) == 1
    assert judge.composition_s() == pytest.approx(0.3 + 1.0, abs=0.2)
    assert len([c for c in fleet.calls if c[0] == "slow"]) == 1
    assert "not confirmed (no time left)" in stream.getvalue() and "the composition's" in stream.getvalue()


def test_with_nothing_accepted_the_search_runs_until_one_fast_evaluation_is_left(board):
    """No fixed share of the budget is held back for a composition with nothing to compose: new fast-tier
    work stops only when the time left before ``confirm_end`` is one fast-tier evaluation."""
    judge, _ = _judge(board, ScriptedFleet(), search_in=600, confirm_in=600, eval_s={"fast": 3.0, "slow": 9.0})
    now = time.monotonic()
    judge.confirm_end = now + 10
    assert judge.closing_s() == 3.0 and judge.refusal(now) is None and not judge.search_over(now)
    why = judge.refusal(now + 7.5)
    assert judge.search_over(now + 7.5) and "kept for the evaluation under way and the composition" in why
    judge.extend_from = now + 8                          # the budget's own search end: its fixed reserve holds
    assert judge.refusal(now + 7.5) is None and judge.refusal(now + 8) is not None


def test_an_accepted_candidate_keeps_the_set_measurement_time_back(board):
    """Once something is accepted, a further acceptance makes a set the composition measures on both
    tiers (twice when within the noise): the search ends that much earlier."""
    fleet = ScriptedFleet(fast_s=0.2, slow_s=0.4)
    judge, _ = _judge(board, fleet, search_in=600, confirm_in=600)
    judge.evaluate(WINNER, author="a")                   # fast 0.2 s, confirmed at once: 0.4 s on the slow tier
    assert len(judge.accepted) == 1
    closing = judge.closing_s()
    assert closing == pytest.approx(0.2 + 2 * (0.2 + 0.4), abs=0.15)
    now = time.monotonic()
    judge.confirm_end = now + closing + 0.05
    assert judge.refusal(now) is None and judge.refusal(now + 0.1) is not None


def test_the_swarm_ends_when_the_judge_has_only_its_closing_time_left(board):
    """``run_swarm`` stops the agents when the judge's search is over, well before the swarm's deadline."""
    from agents import Agent
    from compiler.search.judging import run_swarm
    from compiler.search.run_state import RunInputs

    class Idle(Agent):
        def run_once(self, ctx):
            ctx.stop.wait(0.05)
            return True

    judge, _ = _judge(board, ScriptedFleet(), search_in=60, confirm_in=60, eval_s={"fast": 59.0})
    run_in = RunInputs(spec=None, device={"kind": "cpu"}, traffic=None, points=POINTS, fast_layers=[0],
                       slow_layers=[0, 1], tier_inputs={}, layout=None, projected=None, layout_note="")
    t0 = time.monotonic()
    judge.confirm_end = t0 + 60.6                        # 59 s of closing: over within a second
    result = run_swarm(judge, [Idle("idle-0")], run_in, {}, t0 + 60)
    assert time.monotonic() - t0 < 5 and result.agents[0].stopped == "deadline"


class ClockFleet(ScriptedFleet):
    """The fleet at the run's end: the fast tier refuses (``BUDGET_SPENT``), or the slow tier's confirmation is
    cut there (what ``TierEngine.evaluate`` makes of a hang under a timeout the deadline shortened)."""

    def __init__(self, refuse: str):
        super().__init__()
        self.refuse = refuse

    def evaluate(self, tier: str, source: str) -> CandidateVerdict:
        from compiler.fleet.local import BUDGET_SPENT, cut_by_deadline, failed_verdict
        self.calls.append((tier, source))
        if tier == self.refuse == "fast":
            return failed_verdict(BUDGET_SPENT)
        if tier == self.refuse == "slow":
            hang = CandidateVerdict(correct=False, reasons=["hang: no answer during verify within the 0.2 s timeout"],
                                    speedup=None)
            return cut_by_deadline(hang, 0.2)
        return super().evaluate(tier, source)


@pytest.mark.parametrize("refuse", ["fast", "slow"])
def test_a_candidate_the_runs_end_refused_or_cut_is_not_counted_or_remembered(board, refuse):
    fleet = ClockFleet(refuse)
    judge, _ = _judge(board, fleet, search_in=30, confirm_in=60)
    verdict = judge.evaluate(WINNER, author="offline-kernel-1")
    assert [t for t, _ in fleet.calls][-1] == refuse
    assert judge.tried == (0 if refuse == "fast" else 1) and not judge.accepted
    # nothing remembered: the next run (or this one, asked again) judges the source anew
    assert judge.run.memory.recalled(WINNER, judge.acceptor) is None
    if refuse == "fast":
        assert "budget is spent" in verdict.reasons[0]
        judge.evaluate(WINNER, author="offline-kernel-2")
        assert len(fleet.calls) == 2                    # asked again: evaluated again, not a remembered refusal
    else:
        assert verdict.correct and verdict.speedup == 1.233      # the fast verdict stands; its confirmation did not
    rows = judge.run.board.list_evaluations(judge.run.run_id).items
    assert rows and all(r.metrics.get("status") == "not judged" for r in rows)


def test_a_hang_under_a_timeout_the_deadline_shortened_is_the_budgets_not_the_candidates():
    from compiler.fleet.local import cut_by_deadline, unjudged
    hang = CandidateVerdict(correct=False, reasons=["hang: no answer during verify within the 0.2 s timeout"],
                            speedup=None)
    crash = CandidateVerdict(correct=False, reasons=["crash: executor died during verify (signal 11)"], speedup=None)
    cut = cut_by_deadline(hang, 0.2)
    assert unjudged(cut) and "cut at the run's end, 0.2 s in" in cut.reasons[0]
    assert cut_by_deadline(crash, 0.2) is crash and not unjudged(crash)      # a crash is the candidate's own
