"""Read queries of the Board: single records, paginated and filtered lists for the UI, export.

Every ``list_*`` returns a :class:`records.Page` (``items`` plus ``total``, the number of rows
matching the filters, for pagination). ``sort`` is a key of that list's sort table, ``"-key"``
for descending; ties are broken by id so pages never overlap. Filters left at None are not
applied. Reads use the read engine: on SQLite they never take the write lock. Each list costs
two queries (the page and its count), both served by the indexes of ``schema.py``.
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Select, func, select

from .records import (BoardError, Candidate, Claim, Deployment, DriftEvent, Evaluation, Idea,
                      Optimization, Page, Post, Run, Tried, id_of)
from .schema import (T_CANDIDATES, T_CLAIMS, T_DEPLOYMENTS, T_DRIFT, T_EVALUATIONS, T_IDEAS,
                     T_OPTIMIZATIONS, T_POSTS, T_RUNS, T_TRIED)

MAX_LIMIT = 1000

_RUN_SORT = {"date": T_RUNS.c.created_at, "updated": T_RUNS.c.updated_at,
             "speedup": T_RUNS.c.best_speedup, "status": T_RUNS.c.status, "model": T_RUNS.c.model,
             "id": T_RUNS.c.id}
_IDEA_SORT = {"id": T_IDEAS.c.id, "date": T_IDEAS.c.created_at, "updated": T_IDEAS.c.updated_at,
              "priority": T_IDEAS.c.priority, "status": T_IDEAS.c.status,
              "target": T_IDEAS.c.target, "author": T_IDEAS.c.author, "title": T_IDEAS.c.title}
_POST_SORT = {"id": T_POSTS.c.id, "date": T_POSTS.c.created_at, "author": T_POSTS.c.author}
_CLAIM_SORT = {"id": T_CLAIMS.c.id, "date": T_CLAIMS.c.claimed_at, "agent": T_CLAIMS.c.agent}
_CANDIDATE_SORT = {"date": T_CANDIDATES.c.created_at, "author": T_CANDIDATES.c.author,
                   "id": T_CANDIDATES.c.id}
_EVAL_SORT = {"id": T_EVALUATIONS.c.id, "date": T_EVALUATIONS.c.created_at,
              "speedup": T_EVALUATIONS.c.speedup, "tier": T_EVALUATIONS.c.tier,
              "verdict": T_EVALUATIONS.c.verdict}
_OPT_SORT = {"speedup": func.coalesce(T_OPTIMIZATIONS.c.speedup_slow,
                                      T_OPTIMIZATIONS.c.speedup_fast),
             "speedup_fast": T_OPTIMIZATIONS.c.speedup_fast,
             "speedup_slow": T_OPTIMIZATIONS.c.speedup_slow,
             "date": T_OPTIMIZATIONS.c.created_at, "name": T_OPTIMIZATIONS.c.name,
             "agent": T_OPTIMIZATIONS.c.author, "op": T_OPTIMIZATIONS.c.targets_key,
             "plan_version": T_OPTIMIZATIONS.c.plan_version, "id": T_OPTIMIZATIONS.c.id}
_DRIFT_SORT = {"date": T_DRIFT.c.created_at, "id": T_DRIFT.c.id}
_DEPLOYMENT_SORT = {"date": T_DEPLOYMENTS.c.created_at, "model": T_DEPLOYMENTS.c.model,
                    "hw": T_DEPLOYMENTS.c.hw, "id": T_DEPLOYMENTS.c.id}


def _where(stmt: Select, **filters: tuple[Any, Any]) -> Select:
    """``stmt`` filtered by ``column == value`` for each (column, value) whose value is not None."""
    for column, value in filters.values():
        if value is not None:
            stmt = stmt.where(column == (id_of(value)))
    return stmt


class BoardQueries:
    """Mixed into :class:`bulletin_board.Board`; needs ``self._e`` (connect.Engines)."""

    def _page(self, stmt: Select, table, cls, sort: str, table_sort: dict, limit: int,
              offset: int) -> Page:
        if not 1 <= int(limit) <= MAX_LIMIT or int(offset) < 0:
            raise BoardError(f"page limit must be 1..{MAX_LIMIT} and offset >= 0, "
                             f"not limit={limit} offset={offset}")
        key = sort.lstrip("-")
        if key not in table_sort:
            raise BoardError(f"cannot sort by {sort!r}; sort keys: {', '.join(sorted(table_sort))} "
                             "(prefix '-' for descending)")
        col = table_sort[key]
        desc = sort.startswith("-")
        order = (col.desc().nulls_last(), table.c.id.desc()) if desc else \
                (col.asc().nulls_last(), table.c.id.asc())
        count = select(func.count()).select_from(stmt.with_only_columns(table.c.id).subquery())
        with self._e.read.connect() as conn:
            total = conn.execute(count).scalar_one()
            page = stmt.order_by(*order).limit(int(limit)).offset(int(offset))
            rows = conn.execute(page).mappings()
            items = tuple(cls.from_row(r) for r in rows)
        return Page(items=items, total=int(total), limit=int(limit), offset=int(offset))

    def _get(self, table, cls, key: Any):
        with self._e.read.connect() as conn:
            row = conn.execute(select(table).where(table.c.id == id_of(key))).mappings().first()
        return None if row is None else cls.from_row(row)

    def db_time(self) -> float:
        """The database's clock now (float epoch seconds): the clock of leases and timestamps."""
        from .schema import db_now

        with self._e.read.connect() as conn:
            return float(conn.execute(select(db_now())).scalar_one())

    # -- single records (None when absent) -------------------------------------------------------

    def get_run(self, run: Any) -> Run | None:
        return self._get(T_RUNS, Run, run)

    def get_deployment(self, deployment: Any) -> Deployment | None:
        return self._get(T_DEPLOYMENTS, Deployment, deployment)

    def get_idea(self, idea: Any) -> Idea | None:
        return self._get(T_IDEAS, Idea, idea)

    def get_candidate(self, candidate: Any) -> Candidate | None:
        return self._get(T_CANDIDATES, Candidate, candidate)

    def get_optimization(self, optimization: Any) -> Optimization | None:
        return self._get(T_OPTIMIZATIONS, Optimization, optimization)

    def get_baseline(self, run: Any) -> dict | None:
        """The baseline profile stored with :meth:`Board.set_baseline` (None when not set)."""
        with self._e.read.connect() as conn:
            return conn.execute(select(T_RUNS.c.baseline)
                                .where(T_RUNS.c.id == id_of(run))).scalar_one_or_none()

    def idea_exists(self, run: Any, title: str, target: str | None = None) -> bool:
        """True when the run has an idea with this target and title (case and spacing ignored),
        whatever its status: so that no idea is worked twice."""
        from .board import title_key

        with self._e.read.connect() as conn:
            return conn.execute(select(T_IDEAS.c.id).where(
                T_IDEAS.c.run_id == id_of(run),
                T_IDEAS.c.title_key == title_key(title, target))).first() is not None

    def recall(self, model: str, hw: str, shape_class: str, *, kind: str | None = None,
               limit: int = 10000) -> list[Tried]:
        """What was judged before for (model, hw, shape_class), best speedup first (``Board.remember``).
        Cost: one indexed query of at most ``limit`` rows."""
        t = T_TRIED
        stmt = select(t).where(t.c.model == model, t.c.hw == hw, t.c.shape_class == shape_class)
        if kind is not None:
            stmt = stmt.where(t.c.kind == kind)
        stmt = stmt.order_by(t.c.speedup.desc().nulls_last(), t.c.id).limit(limit)
        with self._e.read.connect() as conn:
            return [Tried.from_row(r._mapping) for r in conn.execute(stmt)]

    def lineage(self, run: Any) -> list[dict]:
        """Every parent -> child edge of a run's candidates: ``{"parent", "child", "parent_author",
        "child_author", "child_kind"}``, oldest child first (ties within the clock's resolution by id):
        who built on whom."""
        c, p = T_CANDIDATES.alias("c"), T_CANDIDATES.alias("p")
        stmt = (select(p.c.id.label("parent"), c.c.id.label("child"), p.c.author.label("parent_author"),
                       c.c.author.label("child_author"), c.c.author_kind.label("child_kind"))
                .select_from(c.join(p, c.c.parent_id == p.c.id))
                .where(c.c.run_id == id_of(run)).order_by(c.c.created_at, c.c.id).limit(MAX_LIMIT))
        with self._e.read.connect() as conn:
            return [dict(r) for r in conn.execute(stmt).mappings()]

    def idea_counts(self, run: Any) -> dict[str, int]:
        """``{status: count}`` of the run's ideas (every status present, zeros included)."""
        from .records import IDEA_STATUSES

        with self._e.read.connect() as conn:
            rows = conn.execute(select(T_IDEAS.c.status, func.count()).where(
                T_IDEAS.c.run_id == id_of(run)).group_by(T_IDEAS.c.status)).all()
        return {s: 0 for s in IDEA_STATUSES} | {s: int(n) for s, n in rows}

    # -- paginated lists ---------------------------------------------------------------------------

    def list_deployments(self, *, model: str | None = None, hw: str | None = None,
                         sort: str = "-date", limit: int = 50, offset: int = 0) -> Page[Deployment]:
        t = T_DEPLOYMENTS
        stmt = _where(select(t), model=(t.c.model, model), hw=(t.c.hw, hw))
        return self._page(stmt, t, Deployment, sort, _DEPLOYMENT_SORT, limit, offset)

    def list_runs(self, *, deployment: Any = None, status: str | None = None,
                  model: str | None = None, hw: str | None = None, sort: str = "-date",
                  limit: int = 50, offset: int = 0) -> Page[Run]:
        t = T_RUNS
        stmt = _where(select(t), d=(t.c.deployment_id, deployment), s=(t.c.status, status),
                      m=(t.c.model, model), h=(t.c.hw, hw))
        return self._page(stmt, t, Run, sort, _RUN_SORT, limit, offset)

    def list_ideas(self, run: Any = None, *, status: str | None = None, target: str | None = None,
                   author: str | None = None, parent: Any = None, sort: str = "id",
                   limit: int = 50, offset: int = 0) -> Page[Idea]:
        t = T_IDEAS
        stmt = _where(select(t), r=(t.c.run_id, run), s=(t.c.status, status),
                      t=(t.c.target, target), a=(t.c.author, author), p=(t.c.parent_id, parent))
        return self._page(stmt, t, Idea, sort, _IDEA_SORT, limit, offset)

    def list_posts(self, run: Any = None, *, idea: Any = None, free: bool = False,
                   author: str | None = None, kind: str | None = None, sort: str = "id",
                   limit: int = 100, offset: int = 0) -> Page[Post]:
        """Posts of a run; ``idea`` gives that idea's thread, ``free=True`` the posts on no idea."""
        t = T_POSTS
        stmt = _where(select(t), r=(t.c.run_id, run), i=(t.c.idea_id, idea),
                      a=(t.c.author, author), k=(t.c.kind, kind))
        if free:
            stmt = stmt.where(t.c.idea_id.is_(None))
        return self._page(stmt, t, Post, sort, _POST_SORT, limit, offset)

    def thread(self, idea: Any, *, limit: int = MAX_LIMIT) -> tuple[Idea, tuple[Post, ...]]:
        """An idea and its thread (oldest post first)."""
        found = self.get_idea(idea)
        if found is None:
            raise BoardError(f"no idea {id_of(idea)}")
        return found, self.list_posts(idea=found, limit=limit).items

    def list_claims(self, run: Any = None, *, idea: Any = None, agent: str | None = None,
                    status: str | None = None, sort: str = "id", limit: int = 100,
                    offset: int = 0) -> Page[Claim]:
        """Claim history: status held | done | failed | released | lapsed."""
        t = T_CLAIMS
        stmt = _where(select(t), r=(t.c.run_id, run), i=(t.c.idea_id, idea),
                      a=(t.c.agent, agent), s=(t.c.status, status))
        return self._page(stmt, t, Claim, sort, _CLAIM_SORT, limit, offset)

    def list_candidates(self, run: Any = None, *, idea: Any = None, author: str | None = None,
                        parent: Any = None, author_kind: str | None = None, sort: str = "date",
                        limit: int = 50, offset: int = 0) -> Page[Candidate]:
        """Candidates of a run; ``parent`` gives the children of that candidate (lineage)."""
        t = T_CANDIDATES
        stmt = _where(select(t), r=(t.c.run_id, run), i=(t.c.idea_id, idea), a=(t.c.author, author),
                      p=(t.c.parent_id, parent), k=(t.c.author_kind, author_kind))
        return self._page(stmt, t, Candidate, sort, _CANDIDATE_SORT, limit, offset)

    def list_evaluations(self, run: Any = None, *, candidate: Any = None, tier: str | None = None,
                         verdict: str | None = None, device: str | None = None,
                         sort: str = "-date", limit: int = 50,
                         offset: int = 0) -> Page[Evaluation]:
        t = T_EVALUATIONS
        stmt = _where(select(t), r=(t.c.run_id, run), c=(t.c.candidate_id, candidate),
                      t=(t.c.tier, tier), v=(t.c.verdict, verdict), d=(t.c.device, device))
        return self._page(stmt, t, Evaluation, sort, _EVAL_SORT, limit, offset)

    def list_optimizations(self, *, deployment: Any = None, run: Any = None,
                           status: str | None = None, op: str | None = None,
                           agent: str | None = None, plan_version: int | None = None,
                           sort: str = "-speedup", limit: int = 50,
                           offset: int = 0) -> Page[Optimization]:
        """Accepted optimizations; ``op`` keeps those targeting that op, ``agent`` those by that
        author. Sort ``speedup`` is the slow-tier speedup (the fast one when not confirmed yet)."""
        t = T_OPTIMIZATIONS
        stmt = _where(select(t), d=(t.c.deployment_id, deployment), r=(t.c.run_id, run),
                      s=(t.c.status, status), a=(t.c.author, agent),
                      p=(t.c.plan_version, plan_version))
        if op is not None:
            stmt = stmt.where(t.c.targets_key.contains(f",{op},", autoescape=True))
        return self._page(stmt, t, Optimization, sort, _OPT_SORT, limit, offset)

    def list_drift_events(self, *, deployment: Any = None, run: Any = None,
                          drifted: bool | None = None, sort: str = "-date", limit: int = 50,
                          offset: int = 0) -> Page[DriftEvent]:
        t = T_DRIFT
        stmt = _where(select(t), d=(t.c.deployment_id, deployment), r=(t.c.run_id, run),
                      x=(t.c.drifted, drifted))
        return self._page(stmt, t, DriftEvent, sort, _DRIFT_SORT, limit, offset)

    # -- export ------------------------------------------------------------------------------------

    @staticmethod
    def _all(method, **kw) -> list[dict]:
        """Every row of a ``list_*`` query, page by page, as dicts."""
        out: list[dict] = []
        while True:
            page = method(limit=MAX_LIMIT, offset=len(out), **kw)
            out.extend(i.to_dict() for i in page.items)
            if not page.has_next or not page.items:
                return out

    def export_run(self, run: Any) -> dict:
        """Everything recorded about a run as one JSON-able dict: the run (with its baseline), its
        deployment, ideas (each with its thread), free posts, claims, candidates (with sources),
        evaluations, optimizations and drift events."""
        found = self.get_run(run)
        if found is None:
            raise BoardError(f"no run {id_of(run)}")

        posts = self._all(self.list_posts, run=found)
        threads: dict[Any, list[dict]] = {}
        for p in posts:
            threads.setdefault(p["idea_id"], []).append(p)
        ideas = [dict(i, posts=threads.get(i["id"], []))
                 for i in self._all(self.list_ideas, run=found)]
        deployment = self.get_deployment(found.deployment_id)
        return {
            "format": "tkcc-board-run/1",
            "run": dict(found.to_dict(), baseline=self.get_baseline(found)),
            "deployment": None if deployment is None else deployment.to_dict(),
            "ideas": ideas,
            "posts": threads.get(None, []),
            "claims": self._all(self.list_claims, run=found),
            "candidates": self._all(self.list_candidates, run=found, sort="id"),
            "evaluations": self._all(self.list_evaluations, run=found, sort="id"),
            "optimizations": self._all(self.list_optimizations, run=found, sort="id"),
            "drift_events": self._all(self.list_drift_events, run=found, sort="id"),
        }
