"""LLM agents: a model that reads the profile and the board through tools, posts an idea, writes a
candidate, submits it and says what it learned.

One cycle (``run_once``): claim an open idea if there is one (else the model posts one and the agent
claims then), then a tool-use conversation of at most ``budget.max_turns`` model turns. HTTP 429/5xx
and malformed responses are retried inside the client (``agents.llm.http``); a malformed tool call
is answered with an error result so the model can correct it, up to ``max_malformed`` turns in a
row. When either runs out, the failure is posted to the board, the idea is finished "failed", and
the cycle returns normally: nothing is raised into the swarm. Tokens and dollars are counted per
agent; past the budget the agent reports it has nothing left to try.
"""

from __future__ import annotations

import itertools
import logging
import threading
from dataclasses import dataclass
from typing import Any, Protocol

from agents.base import Agent, AgentContext, Usage
from agents.llm.anthropic import AnthropicChat, AnthropicConfig
from agents.llm.messages import (LLMError, LLMReply, MalformedToolCalls, Message, ToolSpec)
from agents.llm.openai import OpenAIChat, OpenAIConfig
from agents.llm.pricing import cost_usd, price_of
from agents.llm.tools import TOOLS, ToolBox
from agents import prompts

log = logging.getLogger("tkcc.agents.llm")


class ChatModel(Protocol):
    provider: str
    model: str

    def complete(self, system: str, messages: list[Message], tools: list[ToolSpec], *,
                 stop: threading.Event | None = None) -> LLMReply: ...


@dataclass(frozen=True)
class LLMBudget:
    """Limits of one agent: dollars and tokens over the whole run (None: no limit), model turns per
    cycle, consecutive malformed-tool-call turns, consecutive failed cycles before it gives up."""

    max_cost_usd: float | None = 5.0
    max_tokens: int | None = None
    max_turns: int = 16
    max_malformed: int = 2
    max_failed_cycles: int = 3


class LLMAgent(Agent):
    """An agent driven by any :class:`ChatModel` (Anthropic or OpenAI wire format)."""

    def __init__(self, name: str, chat: ChatModel, *, budget: LLMBudget = LLMBudget(),
                 price: tuple[float, float] | None = None, system: str = prompts.SYSTEM):
        super().__init__(name)
        self.chat, self.budget, self.system = chat, budget, system
        self.price = price if price is not None else price_of(chat.model)
        self._usage = Usage()
        self._lock = threading.Lock()
        self._failed_cycles = 0

    def usage(self) -> Usage:
        with self._lock:
            return self._usage

    def over_budget(self) -> str | None:
        u, b = self.usage(), self.budget
        if b.max_cost_usd is not None and u.cost_usd >= b.max_cost_usd:
            return f"cost ${u.cost_usd:.4f} reached the budget ${b.max_cost_usd:.2f}"
        if b.max_tokens is not None and u.input_tokens + u.output_tokens >= b.max_tokens:
            return f"{u.input_tokens + u.output_tokens} tokens reached the budget {b.max_tokens}"
        return None

    def _account(self, reply: LLMReply) -> None:
        with self._lock:
            self._usage = self._usage + Usage(reply.tokens.input_tokens, reply.tokens.output_tokens,
                                              cost_usd(reply.tokens, self.price), 1)

    def run_once(self, ctx: AgentContext) -> bool:
        if (why := self.over_budget()) is not None:
            ctx.post(self.name, f"stopping: {why}")
            return False
        if self._failed_cycles >= self.budget.max_failed_cycles:
            return False
        lease = ctx.claim(self.name)
        box = ToolBox(ctx, self.name, lease)
        try:
            learned = self._converse(ctx, box)
        except LLMError as exc:
            self._failed_cycles += 1
            ctx.post_failure(self.name, f"LLM cycle failed ({self.chat.provider} {self.chat.model})",
                             exc, idea=box.idea_id)
            if box.lease is not None:
                box.lease.finish("failed")
            return self._failed_cycles < self.budget.max_failed_cycles
        except BaseException:
            if box.lease is not None:
                box.lease.finish("failed")
            raise
        self._failed_cycles = 0
        if learned and (box.verdicts or box.ideas_posted):
            ctx.post(self.name, learned, idea=box.idea_id, kind="learned")
        if box.lease is not None:
            box.lease.finish("done" if box.verdicts else "failed")
        # a cycle in which the model neither posted nor submitted anything: it has nothing left
        return bool(box.verdicts or box.ideas_posted)

    def _converse(self, ctx: AgentContext, box: ToolBox) -> str:
        """The tool-use loop; returns the model's closing text (what it learned)."""
        ideas = getattr(ctx.board.list_ideas(ctx.run_id, sort="-id", limit=30), "items", ())
        held = None if box.lease is None else box.lease.idea
        messages = [Message("user", prompts.cycle_prompt(ctx, ideas=ideas, held=held))]
        tools = list(TOOLS)
        malformed = 0
        for _turn in range(self.budget.max_turns):
            if ctx.expired():
                return ""
            reply = self.chat.complete(self.system, messages, tools, stop=ctx.stop)
            self._account(reply)
            messages.append(reply.as_message())
            if not reply.tool_calls:
                return reply.text.strip()
            bad = [c for c in reply.tool_calls if c.error is not None]
            malformed = malformed + 1 if len(bad) == len(reply.tool_calls) else 0
            if malformed > self.budget.max_malformed:
                raise MalformedToolCalls(f"{malformed} turns of malformed tool calls in a row, last: "
                                         f"{bad[-1].name}: {bad[-1].error}", attempts=malformed)
            results = tuple(box.run(c) for c in reply.tool_calls)
            messages.append(Message("user", tool_results=results))
            if self.over_budget() is not None:
                return ""
        return ""


_counter = itertools.count(1)


class AnthropicAgent(LLMAgent):
    """An LLM agent on the Anthropic Messages API; key from ``ANTHROPIC_API_KEY``."""

    def __init__(self, name: str | None = None, *, config: AnthropicConfig | None = None,
                 api_key: str | None = None, **kwargs: Any):
        super().__init__(name or f"claude-{next(_counter)}", AnthropicChat(config, api_key=api_key),
                         **kwargs)


class OpenAIAgent(LLMAgent):
    """An LLM agent on OpenAI chat completions or any compatible ``base_url``; key from
    ``OPENAI_API_KEY``."""

    def __init__(self, name: str | None = None, *, config: OpenAIConfig | None = None,
                 api_key: str | None = None, **kwargs: Any):
        super().__init__(name or f"openai-{next(_counter)}", OpenAIChat(config, api_key=api_key),
                         **kwargs)
