"""A swarm that builds on itself. A recorded conversation (its candidate ids filled in at run time: they
are content hashes) through the real SDK clients against the scripted server: an offline template agent
finds and has accepted an rms_norm candidate; an LLM agent reads the board (the offline agent's result is in
its first prompt), lists the accepted candidates, reads that one's source, submits a child of it; the child
is judged, linked to its parent on the board (parent_id, author kind "llm", Board.lineage) and in the UI
(the candidate pages link parent and child, the run page shows who built on whom). And the other way round:
an idea an LLM agent posts as "template X with knobs Y" is worked by an offline agent."""

import json
import time

import httpx
import pytest

from agents import AgentContext, board_evaluator, op_catalog, run_swarm
from agents.llm import AnthropicAgent, AnthropicConfig, OpenAIAgent, OpenAIConfig
from agents.offline import make_offline_agents
from agents.testing import ScriptedLLMServer
from llm_support import inline_judge, make_board
from persistent_engine.io_struct import WorkloadPoint

POINTS = [WorkloadPoint(phase="decode", batch=4, context=64, chunk=1, weight=1.0)]
PROFILE = {"per_point": [{"point": POINTS[0].to_dict(), "ops": {"rms_norm": {"ms": 0.5}, "linear": {"ms": 2.0}}}]}


def _correct(verdict) -> bool:
    """This test's acceptance: correct (the compiler's own also asks for a measured gain on both tiers)."""
    return bool(verdict.correct)


@pytest.fixture()
def swarm_ctx(tmp_path):
    board = make_board(tmp_path)
    run = board.create_run(model="tiny-dense", hw="cpu", traffic_hash="h")
    evaluate = board_evaluator(board, run.id, lambda src, t: inline_judge(src), accept=_correct)
    ctx = AgentContext(board=board, run_id=run.id, evaluate=evaluate, profile=PROFILE, points=POINTS, spec=None,
                       ops=op_catalog(["rms_norm", "linear"]), deadline=time.monotonic() + 120, lease_s=30,
                       hw="cpu")
    yield ctx, tmp_path / "board.db"
    board.close()


def _offline_candidate(ctx):
    """One cycle of an offline template agent on rms_norm: its candidate and verdict are on the board."""
    offline = make_offline_agents(1, device="cpu")[0]
    assert offline.run_once(_counted(ctx, offline))
    (cand,) = ctx.board.list_candidates(ctx.run_id).items
    return offline, cand


def _counted(ctx, agent):
    """The context the swarm would hand ``agent`` (its evaluate marks the author kind)."""
    def evaluate(source, *, author=None, idea_id=None, parent=None):
        return ctx.evaluate(source, author=author or agent.name, idea_id=idea_id, parent=parent,
                            author_kind=agent.kind)
    return ctx.replace(evaluate=evaluate, ops=op_catalog(["rms_norm"]))


def _llm(provider, srv):
    if provider == "anthropic":
        return AnthropicAgent("claude-0", api_key="test-key", price=(3.0, 15.0),
                              config=AnthropicConfig(model="m", base_url=srv.url, max_retries=1))
    return OpenAIAgent("gpt-0", api_key="test-key", price=(2.0, 8.0),
                       config=OpenAIConfig(model="m", base_url=srv.url + "/v1", max_retries=1, api="responses"))


def _conversation(offline_name: str, parent_id: str, child_source: str) -> list[dict]:
    return [
        {"text": "The offline search found something; what was accepted?",
         "tool_calls": [{"name": "read_candidates", "input": {"verdict": "accepted"}}],
         "expect": [offline_name, "Latest posts"]},                 # it read the others' posts first
        {"tool_calls": [{"name": "read_candidate", "input": {"id": parent_id}}], "expect": [parent_id]},
        {"tool_calls": [{"name": "post_idea", "input": {
            "title": "build on the offline rms_norm", "target": "rms_norm",
            "body": "keep its kernel, document the change"}}], "expect": ["OVERRIDES", '"verdict":"accepted"']},
        {"tool_calls": [{"name": "submit_candidate", "input": {"source": child_source, "parent": parent_id}}],
         "expect": ["holding"]},
        {"text": "A child of the offline rms_norm candidate holds up.", "expect": ['"correct":true']},
        {"text": "Nothing left to try."},
    ]


@pytest.mark.parametrize("provider", ["anthropic", "openai"])
def test_an_llm_agent_builds_a_child_of_an_accepted_offline_candidate(swarm_ctx, provider):
    from compiler.ui.app import UIConfig
    from compiler.ui.server import UIServer

    ctx, db = swarm_ctx
    offline, parent = _offline_candidate(ctx)
    evals = ctx.board.list_evaluations(candidate=parent.id).items
    assert parent.author_kind == "program" and evals[0].verdict == "correct" and evals[0].metrics["accepted"]
    child_source = parent.source + "\n# child: the offline kernel, reviewed by an LLM agent\n"
    script = _conversation(offline.name, parent.id, child_source)
    with ScriptedLLMServer({"m": script}) as srv:
        llm = _llm(provider, srv)
        result = run_swarm([llm], ctx, budget_s=90)
        assert srv.protocol_errors == [] and srv.remaining("m") == 0
    assert result.failures == 0 and result.tried == 1 and result.correct == 1

    kids = ctx.board.list_candidates(ctx.run_id, parent=parent.id).items
    assert len(kids) == 1
    child = kids[0]
    assert (child.author, child.author_kind, child.parent_id, child.source) == (llm.name, "llm", parent.id,
                                                                                child_source)
    assert ctx.board.list_evaluations(candidate=child.id).items[0].verdict == "correct"
    assert ctx.board.lineage(ctx.run_id) == [{"parent": parent.id, "child": child.id,
                                              "parent_author": offline.name, "child_author": llm.name,
                                              "child_kind": "llm"}]
    verdicts = [p.body for p in ctx.board.list_posts(ctx.run_id, kind="verdict").items]
    speedup = ctx.board.list_evaluations(candidate=child.id).items[0].speedup
    assert verdicts == [f"verdict: correct, speedup {speedup:.3f}x, child of {parent.id[:12]}"]

    from compiler.search.judging import per_agent, report_agents as _report_agents
    from compiler.search.progress import Progress
    progress = Progress(time.monotonic() + 1, quiet=True)
    _report_agents(ctx.board, ctx.run_id, per_agent(result, {}), progress)   # as the loop does after the search

    with UIServer(UIConfig(board=f"sqlite:///{db}")) as server, httpx.Client(base_url=server.url, timeout=30) as c:
        page = c.get(f"/candidates/{child.id}").text
        assert f'class="parent" href="/candidates/{parent.id}"' in page and "written by" in page and "llm" in page
        assert f'class="child" href="/candidates/{child.id}"' in c.get(f"/candidates/{parent.id}").text
        run_page = c.get(f"/runs/{ctx.run_id}").text
        lineage = run_page[run_page.index('id="lineage"'):]
        assert offline.name in lineage and llm.name in lineage and f"/candidates/{child.id}" in lineage
        agents = run_page[run_page.index('id="agents"'):run_page.index('id="lineage"')]
        u = llm.usage()
        assert llm.name in agents and f"<td class=\"num\">{u.input_tokens}</td>" in agents
        assert f"${u.cost_usd:.4f}" in agents and u.cost_usd > 0


def test_an_offline_agent_works_a_template_idea_posted_by_an_llm_agent(swarm_ctx):
    ctx, _ = swarm_ctx
    script = [{"tool_calls": [{"name": "read_templates", "input": {}}]},
              {"tool_calls": [{"name": "read_templates", "input": {"name": "rms_norm.torch_fused"}}],
               "expect": ["rms_norm.torch_fused"]},
              {"tool_calls": [{"name": "post_idea", "input": {
                  "title": "rms_norm.torch_fused at its defaults", "target": "rms_norm", "body": "cheap to try",
                  "template": "rms_norm.torch_fused", "knobs": {}, "point": POINTS[0].to_dict()}}],
               "expect": ["knob_space", "OVERRIDES"]},
              {"text": "Posted for the template searchers.", "expect": ["template searchers"]}]
    with ScriptedLLMServer({"m": script}) as srv:
        llm = _llm("anthropic", srv)
        run_swarm([llm], ctx, budget_s=60)
        assert srv.protocol_errors == [] and srv.remaining("m") == 0
    (idea,) = ctx.board.list_ideas(ctx.run_id).items
    body = json.loads(idea.body)
    assert (idea.author, idea.status, body["kind"], body["template"]) == (llm.name, "open", "template",
                                                                          "rms_norm.torch_fused")
    offline = make_offline_agents(1, device="cpu")[0]
    offline.exhausted = True                         # works what is on the board, proposes nothing
    assert offline.run_once(_counted(ctx, offline))
    idea = ctx.board.get_idea(idea.id)
    assert idea.status == "done" and idea.claimed_by == offline.name
    (cand,) = ctx.board.list_candidates(ctx.run_id, idea=idea.id).items
    assert cand.author == offline.name and "rms_norm" in cand.source
    result = json.loads(ctx.board.list_posts(ctx.run_id, idea=idea.id, kind="result").items[0].body)
    assert result["template"] == "rms_norm.torch_fused" and result["correct"] is True
