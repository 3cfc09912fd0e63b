"""LLM agents: a model that reads the profile, the roofline, the templates, other candidates and the
board through tools, posts an idea, writes a candidate (possibly a child of another one), submits it
and says what it learned.

One cycle (``run_once``): claim an open free-text idea if there is one (structured "template X with
knobs Y" ideas are left to the offline template searchers; else the model posts one and the agent
claims then), then a tool-use conversation of at most ``budget.max_turns`` model turns. HTTP 429/5xx,
timeouts and connection errors are retried by the SDK client (``max_retries``), malformed response
bodies by ``agents.llm.sdk``; a malformed tool call is answered with an error result so the model can
correct it, up to ``max_malformed`` turns in a row. When either runs out, the failure is posted to the
board, the idea is finished "failed", and the cycle returns normally: nothing is raised into the swarm.

Cost control: tokens and dollars are counted per agent from the SDK responses' ``usage``; an agent
stops (posting one line that says why) past its own :class:`LLMBudget` or past the run's
:class:`SharedSpend`, the one budget all LLM agents of a run draw on (``--llm-budget-usd``,
``--llm-budget-tokens``).
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
from agents.llm.tools import TOOLS, ToolBox, claim_free_text
from agents import prompts

log = logging.getLogger("tkcc.agents.llm")


class ChatModel(Protocol):
    """One model endpoint: ``complete`` sends the conversation and returns the next turn, raising
    :class:`LLMError` (never anything else) when no usable answer came after the retries."""

    provider: str
    model: str

    def complete(self, system: str, messages: list[Message], tools: list[ToolSpec]) -> LLMReply: ...


class SharedSpend:
    """The run's LLM budget, drawn on by every LLM agent of the swarm (thread-safe): dollars and
    tokens (None: no limit). ``over()`` says why no more may be spent, or None."""

    def __init__(self, max_cost_usd: float | None = None, max_tokens: int | None = None):
        self.max_cost_usd, self.max_tokens = max_cost_usd, max_tokens
        self._spent = Usage()
        self._lock = threading.Lock()

    def charge(self, usage: Usage) -> None:
        with self._lock:
            self._spent = self._spent + usage

    @property
    def spent(self) -> Usage:
        with self._lock:
            return self._spent

    def over(self) -> str | None:
        u = self.spent
        if self.max_cost_usd is not None and u.cost_usd >= self.max_cost_usd:
            return f"the run's LLM budget is spent: ${u.cost_usd:.4f} of ${self.max_cost_usd:.2f}"
        if self.max_tokens is not None and u.tokens >= self.max_tokens:
            return f"the run's LLM budget is spent: {u.tokens} of {self.max_tokens} tokens"
        return None


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
    """An agent driven by any :class:`ChatModel` (the Anthropic or the OpenAI SDK)."""

    kind = "llm"

    def __init__(self, name: str, chat: ChatModel, *, budget: LLMBudget = LLMBudget(),
                 price: tuple[float, float] | None = None, system: str = prompts.SYSTEM,
                 shared: SharedSpend | None = None):
        super().__init__(name)
        self.chat, self.budget, self.system, self.shared = chat, budget, system, shared
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
        if b.max_tokens is not None and u.tokens >= b.max_tokens:
            return f"{u.tokens} tokens reached the budget {b.max_tokens}"
        return None if self.shared is None else self.shared.over()

    def _account(self, reply: LLMReply) -> None:
        t = reply.tokens
        spent = Usage(t.input_tokens, t.output_tokens, cost_usd(t, self.price, self.chat.provider), 1,
                      t.cache_read_tokens + t.cache_write_tokens)
        with self._lock:
            self._usage = self._usage + spent
        if self.shared is not None:
            self.shared.charge(spent)

    def run_once(self, ctx: AgentContext) -> bool:
        if (why := self.over_budget()) is not None:
            ctx.post(self.name, f"stopping: {why}", kind="stopped")
            return False
        if self._failed_cycles >= self.budget.max_failed_cycles:
            return False
        lease = claim_free_text(ctx, self.name)
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
        if (why := self.over_budget()) is not None:      # spent during this cycle: say so once
            ctx.post(self.name, f"stopping: {why}", kind="stopped")
            return False
        if box.verdicts or box.ideas_posted or ctx.expired():
            return bool(box.verdicts or box.ideas_posted)
        # a cycle in which the model neither posted nor submitted anything: it has nothing left
        said = " ".join(learned.split())[:200]
        ctx.post(self.name, "stopping: the model ended its cycle with neither an idea nor a candidate"
                 + (f"; its answer: {said!r}" if said else ""), idea=box.idea_id, kind="stopped")
        return False

    def _converse(self, ctx: AgentContext, box: ToolBox) -> str:
        """The tool-use loop; returns the model's closing text (what it learned)."""
        ideas = getattr(ctx.board.list_ideas(ctx.run_id, sort="-id", limit=30), "items", ())
        posts = getattr(ctx.board.list_posts(ctx.run_id, sort="-id", limit=12), "items", ())
        held = None if box.lease is None else box.lease.idea
        messages = [Message("user", prompts.cycle_prompt(ctx, ideas=ideas, held=held, posts=posts))]
        tools = list(TOOLS)
        malformed = 0
        for _turn in range(self.budget.max_turns):
            if ctx.expired():
                return ""
            reply = self.chat.complete(self.system, messages, tools)
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
        name = name or f"claude-{next(_counter)}"
        super().__init__(name, AnthropicChat(config, api_key=api_key, agent=name), **kwargs)


class OpenAIAgent(LLMAgent):
    """An LLM agent on the OpenAI Responses API or chat completions, or any compatible ``base_url``;
    key from ``OPENAI_API_KEY``."""

    def __init__(self, name: str | None = None, *, config: OpenAIConfig | None = None,
                 api_key: str | None = None, **kwargs: Any):
        name = name or f"openai-{next(_counter)}"
        super().__init__(name, OpenAIChat(config, api_key=api_key, agent=name), **kwargs)
