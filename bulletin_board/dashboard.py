"""Read queries the web UI (``compiler.ui``) needs beyond ``bulletin_board.queries``: per-deployment summaries, the
speedup history for the chart, the latest baseline profile, filter choices and verdict counts.

They live here, beside the schema, so that no other package touches the board's tables.
They run on their own read-only engines (``connect.open_engines(readonly=True)``:
SQLite ``mode=ro`` + ``PRAGMA query_only``, PostgreSQL ``READ ONLY`` transactions), so the UI never
takes a write lock. Every query is bounded (``LIMIT`` or ``GROUP BY`` over an indexed column), so
a page costs a few milliseconds on a board with tens of thousands of rows.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Iterable

from sqlalchemy import case, func, select

from .connect import open_engines
from .records import Optimization
from .schema import (T_CANDIDATES, T_DRIFT, T_EVALUATIONS, T_IDEAS, T_OPTIMIZATIONS,
                                   T_RUNS)

HISTORY_LIMIT = 500         # optimizations drawn on the speedup-over-time chart (newest kept)
CHOICES_LIMIT = 200         # distinct values offered in a filter drop-down


@dataclass(frozen=True)
class DeploymentSummary:
    runs: int
    running: int
    active: int                 # active accepted optimizations
    best: float | None          # best speedup of an active optimization (slow tier, else fast)
    drifts: int                 # drift checks that found drift


@dataclass(frozen=True)
class HistoryPoint:
    at: float                   # epoch seconds (database clock)
    speedup: float
    name: str
    id: int


def _speedup_col():
    o = T_OPTIMIZATIONS.c
    return func.coalesce(o.speedup_slow, o.speedup_fast)


class UIQueries:
    """The UI's own read-only queries on a board URL."""

    def __init__(self, url: str):
        self._e = open_engines(url, readonly=True)

    def close(self) -> None:
        self._e.dispose()

    def _rows(self, stmt) -> list[Any]:
        with self._e.read.connect() as conn:
            return list(conn.execute(stmt).all())

    def deployment_summaries(self, ids: Iterable[int]) -> dict[int, DeploymentSummary]:
        """Counts for the deployments on one page (4 grouped queries, whatever the page size)."""
        ids = list(ids)
        if not ids:
            return {}
        r, o, d = T_RUNS.c, T_OPTIMIZATIONS.c, T_DRIFT.c
        runs = {k: (n, m) for k, n, m in self._rows(
            select(r.deployment_id, func.count(), func.sum(case((r.status == "running", 1), else_=0)))
            .where(r.deployment_id.in_(ids)).group_by(r.deployment_id))}
        opts = {k: (n, b) for k, n, b in self._rows(
            select(o.deployment_id, func.count(), func.max(_speedup_col()))
            .where(o.deployment_id.in_(ids), o.status == "active").group_by(o.deployment_id))}
        drifts = dict(self._rows(select(d.deployment_id, func.count())
                                 .where(d.deployment_id.in_(ids), d.drifted.is_(True))
                                 .group_by(d.deployment_id)))
        return {i: DeploymentSummary(runs=int(runs.get(i, (0, 0))[0]),
                                     running=int(runs.get(i, (0, 0))[1] or 0),
                                     active=int(opts.get(i, (0, None))[0]),
                                     best=opts.get(i, (0, None))[1], drifts=int(drifts.get(i, 0)))
                for i in ids}

    def speedup_history(self, deployment: int, run: int | None = None) -> list[HistoryPoint]:
        """Accepted optimizations of a deployment (or one run) in time order, for the chart."""
        o = T_OPTIMIZATIONS.c
        stmt = (select(o.created_at, _speedup_col(), o.name, o.id)
                .where(o.deployment_id == deployment).order_by(o.created_at.desc(), o.id.desc())
                .limit(HISTORY_LIMIT))
        if run is not None:
            stmt = stmt.where(o.run_id == run)
        rows = [HistoryPoint(float(a), float(s), n, int(i)) for a, s, n, i in self._rows(stmt)
                if s is not None]
        return rows[::-1]

    def latest_baseline(self, deployment: int | None = None, run: int | None = None
                        ) -> tuple[int, dict] | None:
        """(run id, baseline profile) of the newest run with a baseline, of a run or a deployment."""
        r = T_RUNS.c
        stmt = select(r.id, r.baseline).where(r.baseline.is_not(None)).order_by(r.id.desc()).limit(1)
        if deployment is not None:
            stmt = stmt.where(r.deployment_id == deployment)
        if run is not None:
            stmt = stmt.where(r.id == run)
        rows = self._rows(stmt)
        return (int(rows[0][0]), rows[0][1]) if rows and isinstance(rows[0][1], dict) else None

    def best_per_target(self, run: int) -> list[Optimization]:
        """The fastest active optimization of a run for each set of target ops (what a plan
        composes): one grouped query, then those rows only."""
        o = T_OPTIMIZATIONS.c
        best = (select(o.targets_key, func.max(_speedup_col()).label("best"))
                .where(o.run_id == run, o.status == "active").group_by(o.targets_key).subquery())
        stmt = (select(T_OPTIMIZATIONS)
                .join(best, (best.c.targets_key == o.targets_key) & (best.c.best == _speedup_col()))
                .where(o.run_id == run, o.status == "active").order_by(o.id))
        seen: dict[str, Optimization] = {}
        for row in self._rows(stmt):
            seen.setdefault(row.targets_key, Optimization.from_row(row._mapping))
        return list(seen.values())

    def optimization_choices(self) -> tuple[list[str], list[str]]:
        """(ops, agents) appearing in accepted optimizations, for the filter drop-downs."""
        o = T_OPTIMIZATIONS.c
        keys = [k for (k,) in self._rows(select(o.targets_key).distinct().limit(CHOICES_LIMIT))]
        ops = sorted({op for k in keys for op in (k or "").split(",") if op})
        agents = [a for (a,) in self._rows(select(o.author).distinct().order_by(o.author)
                                           .limit(CHOICES_LIMIT))]
        return ops, agents

    def idea_choices(self, run: int | None) -> tuple[list[str], list[str]]:
        """(targets, authors) of a run's ideas (or all ideas), for the filter drop-downs."""
        i = T_IDEAS.c
        t = select(i.target).where(i.target.is_not(None)).distinct().order_by(i.target)
        a = select(i.author).distinct().order_by(i.author)
        if run is not None:
            t, a = t.where(i.run_id == run), a.where(i.run_id == run)
        return ([x for (x,) in self._rows(t.limit(CHOICES_LIMIT))],
                [x for (x,) in self._rows(a.limit(CHOICES_LIMIT))])

    def verdict_counts(self, run: int) -> dict[str, int]:
        """``{verdict: count}`` of a run's evaluations."""
        e = T_EVALUATIONS.c
        return {v: int(n) for v, n in self._rows(
            select(e.verdict, func.count()).where(e.run_id == run).group_by(e.verdict))}

    def idea_evaluations(self, idea: int, limit: int = 50) -> list[dict]:
        """The evaluations of the candidates written for an idea, newest first (with authors)."""
        c, e = T_CANDIDATES.c, T_EVALUATIONS.c
        stmt = (select(e.id, e.candidate_id, e.tier, e.speedup, e.verdict, e.reasons, e.created_at,
                       c.author)
                .join(T_CANDIDATES, c.id == e.candidate_id).where(c.idea_id == idea)
                .order_by(e.id.desc()).limit(limit))
        return [dict(r._mapping) for r in self._rows(stmt)]

    def optimization_of_candidate(self, candidate: str) -> int | None:
        """The id of the accepted optimization made from a candidate (newest), if any."""
        o = T_OPTIMIZATIONS.c
        rows = self._rows(select(o.id).where(o.candidate_id == candidate).order_by(o.id.desc()).limit(1))
        return int(rows[0][0]) if rows else None
