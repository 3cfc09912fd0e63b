"""The swarm runner: N agents at once on one run, each on its own thread, until the budget ends.

``run_swarm(agents, ctx, budget_s)`` gives every agent its own :class:`AgentContext` whose
``evaluate`` is wrapped to count verdicts (so the summary does not depend on what agents report)
and whose ``deadline`` is clipped to ``now + budget_s``. An agent runs cycles until it returns
False, the deadline passes, or it fails ``max_consecutive_failures`` times in a row. A cycle that
raises is posted to the board as a failure and never reaches the caller. At the deadline (or when
the caller sets ``ctx.stop``) the agents' stop event is set; cycles still running get ``grace_s``
to end, then the swarm returns without them (daemon threads, reported as ``overran``).

``board_evaluator`` builds the ``ctx.evaluate`` the swarm expects from an engine's
``evaluate(source, timeout_s)`` (the supervisor): it records the candidate and its evaluation on the
board, serialises calls to the one engine, and never evaluates the same source twice.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Sequence

from agents.base import Agent, AgentContext, Usage, _id_of, is_faster, verdict_summary

if TYPE_CHECKING:
    from bulletin_board import BoardAPI

log = logging.getLogger("tkcc.agents")


@dataclass(frozen=True)
class AgentReport:
    """What one agent did during the swarm."""

    name: str
    cycles: int
    failures: int
    tried: int                 # candidates evaluated
    correct: int
    faster: int
    best_speedup: float | None
    usage: Usage
    stopped: str               # "exhausted" | "deadline" | "failures" | "overran"

    def to_dict(self) -> dict:
        return {"name": self.name, "cycles": self.cycles, "failures": self.failures,
                "tried": self.tried, "correct": self.correct, "faster": self.faster,
                "best_speedup": self.best_speedup, "usage": self.usage.to_dict(),
                "stopped": self.stopped}


@dataclass(frozen=True)
class SwarmResult:
    """Summary of one swarm run; ``best`` is the fastest correct verdict (author, idea, speedup)."""

    tried: int
    correct: int
    faster: int
    best_speedup: float | None
    best: dict | None
    agents: tuple[AgentReport, ...]
    elapsed_s: float
    failures: int = 0

    @property
    def usage(self) -> Usage:
        total = Usage()
        for a in self.agents:
            total = total + a.usage
        return total

    def to_dict(self) -> dict:
        return {"tried": self.tried, "correct": self.correct, "faster": self.faster,
                "best_speedup": self.best_speedup, "best": self.best, "failures": self.failures,
                "elapsed_s": round(self.elapsed_s, 3), "usage": self.usage.to_dict(),
                "agents": [a.to_dict() for a in self.agents]}


@dataclass
class _Tally:
    """Mutable per-agent counters, guarded by the swarm's lock."""

    cycles: int = 0
    failures: int = 0
    tried: int = 0
    correct: int = 0
    faster: int = 0
    best: dict | None = None
    stopped: str = "overran"
    verdicts: list = field(default_factory=list)


def _agent_loop(agent: Agent, actx: AgentContext, t: _Tally, lock: threading.Lock, max_consecutive_failures: int,
                failure_backoff_s: float) -> None:
    """One agent's cycles until its context expires, it has no more ideas, or it failed too often in a row
    (each failure posted, the wait before the next doubling); ``t.stopped`` says which."""
    streak = 0
    while not actx.expired():
        try:
            more = agent.run_once(actx)
        except Exception as exc:  # noqa: BLE001 - failures are posted, never raised
            with lock:
                t.cycles += 1
                t.failures += 1
            streak += 1
            log.warning("agent %s cycle failed: %s", agent.name, exc)
            actx.post_failure(agent.name, "cycle failed", exc)
            if streak >= max_consecutive_failures:
                t.stopped = "failures"
                return
            actx.stop.wait(min(failure_backoff_s * 2 ** (streak - 1), max(actx.time_left(), 0)))
            continue
        streak = 0
        with lock:
            t.cycles += 1
        if not more:
            t.stopped = "deadline" if actx.expired() else "exhausted"    # a cycle the deadline cut is no exhaustion
            return
    t.stopped = "deadline"


def _result(agents: Sequence[Agent], tallies: dict[str, _Tally], lock: threading.Lock, start: float) -> SwarmResult:
    """Each agent's report (its tally and token usage) and the swarm's totals and best verdict."""
    reports = []
    with lock:
        for agent in agents:
            t = tallies[agent.name]
            try:
                usage = agent.usage()
            except Exception:  # noqa: BLE001
                usage = Usage()
            reports.append(AgentReport(
                name=agent.name, cycles=t.cycles, failures=t.failures, tried=t.tried,
                correct=t.correct, faster=t.faster,
                best_speedup=None if t.best is None else t.best["speedup"], usage=usage,
                stopped=t.stopped))
        bests = [t.best for t in tallies.values() if t.best is not None]
    best = max(bests, key=lambda b: b["speedup"]) if bests else None
    return SwarmResult(
        tried=sum(r.tried for r in reports), correct=sum(r.correct for r in reports),
        faster=sum(r.faster for r in reports),
        best_speedup=None if best is None else best["speedup"], best=best,
        agents=tuple(reports), elapsed_s=time.monotonic() - start,
        failures=sum(r.failures for r in reports))


def run_swarm(agents: Sequence[Agent], ctx: AgentContext, budget_s: float, *,
              faster_than: float = 1.0, max_consecutive_failures: int = 5,
              failure_backoff_s: float = 0.5, grace_s: float = 30.0) -> SwarmResult:
    """Run ``agents`` concurrently for at most ``budget_s`` seconds (and never past ``ctx.deadline``)."""
    names = [a.name for a in agents]
    if len(set(names)) != len(names):
        raise ValueError(f"agent names must be unique, got {names}")
    start = time.monotonic()
    deadline = min(ctx.deadline, start + budget_s)
    lock = threading.Lock()
    tallies = {a.name: _Tally() for a in agents}

    def counted(agent: Agent) -> Callable[..., Any]:
        name = agent.name

        def evaluate(source: str, *, author: str | None = None, idea_id: Any = None,
                     parent: Any = None) -> Any:
            verdict = ctx.evaluate(source, author=author or name, idea_id=idea_id, parent=parent,
                                   author_kind=agent.kind)
            s = verdict_summary(verdict)
            with lock:
                t = tallies[name]
                t.tried += 1
                t.correct += s["correct"]
                if is_faster(verdict, faster_than):
                    t.faster += 1
                    if t.best is None or s["speedup"] > t.best["speedup"]:
                        t.best = {"author": author or name, "idea_id": _id_of(idea_id),
                                  "speedup": s["speedup"]}
            return verdict
        return evaluate

    stop = threading.Event()  # the swarm's own; the caller's ctx.stop also ends it
    threads = []
    for agent in agents:
        actx = ctx.replace(evaluate=counted(agent), deadline=deadline, stop=stop)
        th = threading.Thread(target=_agent_loop, args=(agent, actx, tallies[agent.name], lock,
                                                     max_consecutive_failures, failure_backoff_s),
                              name=f"agent-{agent.name}", daemon=True)
        th.start()
        threads.append(th)

    while any(th.is_alive() for th in threads) and time.monotonic() < deadline \
            and not ctx.stop.is_set():
        ctx.stop.wait(0.05)
    stop.set()
    end_grace = time.monotonic() + grace_s
    for th in threads:
        th.join(timeout=max(end_grace - time.monotonic(), 0))

    return _result(agents, tallies, lock, start)


def board_evaluator(board: BoardAPI, run_id: Any, engine_evaluate: Callable[[str, float], Any], *,
                    timeout_s: float = 300.0, tier: str = "fast", device: str = "cpu",
                    timing_method: str = "", accept: Callable[[Any], bool] = is_faster) -> Callable[..., Any]:
    """``ctx.evaluate`` backed by an engine: records candidate (with its parent and author kind) and
    evaluation on the board; ``metrics["accepted"]`` is ``accept(verdict)`` (default: correct and
    faster; the compiler's own evaluate applies its acceptance tiers instead).

    ``engine_evaluate(source, timeout_s) -> CandidateVerdict`` is typically ``Supervisor.evaluate``.
    Calls are serialised (one engine), and a source seen before returns its first verdict.
    """
    lock = threading.Lock()
    seen: dict[str, Any] = {}

    def evaluate(source: str, *, author: str, idea_id: Any = None, parent: Any = None,
                 author_kind: str = "") -> Any:
        key = hashlib.sha256(source.encode()).hexdigest()
        with lock:
            if key in seen:
                return seen[key]
            cand = board.add_candidate(run_id, author=author, source=source, idea=idea_id,
                                       parent=parent, author_kind=author_kind)
            verdict = engine_evaluate(source, timeout_s)
            s = verdict_summary(verdict)
            board.add_evaluation(
                cand, tier=tier, point=None,
                metrics={"speedup": s["speedup"], "timings": getattr(verdict, "timings", {}),
                         "per_point": [p.to_dict() for p in getattr(verdict, "per_point", ())],
                         "restarted": s["restarted"], "accepted": bool(accept(verdict))},
                verdict="correct" if s["correct"] else "rejected", reasons=s["reasons"],
                device=device, versions={}, timing_method=timing_method)
            seen[key] = verdict
            return verdict
    return evaluate
