"""``BoardAPI``: the board as its users see it (agents, the optimize loop, the UI, outside checks).

``bulletin_board.Board`` implements it on SQLite and on PostgreSQL; tests/bulletin_board/test_contract.py
is the one contract suite, run against every implementation (``Board`` on each backend), and checks
that the implementation's signatures are the protocol's. Code outside this package types a board as
``BoardAPI`` and calls its methods directly: a method missing is a bug, not a case to handle.

The contract every implementation keeps (beyond each method's docstring):
- Arguments naming a row (``run``, ``idea``, ``candidate``, ``deployment``, ``optimization``) take the
  record (``Run``, ``Idea``, ...) or its id, interchangeably. Records are frozen dataclasses
  (``bulletin_board.records``); ``list_*`` return a ``Page`` (``items``, ``total``, ``limit``,
  ``offset``), bounded by ``limit``.
- Writes are atomic and safe with many writers in many processes: an idea is never held by two live
  claims; a claim whose lease lapsed (database clock, ``db_time``) returns the idea to the pool;
  counters add up (``record_progress``); a write given an ``idempotency_key`` seen before returns
  what the first one wrote.
- A bad argument (an unknown status, a missing row to write to, an empty title) raises
  ``BoardError`` (a user error: one line); the store being unreachable raises SQLAlchemy's error.
- JSON values put in (configs, metrics, baselines) come back as JSON (``jsonable``: tuples as lists,
  numpy scalars as numbers, non-finite floats as None).
"""

from __future__ import annotations

from typing import Any, Mapping, Protocol, Sequence, runtime_checkable

from .records import Candidate, Claim, Deployment, DriftEvent, Evaluation, Idea, Optimization, Page, Post, Run, Tried


@runtime_checkable
class BoardAPI(Protocol):
    """The shared store of a run: see the module docstring for the contract."""

    # ------------------------------------------------------------------ runs and deployments
    def deployment(self, model: str, hw: str, traffic_hash: str, *, name: str = "") -> Deployment:
        """The deployment (model, hw, traffic profile hash), created on first use."""

    def create_run(self, model: str, hw: str, traffic_hash: str = "", *, config: Mapping[str, Any] | None = None,
                   deployment_name: str = "", idempotency_key: str | None = None,
                   deployment_hash: str | None = None) -> Run:
        """A new run (status "running") of the deployment (model, hw, ``deployment_hash`` or else
        traffic_hash: a recompile on drifted traffic stays under its first version's deployment). The same
        ``idempotency_key`` again (a retry) returns the run it created instead of a second one."""

    def update_run(self, run: Any, *, status: str | None = None, message: str | None = None,
                   candidates_tried: int | None = None, candidates_accepted: int | None = None,
                   best_speedup: float | None = None, engine_restarts: int | None = None,
                   config: Mapping[str, Any] | None = None) -> Run:
        """Set a run's status and progress fields (None leaves a field as it is). A final status
        (done, failed, interrupted) stamps ``finished_at``."""

    def record_progress(self, run: Any, *, tried: int = 0, accepted: int = 0, restarts: int = 0,
                        speedup: float | None = None) -> Run:
        """Atomically add to a run's counters and raise ``best_speedup`` to ``speedup`` if higher
        (safe with many writers: no read-modify-write in Python)."""

    def set_baseline(self, run: Any, profile: Mapping[str, Any]) -> Run:
        """Store the run's baseline profile (any JSON-able dict, e.g. ``Supervisor.profile()``)."""

    def get_baseline(self, run: Any) -> dict | None:
        """The baseline profile stored with :meth:`Board.set_baseline` (None when not set)."""

    # ------------------------------------------------------------------ ideas and claims
    def post_idea(self, run: Any, author: str, title: str, body: str = "", target: str | None = None,
                  tags: Sequence[str] = (), parent: Any = None, priority: float = 0.0) -> Idea:
        """Post an idea (status "open"); ``priority`` orders the pool (higher first). An idea with
        the same target and title (case and spacing ignored) already on the run is returned as
        is."""

    def idea_exists(self, run: Any, title: str, target: str | None = None) -> bool:
        """True when the run has an idea with this target and title (case and spacing ignored),
        whatever its status: so that no idea is worked twice."""

    def claim_idea(self, run: Any, agent: str, lease_s: float = 300.0, *, target: str | None = None) -> Idea | None:
        """Atomically claim the open idea of highest priority (oldest first) for ``agent`` for
        ``lease_s`` seconds of the database's clock; an idea whose lease lapsed is open again.
        ``target``: only ideas with that target. Returns the claimed idea, or None when nothing is
        open. Keep it with :meth:`heartbeat`."""

    def heartbeat(self, idea: Any, agent: str, lease_s: float | None = None) -> bool:
        """Extend ``agent``'s claim by its lease (or by ``lease_s``, which becomes its lease) from
        now. False when the claim is no longer ``agent``'s (it lapsed and another agent took the
        idea, or it was finished)."""

    def finish_idea(self, idea: Any, agent: str, status: str = "done") -> bool:
        """Mark ``agent``'s claimed idea "done" or "failed". False (and nothing changes) when the
        claim is no longer ``agent``'s."""

    def release_idea(self, idea: Any, agent: str) -> bool:
        """Give ``agent``'s claimed idea back to the pool unfinished (status "open")."""

    # ------------------------------------------------------------------ posts, candidates, evaluations, optimizations, drift
    def post(self, run: Any, author: str, body: str, idea: Any = None, kind: str = "note") -> Post:
        """A message on an idea's thread (``idea``) or a free message on the run."""

    def add_candidate(self, run: Any, author: str, source: str, idea: Any = None, *, parent: Any = None,
                      author_kind: str = "") -> str:
        """Store a candidate source; returns its id (``records.candidate_id``: a hash of run and
        source). ``parent`` is the candidate it modifies (lineage), ``author_kind`` what wrote it
        ("llm", "offline", ...). The same source added again to the run returns the same id and
        keeps the first author, idea and parent. A ``parent`` that is not a candidate is a
        BoardError."""

    def add_evaluation(self, candidate: Any, tier: str, point: Mapping[str, Any] | None,
                       metrics: Mapping[str, Any], verdict: str, reasons: Sequence[str] = (), device: str = "",
                       versions: Mapping[str, Any] | None = None, timing_method: str = "",
                       idempotency_key: str | None = None) -> Evaluation:
        """Record one measurement of a candidate: ``tier`` ("fast", "slow", ...), the workload
        ``point`` (dict, or None for all points), ``metrics`` (dict; ``metrics["speedup"]`` is also
        stored as a sortable column), ``verdict`` (e.g. "correct", "rejected"), ``reasons``,
        ``device``, software ``versions`` and the ``timing_method``."""

    def add_optimization(self, run: Any, candidate: Any, name: str, targets: Sequence[str],
                         speedups: Mapping[str, float], per_point: Sequence[Mapping] = (), plan_version: int = 1,
                         status: str = "active", idempotency_key: str | None = None) -> Optimization:
        """Record an accepted optimization: ``speedups`` as ``{"fast": x, "slow": y}``,
        ``per_point`` (list of dicts), the plan version it went into, status active|retired.
        Idempotent: one row per (run, candidate, name, plan version) unless another
        ``idempotency_key`` is given; a retry returns the first row."""

    def set_optimization_status(self, optimization: Any, status: str) -> Optimization:
        """Retire (or re-activate) an accepted optimization."""

    def add_drift_event(self, deployment: Any, drifted: bool, features: Sequence[Mapping] | Mapping,
                        run: Any = None, old_hash: str = "", new_hash: str = "") -> DriftEvent:
        """Record a drift check of a deployment's traffic: the verdict and the per-feature table
        (``traffic diff --json``'s ``features``: name, statistic, threshold, drifted)."""

    # ------------------------------------------------------------------ what was judged before (across runs)
    def remember(self, run: Any, *, model: str, hw: str, shape_class: str, source: str, verdict: str,
                 speedup: float | None = None, kind: str = "source", target: str = "", title: str = "",
                 knobs: Mapping[str, Any] | None = None, metrics: Mapping[str, Any] | None = None) -> Tried:
        """Record that ``source`` was judged for (model, hw, shape_class) in ``run`` with ``verdict``
        ("accepted" | "correct" | "rejected"); a later judgement of the same source replaces it."""

    def recall(self, model: str, hw: str, shape_class: str, *, kind: str | None = None, limit: int = 10000) -> list[Tried]:
        """What was judged before for (model, hw, shape_class), best speedup first (``Board.remember``).
        Cost: one indexed query of at most ``limit`` rows."""

    # ------------------------------------------------------------------ reads
    def db_time(self) -> float:
        """The database's clock now (float epoch seconds): the clock of leases and timestamps."""

    def get_run(self, run: Any) -> Run | None:
        """The run of that id (or row), or None."""

    def get_deployment(self, deployment: Any) -> Deployment | None:
        """The deployment of that id (or row), or None."""

    def get_idea(self, idea: Any) -> Idea | None:
        """The idea of that id (or row), or None."""

    def get_candidate(self, candidate: Any) -> Candidate | None:
        """The candidate of that id (``candidate_id``), or None."""

    def get_optimization(self, optimization: Any) -> Optimization | None:
        """The optimization of that id (or row), or None."""

    def idea_counts(self, run: Any) -> dict[str, int]:
        """``{status: count}`` of the run's ideas (every status present, zeros included)."""

    def lineage(self, run: Any) -> list[dict]:
        """Every parent -> child edge of a run's candidates: ``{"parent", "child", "parent_author",
        "child_author", "child_kind"}``, oldest child first (ties within the clock's resolution by id):
        who built on whom."""

    def thread(self, idea: Any, *, limit: int = 1000) -> tuple[Idea, tuple[Post, ...]]:
        """An idea and its thread (oldest post first)."""

    def list_deployments(self, *, model: str | None = None, hw: str | None = None, sort: str = "-date",
                         limit: int = 50, offset: int = 0) -> Page[Deployment]:
        """Deployments, newest first by default; a ``Page`` (``items``, ``total``)."""

    def list_runs(self, *, deployment: Any = None, status: str | None = None, model: str | None = None,
                  hw: str | None = None, sort: str = "-date", limit: int = 50, offset: int = 0) -> Page[Run]:
        """Runs, filtered by deployment, status, model or hw."""

    def list_ideas(self, run: Any = None, *, status: str | None = None, target: str | None = None,
                   author: str | None = None, parent: Any = None, sort: str = "id", limit: int = 50,
                   offset: int = 0) -> Page[Idea]:
        """Ideas of a run (or all), filtered; ``parent`` gives the children of that idea."""

    def list_posts(self, run: Any = None, *, idea: Any = None, free: bool = False, author: str | None = None,
                   kind: str | None = None, sort: str = "id", limit: int = 100, offset: int = 0) -> Page[Post]:
        """Posts of a run; ``idea`` gives that idea's thread, ``free=True`` the posts on no idea."""

    def list_claims(self, run: Any = None, *, idea: Any = None, agent: str | None = None,
                    status: str | None = None, sort: str = "id", limit: int = 100, offset: int = 0) -> Page[Claim]:
        """Claim history: status held | done | failed | released | lapsed."""

    def list_candidates(self, run: Any = None, *, idea: Any = None, author: str | None = None,
                        parent: Any = None, author_kind: str | None = None, sort: str = "date", limit: int = 50,
                        offset: int = 0) -> Page[Candidate]:
        """Candidates of a run; ``parent`` gives the children of that candidate (lineage)."""

    def list_evaluations(self, run: Any = None, *, candidate: Any = None, tier: str | None = None,
                         verdict: str | None = None, device: str | None = None, sort: str = "-date",
                         limit: int = 50, offset: int = 0) -> Page[Evaluation]:
        """Evaluations of a run or of one candidate, filtered by tier, verdict, device."""

    def list_optimizations(self, *, deployment: Any = None, run: Any = None, status: str | None = None,
                           op: str | None = None, agent: str | None = None, plan_version: int | None = None,
                           sort: str = "-speedup", limit: int = 50, offset: int = 0) -> Page[Optimization]:
        """Accepted optimizations; ``op`` keeps those targeting that op, ``agent`` those by that
        author. Sort ``speedup`` is the slow-tier speedup (the fast one when not confirmed yet)."""

    def list_drift_events(self, *, deployment: Any = None, run: Any = None, drifted: bool | None = None,
                          sort: str = "-date", limit: int = 50, offset: int = 0) -> Page[DriftEvent]:
        """Drift checks of a deployment or run; ``drifted`` keeps one verdict."""

    def export_run(self, run: Any) -> dict:
        """Everything recorded about a run as one JSON-able dict: the run (with its baseline), its
        deployment, ideas (each with its thread), free posts, claims, candidates (with sources),
        evaluations, optimizations and drift events."""

    # ------------------------------------------------------------------ lifetime
    def close(self) -> None:
        """Close every pooled connection (the Board must not be used afterwards)."""
