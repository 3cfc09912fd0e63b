"""LLM agents through the real SDK clients against the scripted server (real HTTP on 127.0.0.1), a real
board and real verdicts (the engine supervisor on tiny-dense, CPU): a full cycle for the Anthropic and the
OpenAI agent, and HTTP 429 / 500, timeouts and malformed tool calls retried and then posted as failures
without crashing the swarm; the run's shared LLM budget stops every LLM agent with one line."""

import copy
import json
import time

import pytest

from agents import AgentContext, board_evaluator, op_catalog, run_swarm
from agents.llm import AnthropicAgent, AnthropicConfig, LLMBudget, OpenAIAgent, OpenAIConfig, SharedSpend
from agents.testing import ScriptedLLMServer
from llm_support import FIXTURES, make_board
from persistent_engine.io_struct import WorkloadPoint

RETRIES = 2
PRICE = (3.0, 15.0)
PROFILE = {"per_point": [{"point": {"phase": "decode", "batch": 4, "context": 256, "chunk": 1, "weight": 1.0},
                          "ops": {"linear": {"ms": 1.2}, "rms_norm": {"ms": 0.3}}}]}
POINTS = [WorkloadPoint(phase="decode", batch=4, context=256, chunk=1, weight=1.0)]


def _cycle(tag: str) -> list[dict]:
    """The recorded cycle, with this agent's own idea title and (so each is judged) sources."""
    steps = copy.deepcopy(json.loads((FIXTURES / "llm_cycle.json").read_text())["scripts"]
                          ["scripted-model"])
    for step in steps:
        for call in step.get("tool_calls", []):
            inp = call.get("input", {})
            if call["name"] == "post_idea":
                inp["title"] += f" ({tag})"
            if call["name"] == "submit_candidate":
                inp["source"] += f"# by {tag}\n"
    # the next cycle: the model has nothing more to try, so the agent stops
    return steps + [{"text": "Nothing left to try.", "usage": {"input": 10, "output": 1}}]


def _agent(provider, srv, model, timeout_s=30, **kw):
    if provider == "anthropic":
        return AnthropicAgent(f"claude-{model}", api_key="test-key", price=PRICE, **kw,
                              config=AnthropicConfig(model=model, base_url=srv.url, max_retries=RETRIES,
                                                     timeout_s=timeout_s))
    return OpenAIAgent(f"gpt-{model}", api_key="test-key", price=PRICE, **kw,
                       config=OpenAIConfig(model=model, base_url=srv.url + "/v1", max_retries=RETRIES,
                                           timeout_s=timeout_s))


def _ctx(board, run, evaluate, profile):
    return AgentContext(board=board, run_id=run.id, evaluate=evaluate, profile=profile, points=POINTS,
                        spec=None, ops=op_catalog(["rms_norm", "fused_add_rms_norm", "linear", "silu_and_mul"]),
                        deadline=time.monotonic() + 240, lease_s=30)


@pytest.fixture(scope="module")
def engine():
    from persistent_engine.supervisor import Supervisor
    sup = Supervisor("tiny-dense", device="cpu", points=POINTS, start_timeout_s=300)
    sup.start()
    yield sup
    sup.close()


@pytest.fixture()
def board_run(tmp_path):
    board = make_board(tmp_path)
    yield board, board.create_run(model="tiny-dense", hw="cpu", traffic_hash="h")
    board.close()


@pytest.fixture()
def ctx(board_run):
    """For cycles that never reach an evaluation."""
    board, run = board_run
    return _ctx(board, run, None, PROFILE)


def test_anthropic_and_openai_agents_each_complete_a_full_cycle(board_run, engine):
    board, run = board_run
    profile = engine.profile()
    ctx = _ctx(board, run, board_evaluator(board, run.id, engine.evaluate, timeout_s=120), profile)
    scripts = {"a": [{"fault": 429}, {"fault": 500}] + _cycle("a"), "o": _cycle("o")}
    with ScriptedLLMServer(scripts) as srv:
        agents = [_agent("anthropic", srv, "a"), _agent("openai", srv, "o")]
        result = run_swarm(agents, ctx, budget_s=200)
        assert srv.protocol_errors == [] and srv.remaining("a") == srv.remaining("o") == 0
    assert result.failures == 0 and result.tried == 4 and result.correct == 2
    run = run.id
    steps = _cycle("x")
    want_in = sum(s["usage"]["input"] for s in steps)
    want_out = sum(s["usage"]["output"] for s in steps)
    for agent, report in zip(agents, result.agents):
        assert report.tried == 2 and report.correct == 1 and report.failures == 0
        u = agent.usage()
        assert (u.input_tokens, u.output_tokens) == (want_in, want_out)
        assert u.cost_usd == pytest.approx((want_in * PRICE[0] + want_out * PRICE[1]) / 1e6)
        assert report.usage == u
        idea = board.list_ideas(run, author=agent.name).items[0]
        assert idea.status == "done" and idea.claims == 1 and idea.target == "fused_add_rms_norm"
        kinds = [p.kind for p in board.list_posts(run, idea=idea.id).items]
        assert kinds == ["verdict", "verdict", "learned"]
        evals = board.list_evaluations(run, sort="id").items
        mine = [e for e in evals if board.get_candidate(e.candidate_id).author == agent.name]
        assert [e.verdict for e in mine] == ["rejected", "correct"]
    assert result.usage.requests == 2 * len(steps)
    # the model saw the reference source and the verdicts through tool results
    sent = json.dumps([r.body for r in srv.requests if r.model == "a"])
    assert "def fused_add_rms_norm" in sent and "mismatch" in sent
    assert "attention_decode" in sent           # the engine's measured profile reached the model


@pytest.mark.parametrize("provider", ["anthropic", "openai"])
@pytest.mark.parametrize("fault", [429, 500])
def test_http_faults_are_retried_then_posted(ctx, provider, fault):
    tries = RETRIES + 1
    with ScriptedLLMServer({"m": [{"fault": fault, "times": tries}]}) as srv:
        agent = _agent(provider, srv, "m", budget=LLMBudget(max_failed_cycles=1))
        result = run_swarm([agent], ctx, budget_s=60)
        assert len(srv.requests) == tries and all(r.status == fault for r in srv.requests)
    report = result.agents[0]
    assert report.failures == 0 and report.stopped == "exhausted"     # posted, not raised
    post = ctx.board.list_posts(ctx.run_id, kind="failure").items[0]
    assert post.author == agent.name and f"HTTP {fault}" in post.body and f"{tries} attempts" in post.body


@pytest.mark.parametrize("provider", ["anthropic", "openai"])
def test_malformed_tool_calls_are_retried_then_posted(ctx, provider):
    bad = {"tool_calls": [{"name": "read_op", "raw": "{\"name\": rms"}]}
    idea = {"tool_calls": [{"name": "post_idea", "input": {"title": "t", "body": "b",
                                                           "target": "rms_norm"}}]}
    script = [idea, bad, dict(bad, expect=["malformed tool call"]), dict(bad, expect=["malformed"])]
    with ScriptedLLMServer({"m": script}) as srv:
        agent = _agent(provider, srv, "m", budget=LLMBudget(max_malformed=2, max_failed_cycles=1))
        result = run_swarm([agent], ctx, budget_s=60)
        assert srv.protocol_errors == [] and srv.remaining("m") == 0
    assert result.agents[0].failures == 0 and result.tried == 0
    post = ctx.board.list_posts(ctx.run_id, kind="failure").items[0]
    assert "malformed tool calls" in post.body and "read_op" in post.body
    held = ctx.board.list_ideas(ctx.run_id).items[0]
    assert held.status == "failed" and post.idea_id == held.id


def test_a_malformed_call_is_corrected_and_the_budget_stops_the_agent(ctx):
    script = [{"tool_calls": [{"name": "read_op", "input": {"nme": "rms_norm"}}],
               "usage": {"input": 1000, "output": 600}},           # $0.012 at PRICE
              {"tool_calls": [{"name": "read_op", "input": {"name": "rms_norm"}}],
               "expect": ["needs argument 'name'"]},
              {"tool_calls": [{"name": "post_idea", "input": {"title": "t", "body": "b",
                                                              "target": "rms_norm"}}],
               "expect": ["def rms_norm"]},
              {"text": "nothing to submit after all"}]
    with ScriptedLLMServer({"m": script}) as srv:
        agent = _agent("openai", srv, "m", budget=LLMBudget(max_cost_usd=0.015))
        result = run_swarm([agent], ctx, budget_s=60)
        assert srv.protocol_errors == [] and srv.remaining("m") == 0
    # 4 turns: 0.012 + 3 x 0.00105 (the server's default usage) >= 0.015, so the next cycle stops
    assert agent.usage().requests == 4 and agent.usage().cost_usd >= 0.015
    assert result.agents[0].stopped == "exhausted"
    notes = [p.body for p in ctx.board.list_posts(ctx.run_id).items]
    assert any(n.startswith("stopping: cost") for n in notes)
    assert ctx.board.list_ideas(ctx.run_id).items[0].status == "failed"   # claimed, never submitted


@pytest.mark.parametrize("provider", ["anthropic", "openai"])
def test_timeouts_are_retried_by_the_sdk_then_posted(ctx, provider):
    with ScriptedLLMServer({"m": [{"text": "late", "delay_s": 1.0, "times": RETRIES + 1}]}) as srv:
        agent = _agent(provider, srv, "m", timeout_s=0.3, budget=LLMBudget(max_failed_cycles=1))
        result = run_swarm([agent], ctx, budget_s=60)
        assert srv.remaining("m") == 0                  # every attempt arrived (and timed out)
    assert result.agents[0].failures == 0 and result.agents[0].stopped == "exhausted"
    post = ctx.board.list_posts(ctx.run_id, kind="failure").items[0]
    assert post.author == agent.name and f"timed out after {RETRIES + 1} attempts" in post.body


def test_the_shared_run_budget_stops_every_llm_agent_with_one_line(ctx):
    step = {"tool_calls": [{"name": "read_profile", "input": {}}], "usage": {"input": 4000, "output": 1000}}
    shared = SharedSpend(max_tokens=4000)
    with ScriptedLLMServer({"a": [step] * 4, "o": [step] * 4}) as srv:
        agents = [_agent("anthropic", srv, "a", shared=shared), _agent("openai", srv, "o", shared=shared)]
        result = run_swarm(agents, ctx, budget_s=60)
    # one turn (5000 tokens) spends it: no agent takes a second turn; one may not have started at all
    assert 1 <= shared.spent.requests <= 2 and all(a.usage().requests <= 1 for a in agents)
    assert shared.spent.tokens == 5000 * shared.spent.requests
    assert all(r.stopped == "exhausted" and r.failures == 0 for r in result.agents)
    lines = [p.body for p in ctx.board.list_posts(ctx.run_id, kind="stopped").items]
    assert len(lines) == 2 and all(ln.startswith("stopping: the run's LLM budget is spent: ")
                                   and ln.endswith("of 4000 tokens") for ln in lines)
    # the optimize loop repeats them (and the spend) on the terminal after the search
    import io

    from compiler.search.judging import per_agent, report_agents as _report_agents
    from compiler.search.progress import Progress
    out = io.StringIO()
    _report_agents(ctx.board, ctx.run_id, per_agent(result, {}), Progress(time.monotonic(), stream=out))
    shown = out.getvalue().splitlines()
    assert sorted(ln.split(":")[0] for ln in shown if "budget is spent" in ln) == ["[tkcc] claude-a", "[tkcc] gpt-o"]
    assert shown[-1] == f"[tkcc] LLM agents: {shared.spent.tokens} tokens, ${shared.spent.cost_usd:.4f}, " \
                        "0 candidates, 0 accepted"
    recorded = {r["name"]: r for r in ctx.board.get_run(ctx.run_id).config["agent_reports"]}
    assert sum(r["requests"] for r in recorded.values()) == shared.spent.requests


@pytest.mark.parametrize("provider", ["anthropic", "openai"])
def test_a_cycle_without_an_idea_or_a_candidate_says_why_the_agent_stops(ctx, provider):
    """A small model that answers in prose (no tool call) ends the agent with one post quoting it."""
    prose = "You can use the following code to create a new function that takes a function " * 4
    with ScriptedLLMServer({"m": [{"tool_calls": [{"name": "read_profile", "input": {}}]}, {"text": prose}]}) as srv:
        result = run_swarm([_agent(provider, srv, "m")], ctx, budget_s=60)
        assert srv.remaining("m") == 0
    assert result.agents[0].stopped == "exhausted" and result.tried == 0
    (post,) = ctx.board.list_posts(ctx.run_id, kind="stopped").items
    assert post.body.startswith("stopping: the model ended its cycle with neither an idea nor a candidate; "
                                "its answer: 'You can use the following code")
    assert len(post.body) < 320
