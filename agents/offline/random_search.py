"""The control search: uniform random draws from the template library (``--agents random:N``).

What tkcc's offline agents (:mod:`agents.offline.kernel_search`) are measured against
(``benchmarks/search_vs_random.py``). Each cycle a :class:`RandomSearchAgent` draws one (template,
knob setting) choice not drawn before, renders it and submits it through ``ctx.evaluate``: the same
judge, budget and template library as the offline agents, and nothing else. It reads no profile, no
roofline, no board and no verdict: a rejected or slow choice changes nothing that follows.

The draw is hierarchical: a template uniformly among those for the device whose op the engine knows
and that still have an untried valid setting, then each knob uniformly among its values (a uniform
draw over the template's knob grid), redrawn while the setting is invalid at the model's sizes
(``Template.check``) or already drawn. A flat draw over all settings would weigh templates by their
grid size: on CUDA two fused templates hold 98% of the library's 2.6e8 settings, and the control
would then be a search of those two. Grids of at most ``ENUMERATE`` settings are enumerated, so a
template is declared spent exactly when none is left; larger ones after ``MAX_DRAWS`` failed draws.

Reproducible: the agents of one swarm share one :class:`RandomPool` drawing under a lock from one
``random.Random(seed)``, so the k-th choice of a run is the same for a seed whichever agent draws it
(``seed`` from ``TKCC_SEARCH_SEED``, :mod:`compiler.search.agent_spec`).
"""

from __future__ import annotations

import itertools
import json
import random
import threading
from typing import Mapping, Sequence

from agents.base import Agent, AgentContext, verdict_summary
from agents.templates import Choice, Template, dims_of, render_candidate, templates_for

ENUMERATE = 4096         # grids up to this many settings are listed (cost: one check per setting, once)
MAX_DRAWS = 200          # rejected draws before a larger grid counts as spent


class RandomPool:
    """The seeded draw shared by the random agents of one swarm; ``tried`` holds every key drawn."""

    def __init__(self, device: str = "cpu", seed: int = 0):
        if device not in ("cpu", "cuda"):
            raise ValueError(f"device must be 'cpu' or 'cuda', not {device!r}")
        self.device, self.seed = device, seed
        self.rng = random.Random(seed)
        self.lock = threading.Lock()
        self.tried: set[str] = set()
        self.spent: set[str] = set()            # templates with no valid untried setting left
        self._grids: dict[str, list[dict]] = {}  # template -> its valid settings (enumerated grids)

    def templates(self, ops: Mapping | None) -> list[Template]:
        """The device's templates whose op is in ``ops`` (all when ``ops`` is empty or None)."""
        return [t for t in templates_for(device=self.device) if not ops or t.op in ops]

    def draw(self, templates: Sequence[Template], dims: Mapping[str, int]) -> Choice | None:
        """A valid choice not drawn before (recorded as drawn), None when every template is spent."""
        with self.lock:
            live = [t for t in templates if t.name not in self.spent]
            while live:
                template = self.rng.choice(live)
                choice = self._setting(template, dims)
                if choice is not None:
                    self.tried.add(choice.key())
                    return choice
                self.spent.add(template.name)
                live.remove(template)
            return None

    def _setting(self, template: Template, dims: Mapping[str, int]) -> Choice | None:
        if template.space_size() <= ENUMERATE:
            grid = self._grids.get(template.name)
            if grid is None:
                names = [k.name for k in template.knobs]
                grid = [knobs for values in itertools.product(*(k.values for k in template.knobs))
                        if not template.check(knobs := dict(zip(names, values)), dims)]
                self._grids[template.name] = grid
            left = [knobs for knobs in grid if Choice(template, knobs).key() not in self.tried]
            return Choice(template, self.rng.choice(left)) if left else None
        for _ in range(MAX_DRAWS):
            knobs = {k.name: self.rng.choice(k.values) for k in template.knobs}
            choice = Choice(template, knobs)
            if choice.key() not in self.tried and not template.check(knobs, dims):
                return choice
        return None


class RandomSearchAgent(Agent):
    """One evaluator of the control search: draws from ``pool``, posts the choice as an idea for the record
    (never claimed by the random agents, as ``FilesAgent`` does: run them without offline agents, which
    would claim it), evaluates it and posts the result."""

    def __init__(self, name: str, pool: RandomPool):
        super().__init__(name)
        self.pool = pool

    def run_once(self, ctx: AgentContext) -> bool:
        if ctx.expired():
            return False
        choice = self.pool.draw(self.pool.templates(ctx.ops), dims_of(ctx.spec))
        if choice is None:
            return False
        body = {"kind": "template", **choice.to_dict(), "why": "a uniform random draw (the control search)"}
        idea = ctx.board.post_idea(ctx.run_id, author=self.name, title=choice.key(), body=json.dumps(body),
                                   target=choice.op, tags=["template", "random"], priority=0.0)
        idea_id = getattr(idea, "id", idea)
        try:
            verdict = ctx.evaluate(render_candidate([choice]), author=self.name, idea_id=idea_id)
        except Exception as exc:  # noqa: BLE001 - posted, never raised into the swarm
            ctx.post_failure(self.name, f"evaluating {choice.key()} failed", exc, idea=idea_id)
            return True
        ctx.post(self.name, json.dumps({"kind": "template", **choice.to_dict(), **verdict_summary(verdict)}),
                 idea=idea_id, kind="result")
        return True


def make_random_agents(n: int, *, device: str = "cpu", seed: int = 0,
                       prefix: str = "random") -> list[RandomSearchAgent]:
    """``n`` random agents sharing one seeded pool."""
    if n < 1:
        raise ValueError("make_random_agents: n must be at least 1")
    pool = RandomPool(device, seed)
    return [RandomSearchAgent(f"{prefix}-{i}", pool) for i in range(n)]
