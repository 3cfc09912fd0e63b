"""The Agent contract (``agents.Agent``, agents/base.py's docstring), run against every implementation:
the offline kernel searcher, the random control search and the Anthropic and OpenAI LLM agents (real SDK clients against the
scripted server on 127.0.0.1), each on a real SQLite board. What every agent must do whatever it is:
be an ``Agent`` with a name, a kind and a ``Usage``; evaluate nothing once its context has expired; and
never raise out of ``run_once`` when the evaluation itself fails (the engine gone)."""

from __future__ import annotations

import copy
import json
import time

import pytest

from agents import Agent, AgentContext, Usage, op_catalog
from agents.llm import AnthropicAgent, AnthropicConfig, OpenAIAgent, OpenAIConfig
from agents.offline import KernelSearchAgent, OfflineTeam, RandomPool, RandomSearchAgent
from agents.testing import ScriptedLLMServer
from bulletin_board import Board
from llm_support import FIXTURES
from persistent_engine.models.spec import ModelSpec
from persistent_engine.io_struct import WorkloadPoint

POINT = WorkloadPoint(phase="decode", batch=4, context=256, chunk=1, weight=1.0)
PROFILE = {"per_point": [{"point": POINT.to_dict(), "ops": {"silu_and_mul": {"ms": 0.6}, "rms_norm": {"ms": 0.3},
                                                   "fused_add_rms_norm": {"ms": 0.3}}}]}
IMPLEMENTATIONS = ["kernel-search", "random", "anthropic", "openai"]


def _script() -> list[dict]:
    """The recorded LLM cycle (reads, an idea, two submissions, what it learned)."""
    return copy.deepcopy(json.loads((FIXTURES / "llm_cycle.json").read_text())["scripts"]["scripted-model"])


@pytest.fixture(params=IMPLEMENTATIONS)
def make_agent(request):
    """``make_agent()`` -> a fresh agent of this implementation (LLM ones talk to a scripted server)."""
    if request.param == "kernel-search":
        yield lambda: KernelSearchAgent("kernel-0", OfflineTeam(device="cpu"))
        return
    if request.param == "random":
        yield lambda: RandomSearchAgent("random-0", RandomPool("cpu", seed=0))
        return
    with ScriptedLLMServer({"m": _script() * 2}) as srv:
        if request.param == "anthropic":
            yield lambda: AnthropicAgent("claude-0", api_key="test-key", config=AnthropicConfig(
                model="m", base_url=srv.url, max_retries=0, timeout_s=30))
        else:
            yield lambda: OpenAIAgent("gpt-0", api_key="test-key", config=OpenAIConfig(
                model="m", base_url=srv.url + "/v1", max_retries=0, timeout_s=30))


@pytest.fixture
def board(tmp_path):
    b = Board(f"sqlite:///{tmp_path / 'board.db'}")
    yield b
    b.close()


def _ctx(board: Board, evaluate, deadline_s: float) -> AgentContext:
    run = board.create_run(model="tiny-dense", hw="cpu", traffic_hash="t")
    return AgentContext(board=board, run_id=run.id, evaluate=evaluate, profile=PROFILE, points=[POINT],
                        spec=ModelSpec.from_name("tiny-dense"), ops=op_catalog(), hw="cpu",
                        deadline=time.monotonic() + deadline_s, lease_s=30)


def test_it_is_an_agent_with_a_name_a_kind_and_a_usage(make_agent):
    agent = make_agent()
    assert isinstance(agent, Agent) and agent.name and agent.kind in ("program", "llm")
    u = agent.usage()
    assert isinstance(u, Usage) and u.input_tokens == u.output_tokens == u.requests == 0 and u.cost_usd == 0


def test_an_expired_context_evaluates_nothing(make_agent, board):
    calls = []
    ctx = _ctx(board, lambda source, **kw: calls.append(source), deadline_s=-1.0)
    t0 = time.monotonic()
    assert isinstance(make_agent().run_once(ctx), bool)
    assert calls == [] and time.monotonic() - t0 < 30


def test_a_failing_evaluation_is_never_raised_out_of_run_once(make_agent, board):
    calls = []

    def engine_gone(source, **kw):
        calls.append(source)
        raise ConnectionError("the engine is gone")

    ctx = _ctx(board, engine_gone, deadline_s=120.0)
    agent = make_agent()
    for _ in range(3):                          # a few cycles: the LLM script submits in its fourth step
        if not agent.run_once(ctx) or calls:
            break
    assert calls, "no cycle reached an evaluation"
