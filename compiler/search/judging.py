"""The search phase of the optimize loop: every candidate goes through one ``Judge`` (fast tier, then
acceptance, all on the board), the agents search with its ``evaluate``, and their accounting is reported.

A run confirms what it found: a fast-tier winner (beyond the fast tier's noise) owes a slow-tier evaluation.
The judge keeps the time for it: no new fast-tier evaluation starts past the search's end, nor when what is
left before the fleet's deadline (``confirm_end``, the composition's end) is below the estimated cost of
confirming the winners still owed (the slow tier's measured seconds per evaluation, from the baseline's A/A
rounds and then its own). A winner found when the search has ended is not confirmed in its agent's thread
(the swarm no longer waits for it) but queued, and :meth:`Judge.confirm_owed` confirms it, best first,
after the swarm, waiting for confirmations still in flight; the v3 H200 GLM-5.2 run lost its one fast-tier
winner (a fused MoE at 1.233x) this way, start-up having taken 37% of its 270 s."""

from __future__ import annotations

import hashlib
import math
import statistics
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from compiler.fleet.local import failed_verdict, unjudged
from compiler.search.acceptance import Accepted, Acceptor, Decision, screen
from compiler.search.progress import Progress
from compiler.search.run_state import RunContext, RunInputs, best_effort

if TYPE_CHECKING:
    from bulletin_board import BoardAPI
    from compiler.fleet.local import Fleet


@dataclass
class Judge:
    """Every candidate of the run goes through :meth:`consider`: fast tier, then acceptance (the slow tier
    when it beats the noise); everything goes on the board, the candidate with its parent (lineage) and
    its author's kind ("llm" for LLM-written code). A source the run's memory holds a verdict for is not
    judged again (compiler/search/memory.py); the same source is never measured twice in one run."""

    run: RunContext
    fleet: Fleet
    acceptor: Acceptor
    accepted: list[Accepted]                 # confirmed on both tiers, in order (the acceptor's log)
    tried: int = 0                           # fast-tier evaluations
    search_end: float = math.inf             # monotonic: no fast-tier evaluation starts past it
    confirm_end: float = math.inf            # monotonic: the fleet's deadline, by which confirmations end
    extend_from: float = -math.inf           # monotonic: the budget's own search end, after which it runs on
    eval_s: dict = field(default_factory=dict)   # tier -> seconds of one evaluation (the baseline's A/A rounds)
    _seen: dict = field(default_factory=dict, init=False, repr=False)       # sha256 of a source -> its verdict
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _owed: list = field(default_factory=list, init=False, repr=False)       # winners queued for the slow tier
    _in_flight: int = field(default=0, init=False, repr=False)              # slow confirmations under way
    _settled: threading.Condition = field(default_factory=threading.Condition, init=False, repr=False)
    _times: dict = field(default_factory=dict, init=False, repr=False)      # tier -> measured seconds

    def evaluate(self, source: str, *, author: str, idea_id: Any = None, parent: Any = None,
                 author_kind: str = "") -> Any:
        """The agents' ``AgentContext.evaluate``: a source seen before in this run returns its verdict."""
        key = hashlib.sha256(source.encode()).hexdigest()
        with self._lock:
            if key in self._seen:
                return self._seen[key]
        verdict = self.consider(source, author=author, idea_id=idea_id, parent=parent, author_kind=author_kind)
        if unjudged(verdict):
            return verdict                   # a refusal for want of time is no verdict of the source
        with self._lock:
            self._seen[key] = verdict
        return verdict

    def consider(self, source: str, *, author: str, idea_id: Any = None, parent: Any = None,
                 author_kind: str = "seed") -> Any:
        run, progress = self.run, self.run.progress
        known = run.memory.recalled(source, self.acceptor)
        if known is not None:
            return known
        refused = self.refusal()
        if refused is not None:              # the time left is the confirmations': no verdict, nothing recorded
            return failed_verdict(refused)
        cand = best_effort(run.board.add_candidate, run.run_id, author=author, source=source, idea=idea_id,
                           parent=parent, author_kind=author_kind)
        t0 = time.monotonic()
        verdict = self.fleet.evaluate("fast", source)
        self._timed("fast", t0)
        if unjudged(verdict):                # the run's end refused or cut it: no verdict of the source
            self._record(cand, verdict, Decision(False, "fast", str(verdict.reasons[0])))
            return verdict
        with self._lock:
            self.tried += 1
        progress.count("tried")
        if verdict.correct:
            progress.count("correct")
        owed = dict(source=source, verdict=verdict, author=author, idea_id=idea_id, cand=cand)
        if self._wins_fast(source, verdict) and time.monotonic() >= self.search_end:
            with self._settled:              # the search has ended: confirmed by confirm_owed, not here
                self._owed.append(owed)
            return verdict
        self._decide(**owed)
        return verdict

    def _record(self, cand: Any, verdict: Any, decision: Any) -> None:
        """The fast-tier evaluation's row on the board (none when the board has no candidate row)."""
        if cand is None:
            return
        best_effort(self.run.board.add_evaluation, cand, tier="fast", point=None,
                    metrics={"speedup": verdict.speedup, "per_point": [p.to_dict() for p in verdict.per_point],
                             "accepted": bool(decision.accepted), "timings": verdict.timings,
                             "decision": decision.reason, "status": evaluation_status(verdict, decision),
                             "slow_speedup": decision.slow},
                    verdict="correct" if verdict.correct else "rejected",
                    reasons=list(verdict.reasons), device=self.fleet.cfg.devices[0],
                    versions={}, timing_method="engine A/B")

    def _wins_fast(self, source: str, verdict: Any) -> bool:
        """Beyond the fast tier's noise, not outrun by accepted candidates for the same ops
        (``Acceptor.outrun_by``), and judged on the slow tier next (a kernel source; a settings-only one is
        judged by the config replay instead, compiler/search/config_plan.py)."""
        from compiler.search.config_plan import config_only

        inner = getattr(self.acceptor, "inner", self.acceptor)
        return (config_only(source) is None
                and screen(verdict, inner.noise.get("fast", 0.0), inner.cfg, "fast").accepted
                and not inner.outrun_by(source, verdict))

    def _decide(self, source: str, verdict: Any, author: str, idea_id: Any, cand: Any) -> Any:
        """Acceptance (the slow tier for a fast-tier winner, timed), then the board's row and the memory."""
        run, slow = self.run, self._wins_fast(source, verdict)
        if slow:
            with self._settled:
                self._in_flight += 1
        t0 = time.monotonic()
        try:
            decision = self.acceptor.consider(source, verdict, author=author, idea_id=idea_id, candidate_id=cand)
        finally:
            if slow:
                self._timed("slow", t0)
                with self._settled:
                    self._in_flight -= 1
                    self._settled.notify_all()
        if decision.stage == "slow":
            run.progress.count("fast_passed")
        self._record(cand, verdict, decision)
        if "not evaluated: " not in str(decision.reason):    # a confirmation the run's end cut: judged again later
            run.memory.remember(source, verdict, decision, self.acceptor, idea_id=idea_id)
        return decision

    # ---------------------------------------------------------------------------- the confirmations' time
    def _timed(self, tier: str, t0: float) -> None:
        with self._lock:
            self._times.setdefault(tier, []).append(time.monotonic() - t0)

    def estimate_s(self, tier: str) -> float:
        """Seconds one evaluation of ``tier`` takes: the median of the last five this judge made, else the
        baseline's A/A figure, else 0 (unknown: nothing is held back for it)."""
        with self._lock:
            got = self._times.get(tier, [])[-5:]
        return statistics.median(got) if got else float(self.eval_s.get(tier) or 0.0)

    def composition_s(self) -> float:
        """Seconds the composition needs once the confirmations end: one measurement of the composed set
        on both tiers when a confirmation would make it a set of two or more (something is accepted already),
        else 0 (a first acceptance is a set of one, whose own verdicts stand in when no time is left). On the
        H200 (llama-1b, --budget 5m) confirmations that ran to the composition's end left it 30 s, too
        little for the one measurement of the set: 10 of 11 accepted were dropped unmeasured."""
        return self.estimate_s("fast") + self.estimate_s("slow") if self.accepted else 0.0

    def owed(self) -> int:
        """Fast-tier winners whose slow-tier verdict is still to come (queued or under way)."""
        with self._settled:
            return len(self._owed) + self._in_flight

    def closing_s(self) -> float:
        """Seconds the run needs once the search ends, before ``confirm_end``: the fast-tier evaluation that
        may be in flight, the slow-tier confirmations owed, and the composition's measurement of the set,
        twice (a set within the noise is measured again, ``Acceptor._on_tier``). The search ends when only
        this is left (:meth:`search_over`), not at a share of the budget fixed before anything was accepted:
        on the H100 (llama-1b, --budget 10m, nothing accepted) the fixed 25% left 107 s of the run unused."""
        return self.estimate_s("fast") + self.owed() * self.estimate_s("slow") + 2 * self.composition_s()

    def search_over(self, now: float | None = None) -> bool:
        """Whether the search has ended: ``search_end`` passed, or only :meth:`closing_s` is left."""
        return self.refusal(now) is not None

    def refusal(self, now: float | None = None) -> str | None:
        """Why no new fast-tier evaluation may start now (None: it may): the search has ended, the time left
        before ``confirm_end`` is needed to confirm the winners owed, or, past ``extend_from`` (the budget's
        fixed search end: its composition reserve), to confirm and compose (:meth:`closing_s`). Before it the
        fixed reserve stands: the estimates include the fleet's queue (eight agents: eight evaluations), and
        a closing time larger than the reserve would end the search earlier than the budget plans."""
        now = time.monotonic() if now is None else now
        if now >= self.search_end:
            return "not evaluated: the search's time is spent (the rest confirms its fast-tier winners)"
        left, owed = self.confirm_end - now, self.owed()
        need = owed * self.estimate_s("slow")
        if owed and left < need + self.estimate_s("fast"):
            return (f"not evaluated: the run's remaining {left:.0f} s are kept to confirm "
                    f"{owed} fast-tier winner(s) on the slow tier (~{need:.0f} s)")
        if now < self.extend_from or left >= self.closing_s():
            return None             # before ``extend_from`` the budget's composition reserve is still ahead
        return (f"not evaluated: the run's remaining {left:.0f} s are kept for the evaluation under way and the "
                f"composition (~{self.closing_s():.0f} s)")

    def confirm_owed(self) -> int:
        """After the swarm: waits (until ``confirm_end``) for confirmations still under way in agent threads,
        then confirms the queued winners, fastest first, while one more slow-tier evaluation and the
        composition's measurement (:meth:`composition_s`) fit before ``confirm_end`` (a progress line says
        so); the rest are recorded as not confirmed. Returns how many were confirmed here."""
        progress = self.run.progress
        with self._settled:
            queued, busy = list(self._owed), self._in_flight
            self._owed.clear()
        if not queued and not busy:
            return 0
        each = self.estimate_s("slow")
        progress.phase("confirming")
        progress.event(f"confirming {len(queued) + busy} fast-tier winner(s) on the slow tier "
                       f"(~{each:.0f} s each, {max(self.confirm_end - time.monotonic(), 0):.0f} s left for it and "
                       f"the composition's ~{self.composition_s():.0f} s)")
        with self._settled:
            self._settled.wait_for(lambda: self._in_flight == 0, timeout=None if math.isinf(self.confirm_end)
                                   else max(0.0, self.confirm_end - time.monotonic()))
            queued += self._owed                 # winners those threads found meanwhile
            self._owed.clear()
        done = 0
        for owed in sorted(queued, key=lambda o: -(o["verdict"].speedup or 0.0)):
            if self.run.stop.is_set() or time.monotonic() + each + self.composition_s() > self.confirm_end:
                progress.event(f"not confirmed (no time left): {owed['author']}'s {owed['verdict'].speedup:.3f}x "
                               "on the fast tier")
                self._unconfirmed(owed)
                continue
            self._decide(**owed)
            done += 1
        return done

    def _unconfirmed(self, owed: dict) -> None:
        """A winner the budget left no slow-tier time for: its fast row says so (never remembered as a verdict)."""
        v, cand = owed["verdict"], owed["cand"]
        if cand is not None:
            best_effort(self.run.board.add_evaluation, cand, tier="fast", point=None,
                        metrics={"speedup": v.speedup, "per_point": [p.to_dict() for p in v.per_point],
                                 "accepted": False, "timings": v.timings,
                                 "decision": "not confirmed on the slow tier: the run's budget is spent",
                                 "status": "not judged", "slow_speedup": None},
                        verdict="correct" if v.correct else "rejected", reasons=list(v.reasons),
                        device=self.fleet.cfg.devices[0], versions={}, timing_method="engine A/B")


def run_swarm(judge: Judge, agents: list[Any], run_in: RunInputs, profile: dict, deadline: float,
               hw: str | None = None) -> Any:
    """The agents' search; returns the ``agents.SwarmResult``. ``hw``: the cost-model hardware of the
    timings (the LLM agents' roofline)."""
    from agents import AgentContext, op_catalog, run_swarm

    run = judge.run
    ended = threading.Event()                # the run's Ctrl-C, or only the judge's closing time left

    def watch() -> None:
        while not ended.wait(0.25):
            if run.stop.is_set() or judge.search_over():
                ended.set()

    ctx = AgentContext(board=run.board, run_id=run.run_id, evaluate=judge.evaluate, profile=profile,
                       points=run_in.points, spec=run_in.spec, ops=op_catalog(), deadline=deadline, stop=ended,
                       hw=hw)
    watcher = threading.Thread(target=watch, name="search-end", daemon=True)
    watcher.start()
    try:
        return run_swarm(agents, ctx, max(deadline - time.monotonic(), 0.0))
    finally:
        ended.set()
        watcher.join()


def per_agent(swarm: Any, by_author: dict[str, int]) -> list[dict]:
    """One row per agent: cycles, candidates tried / correct / accepted (``by_author``: kernels confirmed on
    both tiers and accepted settings, ``compiler.search.tally.accepted_by_author``), tokens, dollars and why it
    stopped. ``swarm`` None (no search): no rows."""
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


def evaluation_status(verdict: Any, decision: Any) -> str:
    """An evaluation's outcome in words for the board and the UI: "accepted"; "rejected" (incorrect on a tier);
    "not better" (correct and measured, or a setting replayed, and not faster beyond the noise, outrun by an
    accepted one, or not beating the baseline setting; ``decision`` says by how much); "not judged" (correct
    but not timed, a replay too overloaded to decide, or refused or cut by the run's end on either tier)."""
    if unjudged(verdict) or "not evaluated: " in str(decision.reason):
        return "not judged"
    if decision.accepted:
        return "accepted"
    if not getattr(verdict, "correct", False) or decision.reason.startswith("rejected"):
        return "rejected"
    if decision.fast is not None or decision.slow is not None or decision.reason.startswith("config replay"):
        return "not better"
    return "not judged"
