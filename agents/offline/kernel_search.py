"""The kernel-template search agent: turns the profile into template ideas and works them.

One cycle (``run_once``):

1. **Propose**: the strategy (bandit or evolution, :mod:`agents.offline.strategy`) picks up to
   ``ideas_per_cycle`` template settings not yet on the board, steered to the ops that cost the
   most. Each is posted as an idea: title ``<template>{knob=value,...}``, target the op, body a JSON
   document (``{"template", "op", "knobs", "why"}``), tag ``template``, priority the op's share of
   the step (so any agent claims the costliest ideas first). The board keeps one idea per (target,
   title), so agents proposing the same setting post it once and it is worked once.
2. **Claim** the open idea of highest priority (any agent's). A template idea is rendered as is; a
   free-text idea whose target is an op with templates (e.g. an LLM agent's "speed up rms_norm") is
   worked as the best untried setting for that op; anything else is finished as failed with a post.
3. **Evaluate** the rendered candidate through ``ctx.evaluate`` (the engine: verification, timing).
4. **Post** the verdict (kind ``result``, JSON: choice, correct, speedup, reasons) and record the
   reward in the search state; the idea is finished "done" when correct, "failed" otherwise.

Agents built by :func:`make_kernel_agents` share one :class:`SearchState` (agents of one swarm run
as threads of one process), so a good setting found by one is mutated by all. ``run_once``
returns False once nothing is left to propose and nothing is open to claim.
"""

from __future__ import annotations

import json
import logging
import random
import threading
from dataclasses import dataclass

from agents.base import Agent, AgentContext, verdict_summary
from agents.offline.strategy import STRATEGIES, SearchState, Strategy, op_shares, reward_of
from agents.templates import Choice, Template, TemplateError, dims_of, get_template, render_candidate, templates_for

log = logging.getLogger("tkcc.agents")

IDEA_TAG = "template"


@dataclass(frozen=True)
class KernelSearchConfig:
    """``device``: which templates are worth timing ("cpu" or "cuda"); ``strategy``: "bandit" or
    "evolution"; ``min_share``: ops below this fraction of the step are not searched."""

    device: str = "cpu"
    strategy: str = "bandit"
    ideas_per_cycle: int = 1
    min_share: float = 1e-3
    seed: int = 0

    def __post_init__(self):
        if self.strategy not in STRATEGIES:
            raise ValueError(f"unknown strategy {self.strategy!r}; known: {', '.join(STRATEGIES)}")
        if self.device not in ("cpu", "cuda"):
            raise ValueError(f"device must be 'cpu' or 'cuda', not {self.device!r}")


class SharedSearch:
    """Search state shared by the agents of one process, with the lock that guards it."""

    def __init__(self) -> None:
        self.state = SearchState()
        self.lock = threading.Lock()
        self.tried: set[str] = set()          # choice keys posted or worked by any sharing agent


class KernelSearchAgent(Agent):
    def __init__(self, name: str, config: KernelSearchConfig = KernelSearchConfig(),
                 shared: SharedSearch | None = None):
        super().__init__(name)
        self.config = config
        self.shared = shared or SharedSearch()
        self.rng = random.Random(f"{config.seed}:{name}")
        self.strategy: Strategy = STRATEGIES[config.strategy](min_share=config.min_share)
        self._exhausted = False

    # ------------------------------------------------------------------ context views
    def arms(self, ctx: AgentContext) -> list[Template]:
        known = set(ctx.ops) if ctx.ops else None
        return [t for t in templates_for(device=self.config.device) if known is None or t.op in known]

    def shares(self, ctx: AgentContext, arms: list[Template]) -> dict[str, float]:
        """Share of step time per op with a template; uniform when the profile says nothing."""
        ops = {t.op for t in arms}
        shares = {op: s for op, s in op_shares(ctx.profile).items() if op in ops}
        if not shares:
            shares = {op: 1.0 / len(ops) for op in ops} if ops else {}
        return shares

    # ------------------------------------------------------------------ one cycle
    def run_once(self, ctx: AgentContext) -> bool:
        arms = self.arms(ctx)
        shares = self.shares(ctx, arms)
        dims = dims_of(ctx.spec)
        proposed = 0
        for _ in range(self.config.ideas_per_cycle):
            if ctx.expired() or self._exhausted:
                break
            if self._propose(ctx, arms, shares, dims):
                proposed += 1
        if ctx.expired():
            return True
        lease = ctx.claim(self.name)
        if lease is None:
            return not self._exhausted or proposed > 0
        try:
            self._work(ctx, lease, arms, shares, dims)
        except Exception as exc:  # noqa: BLE001 - posted, never raised into the swarm
            ctx.post_failure(self.name, "kernel search cycle failed", exc, idea=lease.idea_id)
            lease.finish("failed")
        return True

    def _propose(self, ctx: AgentContext, arms, shares, dims, op: str | None = None) -> Choice | None:
        """Post one new idea (or, with ``op``, pick one for that op without posting); None when spent."""
        pool = [t for t in arms if op is None or t.op == op]
        with self.shared.lock:
            for _ in range(50):
                choice = self.strategy.propose(pool, shares, self.shared.state, self.shared.tried, dims, self.rng)
                if choice is None:
                    if op is None:
                        self._exhausted = True
                    return None
                self.shared.tried.add(choice.key())
                if not _tried_on_board(ctx, choice):
                    break
            else:
                return None
        if op is None:
            share = shares.get(choice.op, 0.0)
            body = json.dumps({**choice.to_dict(), "why": f"{choice.op} takes {share:.1%} of the step; "
                                                          f"{choice.template.description}"})
            ctx.board.post_idea(ctx.run_id, author=self.name, title=choice.key(), body=body,
                                target=choice.op, tags=[IDEA_TAG, choice.template.backend],
                                priority=round(share, 6))
        return choice

    def _work(self, ctx: AgentContext, lease, arms, shares, dims) -> None:
        idea = lease.idea
        choice = parse_idea(getattr(idea, "body", ""))
        if choice is None:
            target = getattr(idea, "target", None)
            if target in {t.op for t in arms}:
                choice = self._propose(ctx, arms, {target: 1.0}, dims, op=target)
            if choice is None:
                ctx.post(self.name, f"offline kernel search has no template setting left for "
                                    f"{target or 'an idea without a target op'}", idea=lease.idea_id)
                lease.finish("failed")
                return
        bad = choice.template.check(choice.knobs, dims)
        if bad:
            ctx.post(self.name, "invalid template setting: " + "; ".join(bad), idea=lease.idea_id,
                     kind="failure")
            lease.finish("failed")
            return
        source = render_candidate([choice])
        verdict = ctx.evaluate(source, author=self.name, idea_id=lease.idea_id)
        reward = reward_of(verdict)
        with self.shared.lock:
            self.shared.tried.add(choice.key())
            self.shared.state.record(choice, reward)
        summary = verdict_summary(verdict)
        ctx.post(self.name, json.dumps({**choice.to_dict(), **summary}), idea=lease.idea_id, kind="result")
        lease.finish("done" if summary["correct"] else "failed")


def parse_idea(body: str | None) -> Choice | None:
    """The template choice an idea body names (JSON with ``template`` and ``knobs``), else None."""
    try:
        doc = json.loads(body or "")
        template = get_template(str(doc["template"]))
        knobs = dict(doc["knobs"])
    except (ValueError, KeyError, TypeError, TemplateError):
        return None
    return Choice(template, knobs)


def _tried_on_board(ctx: AgentContext, choice: Choice) -> bool:
    try:
        return ctx.already_tried(choice.key(), choice.op)
    except AttributeError:          # a board without idea_exists: the post_idea dedup still holds
        return False


def make_kernel_agents(n: int, *, device: str = "cpu", strategy: str | None = None, seed: int = 0,
                       prefix: str = "kernel") -> list[KernelSearchAgent]:
    """``n`` agents sharing one search state; strategies alternate bandit / evolution unless given."""
    shared = SharedSearch()
    names = list(STRATEGIES)
    return [KernelSearchAgent(f"{prefix}-{i}", KernelSearchConfig(
        device=device, strategy=strategy or names[i % len(names)], seed=seed), shared) for i in range(n)]

