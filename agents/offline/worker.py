"""The offline agents' common cycle, and the team state they share.

Offline agents differ in what they *propose* (kernel-template settings, engine configurations) but
any of them can *work* any offline idea, because ``board.claim_idea`` hands out the open idea of
highest priority whoever posted it. One cycle of :class:`OfflineAgent`:

0. ``team.learn_from_board(ctx)``: the template results other teams posted (other processes or
   machines on the same board) join the search state, so that choices build on them;
1. ``propose(ctx)`` posts up to ``ideas_per_cycle`` new ideas (the subclass's search);
2. claim one open idea (``ctx.claim``; heartbeated until finished);
3. work it by its body's ``kind``: ``template`` (render, ``ctx.evaluate``) or ``config`` (replay the
   traffic through the scheduler model, :mod:`agents.offline.config_search`); a free-text idea whose
   target is an op with templates is worked as that op's best untried template setting;
4. post the result (kind ``result``, JSON) and finish the idea ("done" when it held up, "failed"
   otherwise). Anything that raises is posted as a failure and the idea finished "failed".

:class:`OfflineTeam` is the state that agents of one process share (search statistics, settings
already posted, the config judge), behind one lock.
"""

from __future__ import annotations

import json
import random
import threading
from dataclasses import dataclass
from typing import Any

from agents.base import Agent, AgentContext, verdict_summary
from agents.offline.strategy import SearchState, reward_of
from agents.templates import Choice, Template, TemplateError, dims_of, get_template, render_candidate, templates_for

TEMPLATE, CONFIG = "template", "config"


class OfflineTeam:
    """Shared by the offline agents of one swarm: ``device`` decides which templates are worth timing;
    ``judge`` (a ``ConfigJudge``) is needed only to work config ideas."""

    def __init__(self, device: str = "cpu", judge: Any = None):
        if device not in ("cpu", "cuda"):
            raise ValueError(f"device must be 'cpu' or 'cuda', not {device!r}")
        self.device = device
        self.judge = judge
        self.lock = threading.Lock()
        self.search = SearchState()
        self.tried: set[str] = set()            # titles posted or worked by any agent of the team
        self.configs: list[tuple[dict, float]] = []   # (config, score) judged so far
        self.starts: list[dict] = []            # config knob settings to propose first (known good elsewhere)
        self.members: set[str] = set()          # names of the team's agents
        self.posts_read = 0                     # the run's "result" posts read so far (append-only)

    def learn_from_board(self, ctx: AgentContext, limit: int = 200) -> int:
        """Read the template results that searchers outside this team posted since the last call
        (other processes or machines sharing the board: Ray actors, a second optimize) into the search
        state, so every team builds on what the others measured. Returns how many it took in.
        Cost: one board query of at most ``limit`` posts per call."""
        with self.lock:
            page = ctx.board.list_posts(ctx.run_id, kind="result", sort="id", limit=limit,
                                        offset=self.posts_read)
            self.posts_read += len(page.items)
            taken = 0
            for post in page.items:
                doc = _json(post.body) or {}
                if post.author in self.members or doc.get("kind") != TEMPLATE or "correct" not in doc:
                    continue
                taken += self._record(doc, bool(doc["correct"]), doc.get("speedup"))
            return taken

    def record_result(self, doc: dict, correct: bool, speedup: float | None) -> bool:
        """A template result measured elsewhere (another team, an earlier run: ``doc`` names the
        ``template`` and its ``knobs``) into the search state and ``tried``; False when ``doc`` names no
        known template setting."""
        with self.lock:
            return self._record(doc, correct, speedup)

    def _record(self, doc: dict, correct: bool, speedup: float | None) -> bool:
        choice = _choice(doc)
        if choice is None:
            return False
        self.tried.add(choice.key())
        self.search.record(choice, reward_of(_Verdict(correct, speedup)))
        return True

    def arms(self, ctx: AgentContext) -> list[Template]:
        """Templates for this device whose op the engine's registry knows."""
        known = set(ctx.ops) if ctx.ops else None
        return [t for t in templates_for(device=self.device) if known is None or t.op in known]


class OfflineAgent(Agent):
    """Base of the offline agents: subclasses implement :meth:`propose`; ``claims_target``: claim only
    ideas with that target (None: any)."""

    claims_target: str | None = None

    def __init__(self, name: str, team: OfflineTeam, *, ideas_per_cycle: int = 1, seed: int = 0):
        super().__init__(name)
        self.team = team
        team.members.add(name)
        self.ideas_per_cycle = ideas_per_cycle
        self.rng = random.Random(f"{seed}:{name}")
        self.exhausted = False

    def propose(self, ctx: AgentContext) -> bool:
        """Post one new idea; False when this agent has nothing left to propose."""
        raise NotImplementedError

    def run_once(self, ctx: AgentContext) -> bool:
        self.team.learn_from_board(ctx)          # what the others measured, before choosing
        proposed = False
        for _ in range(self.ideas_per_cycle):
            if ctx.expired() or self.exhausted:
                break
            if self.propose(ctx):
                proposed = True
            else:
                self.exhausted = True
        if ctx.expired():
            return True
        lease = ctx.claim(self.name, self.claims_target) if self.claims_target else ctx.claim(self.name)
        if lease is None:
            return proposed or not self.exhausted
        try:
            self.work(ctx, lease)
        except Exception as exc:  # noqa: BLE001 - posted, never raised into the swarm
            ctx.post_failure(self.name, "offline agent failed on an idea", exc, idea=lease.idea_id)
            lease.finish("failed")
        return True

    # ------------------------------------------------------------------ working ideas
    def work(self, ctx: AgentContext, lease) -> None:
        idea = lease.idea
        doc = _json(getattr(idea, "body", ""))
        kind = doc.get("kind") if doc else None
        if kind == CONFIG:
            if self.team.judge is None:
                lease.finish("failed")
                ctx.post(self.name, "no traffic to judge a configuration with", idea=lease.idea_id,
                         kind="failure")
                return
            from agents.offline.config_search import work_config_idea
            work_config_idea(self, ctx, lease, doc)
            return
        choice = _choice(doc)
        if choice is None:
            target = getattr(idea, "target", None)
            arms = [t for t in self.team.arms(ctx) if t.op == target]
            choice = self.next_template_choice(ctx, arms, {target: 1.0}) if arms else None
            if choice is None:
                ctx.post(self.name, f"no template setting left for {target or 'an idea without a target op'}",
                         idea=lease.idea_id, kind="failure")
                lease.finish("failed")
                return
        self.work_template(ctx, lease, choice)

    def work_template(self, ctx: AgentContext, lease, choice: Choice) -> None:
        bad = choice.template.check(choice.knobs, dims_of(ctx.spec))
        if bad:
            ctx.post(self.name, "invalid template setting: " + "; ".join(bad), idea=lease.idea_id, kind="failure")
            lease.finish("failed")
            return
        source = render_candidate([choice])
        verdict = ctx.evaluate(source, author=self.name, idea_id=lease.idea_id)
        with self.team.lock:
            self.team.tried.add(choice.key())
            self.team.search.settle(choice)
            self.team.search.record(choice, reward_of(verdict))
            arm = self.team.search.arms[choice.template.name]
            learned = {"template_tried": arm.pulls, "template_best_knobs": arm.best_knobs,
                       "template_best_speedup": None if arm.best_reward <= -1 else 1.0 + arm.best_reward}
        summary = verdict_summary(verdict)
        ctx.post(self.name, json.dumps({"kind": TEMPLATE, **choice.to_dict(), **summary, "learned": learned}),
                 idea=lease.idea_id, kind="result")
        lease.finish("done" if summary["correct"] else "failed")

    def next_template_choice(self, ctx: AgentContext, arms, shares) -> Choice | None:
        """An untried template setting (by the kernel strategy when this agent has one, else the
        default or a mutation of the best), recorded as tried."""
        from agents.offline.strategy import BanditStrategy

        strategy = getattr(self, "strategy", None) or BanditStrategy()
        with self.team.lock:
            for _ in range(50):
                choice = strategy.propose(arms, shares, self.team.search, self.team.tried,
                                          dims_of(ctx.spec), self.rng)
                if choice is None:
                    return None
                self.team.tried.add(choice.key())
                if not ctx.already_tried(choice.key(), choice.op):
                    self.team.search.propose(choice)
                    return choice
        return None


@dataclass(frozen=True)
class _Verdict:
    """A verdict as another team's result post states it (what ``reward_of`` reads)."""

    correct: bool
    speedup: float | None


def _json(body: str | None) -> dict | None:
    try:
        doc = json.loads(body or "")
    except ValueError:
        return None
    return doc if isinstance(doc, dict) else None


def _choice(doc: dict | None) -> Choice | None:
    """The template choice an idea body names (``{"kind": "template", "template", "knobs"}``)."""
    if not doc or "template" not in doc:
        return None
    try:
        return Choice(get_template(str(doc["template"])), dict(doc["knobs"]))
    except (KeyError, TypeError, ValueError, TemplateError):
        return None
