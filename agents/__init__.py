"""agents: the Agent protocol, the swarm runner, LLM agents and (under ``agents.offline``) the
built-in search agents. Importing this package imports neither torch nor httpx; the LLM agents load
on first use (``agents.AnthropicAgent``)."""

from agents.base import Agent, AgentContext, Lease, OpInfo, Usage, is_faster, op_catalog, verdict_summary
from agents.swarm import AgentReport, SwarmResult, board_evaluator, run_swarm

_LAZY = {
    "LLMAgent": "agents.llm.agent",
    "AnthropicAgent": "agents.llm.agent",
    "OpenAIAgent": "agents.llm.agent",
    "LLMBudget": "agents.llm.agent",
}

__all__ = ["Agent", "AgentContext", "AgentReport", "Lease", "OpInfo", "SwarmResult", "Usage",
           "board_evaluator", "is_faster", "op_catalog", "run_swarm", "verdict_summary", *_LAZY]


def __getattr__(name: str):
    if name in _LAZY:
        import importlib
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'agents' has no attribute {name!r}")
