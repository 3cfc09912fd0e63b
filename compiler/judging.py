"""The search phase of the optimize loop: every candidate goes through one ``Judge`` (fast tier, then
acceptance, all on the board), the agents search with its ``evaluate``, and their accounting is reported."""

from __future__ import annotations

import hashlib
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from compiler.acceptance import Accepted, Acceptor
from compiler.progress import Progress
from compiler.run_state import Run, RunInputs, best_effort

if TYPE_CHECKING:
    from bulletin_board import BoardAPI
    from compiler.fleet import Fleet


@dataclass
class Judge:
    """Every candidate of the run goes through :meth:`consider`: fast tier, then acceptance (the slow tier
    when it beats the noise); everything goes on the board, the candidate with its parent (lineage) and
    its author's kind ("llm" for LLM-written code). A source the run's memory holds a verdict for is not
    judged again (compiler/memory.py); the same source is never measured twice in one run."""

    run: Run
    fleet: Fleet
    acceptor: Acceptor
    accepted: list[Accepted]                 # confirmed on both tiers, in order (the acceptor's log)
    tried: int = 0                           # fast-tier evaluations
    _seen: dict = field(default_factory=dict, init=False, repr=False)       # sha256 of a source -> its verdict
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def evaluate(self, source: str, *, author: str, idea_id: Any = None, parent: Any = None,
                 author_kind: str = "") -> Any:
        """The agents' ``AgentContext.evaluate``: a source seen before in this run returns its verdict."""
        key = hashlib.sha256(source.encode()).hexdigest()
        with self._lock:
            if key in self._seen:
                return self._seen[key]
        verdict = self.consider(source, author=author, idea_id=idea_id, parent=parent, author_kind=author_kind)
        with self._lock:
            self._seen[key] = verdict
        return verdict

    def consider(self, source: str, *, author: str, idea_id: Any = None, parent: Any = None,
                 author_kind: str = "seed") -> Any:
        run, progress, acceptor = self.run, self.run.progress, self.acceptor
        known = run.memory.recalled(source, acceptor)
        if known is not None:
            return known
        cand = best_effort(run.board.add_candidate, run.run_id, author=author, source=source, idea=idea_id,
                           parent=parent, author_kind=author_kind)
        verdict = self.fleet.evaluate("fast", source)
        with self._lock:
            self.tried += 1
        progress.count("tried")
        if verdict.correct:
            progress.count("correct")
        decision = acceptor.consider(source, verdict, author=author, idea_id=idea_id, candidate_id=cand)
        if decision.stage == "slow":
            progress.count("fast_passed")
        if cand is not None:
            best_effort(run.board.add_evaluation, cand, tier="fast", point=None,
                        metrics={"speedup": verdict.speedup, "per_point": [p.to_dict() for p in verdict.per_point],
                                 "accepted": bool(decision.accepted), "timings": verdict.timings,
                                 "decision": decision.reason, "slow_speedup": decision.slow},
                        verdict="correct" if verdict.correct else "rejected",
                        reasons=list(verdict.reasons), device=self.fleet.cfg.devices[0],
                        versions={}, timing_method="engine A/B")
        run.memory.remember(source, verdict, decision, acceptor, idea_id=idea_id)
        return verdict


def run_swarm(judge: Judge, agents: list[Any], run_in: RunInputs, profile: dict, deadline: float,
               hw: str | None = None) -> Any:
    """The agents' search; returns the ``agents.SwarmResult``. ``hw``: the cost-model hardware of the
    timings (the LLM agents' roofline)."""
    from agents import AgentContext, op_catalog, run_swarm

    run = judge.run
    ctx = AgentContext(board=run.board, run_id=run.run_id, evaluate=judge.evaluate, profile=profile,
                       points=run_in.points, spec=run_in.spec, ops=op_catalog(), deadline=deadline, stop=run.stop,
                       hw=hw)
    return run_swarm(agents, ctx, max(deadline - time.monotonic(), 0.0))


def per_agent(swarm: Any, accepted: list[Accepted]) -> list[dict]:
    """One row per agent: cycles, candidates tried / correct / accepted (confirmed on both tiers),
    tokens, dollars and why it stopped."""
    by_author: dict[str, int] = {}
    for a in accepted:
        by_author[a.author] = by_author.get(a.author, 0) + 1
    rows = []
    for r in getattr(swarm, "agents", ()):
        u = r.usage
        rows.append({"name": r.name, "cycles": r.cycles, "tried": r.tried, "correct": r.correct,
                     "accepted": by_author.get(r.name, 0), "failures": r.failures,
                     "input_tokens": u.input_tokens, "cached_tokens": u.cached_tokens,
                     "output_tokens": u.output_tokens, "cost_usd": round(u.cost_usd, 6),
                     "requests": u.requests, "stopped": r.stopped})
    return rows


def report_agents(board: BoardAPI, run_id: Any, rows: list[dict], progress: Progress) -> None:
    """Per-agent accounting into the run's config (the UI shows it), the LLM agents' stopping lines (a
    budget spent) and one line of the LLM spend, as progress events."""
    run = best_effort(board.get_run, run_id)
    if run is not None:
        best_effort(board.update_run, run_id, config={**(run.config or {}), "agent_reports": rows})
    stopped = best_effort(board.list_posts, run_id, kind="stopped", limit=100)
    for post in getattr(stopped, "items", ()):                  # "stopping: the run's LLM budget is spent ..."
        progress.event(f"{post.author}: {post.body}")
    llm = [r for r in rows if r["requests"]]
    if llm:
        progress.event(f"LLM agents: {sum(r['input_tokens'] + r['cached_tokens'] + r['output_tokens'] for r in llm)} "
                       f"tokens, ${sum(r['cost_usd'] for r in llm):.4f}, {sum(r['tried'] for r in llm)} candidates, "
                       f"{sum(r['accepted'] for r in llm)} accepted")


def release_agents(agents: list[Any]) -> None:
    """Ends agent actors (``--fleet ray``); local agents need nothing."""
    actors = [a.actor for a in agents if hasattr(a, "actor")]
    if actors:
        import ray
        for actor in actors:
            ray.kill(actor)
