"""The kernel-template search agent: turns the profile into template ideas.

``propose`` asks its strategy (bandit or evolution, :mod:`agents.offline.strategy`) for a template
setting not yet tried by the team nor on the board, steered to the ops with the most left to gain (the
profile's time share per op times its headroom to the roofline), and posts it as an idea:

- title ``<template>{knob=value,...}``, target the op: the board keeps one idea per (target, title),
  so agents proposing the same setting post it once and it is worked once;
- body JSON ``{"kind": "template", "template", "op", "knobs", "why"}``;
- tags ``template`` and the backend; priority the op's prior, so whoever claims next takes the idea
  with the most to gain first.

Working the idea (render, evaluate, post the verdict, learn) is the shared cycle of
:class:`agents.offline.worker.OfflineAgent`; every verdict updates the team's search state, so a good
setting found by one agent is mutated by all.
"""

from __future__ import annotations

import json

from agents.base import AgentContext
from agents.offline.strategy import STRATEGIES, op_priors, op_shares
from agents.offline.worker import TEMPLATE, OfflineAgent, OfflineTeam


class KernelSearchAgent(OfflineAgent):
    """``strategy``: "bandit" or "evolution"; ops below ``min_share`` of the step are not searched."""

    def __init__(self, name: str, team: OfflineTeam, *, strategy: str = "bandit", min_share: float = 1e-3,
                 ideas_per_cycle: int = 1, seed: int = 0):
        if strategy not in STRATEGIES:
            raise ValueError(f"unknown strategy {strategy!r}; known: {', '.join(STRATEGIES)}")
        super().__init__(name, team, ideas_per_cycle=ideas_per_cycle, seed=seed)
        self.strategy = STRATEGIES[strategy](min_share=min_share)

    def shares(self, ctx: AgentContext, arms) -> dict[str, float]:
        """Prior per op that has a template (``op_priors``: its share of the step times its headroom to
        the roofline), at least ``min_share`` for an op with that share of the step (at its roofline it
        is drawn last, not never); uniform when the profile says nothing."""
        ops = {t.op for t in arms}
        floor = self.strategy.min_share
        priors = op_priors(ctx.profile, ctx.spec, ctx.hw, known_ops=sorted(set(ctx.ops or ()) | ops))
        share = op_shares(ctx.profile)
        shares = {op: max(prior, floor) if share.get(op, 0.0) >= floor else prior
                  for op, prior in priors.items() if op in ops}
        return shares or ({op: 1.0 / len(ops) for op in ops} if ops else {})

    def propose(self, ctx: AgentContext) -> bool:
        arms = self.team.arms(ctx)
        shares = self.shares(ctx, arms)
        choice = self.next_template_choice(ctx, arms, shares)
        if choice is None:
            return False
        share = shares.get(choice.op, 0.0)
        body = {"kind": TEMPLATE, **choice.to_dict(),
                "why": f"a kernel at the roofline could take {share:.1%} off the step in {choice.op}; "
                       f"{choice.template.description}"}
        ctx.board.post_idea(ctx.run_id, author=self.name, title=choice.key(), body=json.dumps(body),
                            target=choice.op, tags=[TEMPLATE, choice.template.backend],
                            priority=round(share, 6))
        return True
