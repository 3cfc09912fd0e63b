"""run_swarm on a real board with real (contract-checked) evaluations: shared work without doing an
idea twice, failures posted and never raised, the deadline, and the board-backed evaluator."""

import threading
import time

import pytest

from agents import Agent, AgentContext, board_evaluator, run_swarm
from llm_support import inline_judge, make_board

RMS = """import torch
def rms_norm(x, weight, eps):
    xf = x.float()
    return (xf * torch.rsqrt(xf.square().mean(-1, keepdim=True) + eps) * weight.float()).to(x.dtype)
OVERRIDES = {"rms_norm": rms_norm}
"""
SILU = """import torch
def silu_and_mul(x):
    g, u = x.chunk(2, dim=-1)
    return torch.nn.functional.silu(g) * u
OVERRIDES = {"silu_and_mul": silu_and_mul}
"""
WRONG = """import torch
def silu_and_mul(x):
    g, u = x.chunk(2, dim=-1)
    return torch.sigmoid(g) * u
OVERRIDES = {"silu_and_mul": silu_and_mul}
"""
IDEAS = {("fp32 rsqrt rms_norm", "rms_norm"): RMS, ("chunked silu", "silu_and_mul"): SILU,
         ("sigmoid gate", "silu_and_mul"): WRONG}


class ListAgent(Agent):
    """Posts the ideas of a fixed list (skipping ones on the board), claims any open idea, submits
    the source that goes with it, posts the verdict; nothing left once the pool is empty."""

    def __init__(self, name, ideas):
        super().__init__(name)
        self.ideas = ideas

    def run_once(self, ctx):
        for (title, target) in self.ideas:
            if not ctx.already_tried(title, target):
                ctx.board.post_idea(ctx.run_id, author=self.name, title=title, target=target)
        lease = ctx.claim(self.name)
        if lease is None:
            return False
        with lease:
            verdict = ctx.evaluate(self.ideas[(lease.idea.title, lease.idea.target)],
                                   author=self.name, idea_id=lease.idea_id)
            ctx.post(self.name, f"correct={verdict.correct} speedup={verdict.speedup}",
                     idea=lease.idea_id, kind="verdict")
        return True


class Crasher(Agent):
    def run_once(self, ctx):
        raise RuntimeError(f"{self.name} always fails")


class Forever(Agent):
    def run_once(self, ctx):
        time.sleep(0.02)
        return True


class Stuck(Agent):
    """Ignores the deadline: blocks well past the swarm's grace period."""

    def __init__(self, name):
        super().__init__(name)
        self.release = threading.Event()

    def run_once(self, ctx):
        self.release.wait(30)
        return False


@pytest.fixture()
def board_run(tmp_path):
    board = make_board(tmp_path)
    run = board.create_run(model="tiny-dense", hw="cpu", traffic_hash="h")
    yield board, run
    board.close()


def _ctx(board, run, evaluate, budget=60.0):
    return AgentContext(board=board, run_id=run.id, evaluate=evaluate, profile={}, points=[],
                        spec=None, ops={}, deadline=time.monotonic() + budget, lease_s=30)


def test_three_agents_share_the_work_and_no_idea_is_done_twice(board_run):
    board, run = board_run
    calls = []

    def engine(source, timeout_s):
        calls.append(source)
        return inline_judge(source)

    ctx = _ctx(board, run, board_evaluator(board, run.id, engine, device="cpu"))
    result = run_swarm([ListAgent(f"a{i}", IDEAS) for i in range(3)], ctx, budget_s=60)
    assert result.tried == 3 and result.correct == 2 and result.failures == 0
    assert len(calls) == 3 and sorted(calls) == sorted(IDEAS.values())
    ideas = board.list_ideas(run.id).items
    assert len(ideas) == 3 and all(i.status == "done" and i.claims == 1 for i in ideas)
    assert len(board.list_claims(run.id).items) == 3
    evals = board.list_evaluations(run.id).items
    assert sorted(e.verdict for e in evals) == ["correct", "correct", "rejected"]
    assert all(r.stopped == "exhausted" for r in result.agents)
    assert sum(r.tried for r in result.agents) == 3
    assert result.best is None or result.best["speedup"] == result.best_speedup > 1.0
    assert result.to_dict()["tried"] == 3


def test_failures_are_posted_never_raised_and_stop_the_failing_agent(board_run):
    board, run = board_run
    ctx = _ctx(board, run, board_evaluator(board, run.id, lambda s, t: inline_judge(s)))
    result = run_swarm([Crasher("bad"), ListAgent("good", {("chunked silu", "silu_and_mul"): SILU})],
                       ctx, budget_s=60, max_consecutive_failures=3, failure_backoff_s=0.01)
    bad, good = result.agents
    assert bad.failures == 3 and bad.stopped == "failures" and bad.cycles == 3
    assert good.stopped == "exhausted" and good.correct == 1
    posts = board.list_posts(run.id, kind="failure").items
    assert len(posts) == 3 and all("always fails" in p.body and p.author == "bad" for p in posts)


def test_stops_at_the_deadline_and_leaves_stuck_agents_behind(board_run):
    board, run = board_run
    stuck = Stuck("stuck")
    ctx = _ctx(board, run, board_evaluator(board, run.id, lambda s, t: inline_judge(s)))
    result = run_swarm([Forever("loop"), stuck], ctx, budget_s=0.5, grace_s=0.2)
    stuck.release.set()
    loop, st = result.agents
    assert loop.stopped == "deadline" and loop.cycles > 1
    assert st.stopped == "overran" and st.cycles == 0
    assert not ctx.stop.is_set()          # the caller's event is left alone


def test_caller_stop_event_ends_the_swarm(board_run):
    board, run = board_run
    ctx = _ctx(board, run, lambda *a, **k: None)
    threading.Timer(0.3, ctx.stop.set).start()
    result = run_swarm([Forever("loop")], ctx, budget_s=600)
    assert result.agents[0].stopped == "deadline" and result.elapsed_s < 600


def test_names_must_be_unique(board_run):
    board, run = board_run
    with pytest.raises(ValueError, match="unique"):
        run_swarm([Forever("x"), Forever("x")], _ctx(board, run, None), budget_s=1)


def test_board_evaluator_records_and_never_judges_a_source_twice(board_run):
    board, run = board_run
    calls = []

    def engine(source, timeout_s):
        calls.append(timeout_s)
        return inline_judge(source)

    evaluate = board_evaluator(board, run.id, engine, timeout_s=42, tier="fast", device="cpu",
                               timing_method="perf_counter_ns")
    idea = board.post_idea(run.id, author="a", title="t", target="rms_norm")
    v1 = evaluate(RMS, author="a", idea_id=idea.id)
    v2 = evaluate(RMS, author="b", idea_id=None)
    assert v1 is v2 and calls == [42] and v1.correct
    cand = board.get_candidate(board.list_evaluations(run.id).items[0].candidate_id)
    assert cand.source == RMS and cand.author == "a" and cand.idea_id == idea.id
    ev = board.list_evaluations(run.id).items
    assert len(ev) == 1 and ev[0].tier == "fast" and ev[0].timing_method == "perf_counter_ns"
    assert ev[0].speedup == pytest.approx(v1.speedup)
