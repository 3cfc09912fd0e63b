"""The Board: the one object agents, the compiler and the UI use to share a run's state.

```python
board = Board("sqlite:///tkcc.db")                       # creates or migrates the schema
run = board.create_run(model="glm", hw="b200", traffic_hash="ab12")
idea = board.post_idea(run, author="agent-3", title="fuse rms_norm", body="...", target="rms_norm")
claimed = board.claim_idea(run, agent="agent-5", lease_s=300)   # atomic; None when nothing is open
board.heartbeat(claimed, agent="agent-5")                # True while the claim is still ours
board.finish_idea(claimed, agent="agent-5", status="done")       # or "failed"
cid = board.add_candidate(run, author="agent-5", source=src, idea=claimed)
board.add_evaluation(cid, tier="fast", point=None, metrics={"speedup": 1.2}, verdict="correct")
```

Guarantees:
- every write method is one transaction: a process killed in the middle leaves nothing of it;
- ``claim_idea`` is atomic on SQLite (one ``UPDATE ... RETURNING`` under ``BEGIN IMMEDIATE``) and on
  PostgreSQL (``UPDATE ... WHERE id = (SELECT ... FOR UPDATE SKIP LOCKED) RETURNING``): an idea is
  never held by two live claims; a claim whose lease (database clock) lapsed returns the idea to
  the pool, and the lapsed claim is recorded as such;
- an idea is identified by its run, target and normalised title: posting it twice gives one idea,
  so no idea is worked twice;
- a candidate's id is a hash of its run and source (``records.candidate_id``): adding it twice
  gives one candidate.
Methods taking a run, idea, candidate, deployment or optimization accept the record or its id.
Read queries (paginated, for the UI) and ``export_run`` are in ``queries.py``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
from typing import Any, Iterator, Mapping, Sequence

from sqlalchemy import Connection, bindparam, case, insert, or_, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError, OperationalError

from .claims import claim_statements
from .connect import open_engines, write_transaction
from .migrate import ensure_schema
from .queries import BoardQueries
from .records import (FINISH_STATUSES, OPTIMIZATION_STATUSES, RUN_STATUSES, BoardError,
                      Deployment, DriftEvent, Evaluation, Idea, Optimization, Post, Run,
                      SchemaError, Tried, candidate_id, id_of, source_hash)
from .schema import (T_CANDIDATES, T_DEPLOYMENTS, T_DRIFT, T_EVALUATIONS, T_IDEAS,
                     T_OPTIMIZATIONS, T_POSTS, T_RUNS, T_TRIED, db_now)


def jsonable(obj: Any) -> Any:
    """``obj`` as plain JSON types: tuples/sets become lists, numpy scalars and arrays plain
    numbers and lists, non-finite floats ``None`` (PostgreSQL's json rejects NaN), other objects
    their ``str``."""
    if obj is None or isinstance(obj, (bool, int, str)):
        return obj
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, Mapping):
        return {str(k): jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple, set, frozenset)):
        return [jsonable(v) for v in obj]
    if hasattr(obj, "tolist"):                    # numpy / torch scalars and arrays
        return jsonable(obj.tolist())
    if hasattr(obj, "to_dict"):
        return jsonable(obj.to_dict())
    return str(obj)


def _finite(x: Any) -> float | None:
    try:
        x = float(x)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def content_key(*parts: Any) -> str:
    """An idempotency key from a write's content: sha256 of its canonical JSON, 64 hex digits."""
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()


def _key(key: str | None) -> str | None:
    """A caller's idempotency key, checked (1-64 characters) or None."""
    if key is None:
        return None
    key = str(key)
    if not 0 < len(key) <= 64:
        raise BoardError(f"an idempotency key has 1 to 64 characters, not {len(key)}")
    return key


def title_key(title: str, target: str | None) -> str:
    """What makes two ideas the same: target and title, case and spacing ignored (sha1 hex)."""
    norm = " ".join(title.lower().split())
    return hashlib.sha1(f"{target or ''}\x1f{norm}".encode()).hexdigest()


# statements of the hot paths, built once (values come as execution parameters)
_POST = insert(T_POSTS).values(created_at=db_now()).returning(*T_POSTS.c)
_IDEA_BY_KEY = select(T_IDEAS).where(T_IDEAS.c.run_id == bindparam("p_run"),
                                     T_IDEAS.c.title_key == bindparam("p_key"))


class Board(BoardQueries):
    """A board on ``url`` (``sqlite:///path.db`` by default; ``postgresql://...`` for many
    machines). ``readonly=True`` never writes nor takes a write lock (the UI); ``migrate=False``
    refuses an older schema instead of upgrading it. Raises :class:`SchemaError` (one line) when
    the database cannot be opened or its schema is newer than this code. Thread-safe."""

    def __init__(self, url: str = "sqlite:///tkcc.db", *, readonly: bool = False,
                 migrate: bool = True):
        self.readonly = readonly
        self._e = open_engines(url, readonly=readonly)
        self.url = self._e.url
        self.dialect = self._e.dialect
        self._claims = claim_statements(self.dialect)
        self._idea_insert = (self._insert(T_IDEAS).values(created_at=db_now(), updated_at=db_now())
                             .on_conflict_do_nothing(index_elements=["run_id", "title_key"]))
        try:
            self.schema_version = ensure_schema(self._e, migrate=migrate)
        except OperationalError as exc:
            self._e.dispose()
            first = str(exc.orig).strip().splitlines()[0] if exc.orig else type(exc).__name__
            raise SchemaError(f"cannot open the board at {self.url}: {first}") from None
        except BaseException:
            self._e.dispose()
            raise

    # -- plumbing -----------------------------------------------------------------------------

    def close(self) -> None:
        """Close every pooled connection (the Board must not be used afterwards)."""
        self._e.dispose()

    def __enter__(self) -> "Board":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Board({self.url!r}{', readonly=True' if self.readonly else ''})"

    @contextlib.contextmanager
    def _write(self, what: str) -> Iterator[Connection]:
        """One write transaction; a constraint violation becomes a one-line BoardError."""
        if self._e.write is None:
            raise BoardError(f"{what}: the board at {self.url} is open read-only")
        try:
            with write_transaction(self._e) as conn:
                yield conn
        except IntegrityError as exc:
            first = str(exc.orig).strip().splitlines()[0] if exc.orig else str(exc)
            raise BoardError(f"{what}: refers to a run, idea or candidate that does not exist "
                             f"({first})") from None

    def _insert(self, table):
        return (postgresql.insert if self.dialect == "postgresql" else sqlite.insert)(table)

    def _insert_once(self, conn: Connection, table, values: dict, key: str | None, cls, what: str):
        """INSERT ... RETURNING one record; with an idempotency ``key`` already on the table (a retried
        write whose first attempt committed) nothing is inserted and the first row is returned."""
        if key is None:
            return self._one(conn, insert(table).values(**values).returning(*table.c), cls, what)
        row = conn.execute(self._insert(table).values(**values, idempotency_key=key)
                           .on_conflict_do_nothing(index_elements=["idempotency_key"])
                           .returning(*table.c)).mappings().first()
        if row is None:
            row = conn.execute(select(table).where(table.c.idempotency_key == key)).mappings().first()
        if row is None:
            raise BoardError(what)
        return cls.from_row(row)

    @staticmethod
    def _one(conn: Connection, stmt, cls, what: str):
        row = conn.execute(stmt).mappings().first()
        if row is None:
            raise BoardError(what)
        return cls.from_row(row)

    # -- deployments and runs -------------------------------------------------------------------

    def _deployment_id(self, conn: Connection, model: str, hw: str, traffic_hash: str,
                       name: str) -> int:
        t = T_DEPLOYMENTS
        conn.execute(self._insert(t).values(model=model, hw=hw, traffic_hash=traffic_hash,
                                            name=name, created_at=db_now())
                     .on_conflict_do_nothing(index_elements=["model", "hw", "traffic_hash"]))
        return conn.execute(select(t.c.id).where(t.c.model == model, t.c.hw == hw,
                                                 t.c.traffic_hash == traffic_hash)).scalar_one()

    def deployment(self, model: str, hw: str, traffic_hash: str, *, name: str = "") -> Deployment:
        """The deployment (model, hw, traffic profile hash), created on first use."""
        with self._write("deployment") as conn:
            did = self._deployment_id(conn, model, hw, traffic_hash, name)
            return self._one(conn, select(T_DEPLOYMENTS).where(T_DEPLOYMENTS.c.id == did),
                             Deployment, f"no deployment {did}")

    def create_run(self, model: str, hw: str, traffic_hash: str = "", *,
                   config: Mapping[str, Any] | None = None, deployment_name: str = "",
                   idempotency_key: str | None = None, deployment_hash: str | None = None) -> Run:
        """A new run (status "running") of the deployment (model, hw, ``deployment_hash`` or else
        traffic_hash: a recompile on drifted traffic stays under its first version's deployment). The same
        ``idempotency_key`` again (a retry) returns the run it created instead of a second one."""
        with self._write("create_run") as conn:
            did = self._deployment_id(conn, model, hw, deployment_hash or traffic_hash, deployment_name)
            values = dict(
                deployment_id=did, model=model, hw=hw, traffic_hash=traffic_hash, status="running",
                message="", config=jsonable(dict(config or {})), baseline=None, candidates_tried=0,
                candidates_accepted=0, best_speedup=None, engine_restarts=0, created_at=db_now(),
                updated_at=db_now())
            return self._insert_once(conn, T_RUNS, values, _key(idempotency_key), Run, "create_run returned nothing")

    def update_run(self, run: Any, *, status: str | None = None, message: str | None = None,
                   candidates_tried: int | None = None, candidates_accepted: int | None = None,
                   best_speedup: float | None = None, engine_restarts: int | None = None,
                   config: Mapping[str, Any] | None = None) -> Run:
        """Set a run's status and progress fields (None leaves a field as it is). A final status
        (done, failed, interrupted) stamps ``finished_at``."""
        values: dict[str, Any] = {"updated_at": db_now()}
        if status is not None:
            if status not in RUN_STATUSES:
                raise BoardError(f"run status must be one of {', '.join(RUN_STATUSES)}, "
                                 f"not {status!r}")
            values["status"] = status
            values["finished_at"] = None if status == "running" else db_now()
        for key, val in (("message", message), ("candidates_tried", candidates_tried),
                         ("candidates_accepted", candidates_accepted),
                         ("engine_restarts", engine_restarts)):
            if val is not None:
                values[key] = val
        if best_speedup is not None:
            values["best_speedup"] = _finite(best_speedup)
        if config is not None:
            values["config"] = jsonable(dict(config))
        return self._update_run(run, values, "update_run")

    def record_progress(self, run: Any, *, tried: int = 0, accepted: int = 0, restarts: int = 0,
                        speedup: float | None = None) -> Run:
        """Atomically add to a run's counters and raise ``best_speedup`` to ``speedup`` if higher
        (safe with many writers: no read-modify-write in Python)."""
        c = T_RUNS.c
        values: dict[str, Any] = {
            "updated_at": db_now(), "candidates_tried": c.candidates_tried + int(tried),
            "candidates_accepted": c.candidates_accepted + int(accepted),
            "engine_restarts": c.engine_restarts + int(restarts)}
        s = _finite(speedup)
        if s is not None:
            values["best_speedup"] = case(
                (or_(c.best_speedup.is_(None), c.best_speedup < s), s), else_=c.best_speedup)
        return self._update_run(run, values, "record_progress")

    def set_baseline(self, run: Any, profile: Mapping[str, Any]) -> Run:
        """Store the run's baseline profile (any JSON-able dict, e.g. ``Supervisor.profile()``)."""
        return self._update_run(run, {"baseline": jsonable(dict(profile)), "updated_at": db_now()},
                                "set_baseline")

    def _update_run(self, run: Any, values: dict, what: str) -> Run:
        rid = id_of(run)
        with self._write(what) as conn:
            stmt = update(T_RUNS).where(T_RUNS.c.id == rid).values(**values).returning(*T_RUNS.c)
            return self._one(conn, stmt, Run, f"{what}: no run {rid}")

    # -- ideas and claims -----------------------------------------------------------------------

    def post_idea(self, run: Any, author: str, title: str, body: str = "",
                  target: str | None = None, tags: Sequence[str] = (), parent: Any = None,
                  priority: float = 0.0) -> Idea:
        """Post an idea (status "open"); ``priority`` orders the pool (higher first). An idea with
        the same target and title (case and spacing ignored) already on the run is returned as
        is."""
        if not title or not title.strip():
            raise BoardError("post_idea: an idea needs a title")
        rid, key = id_of(run), title_key(title, target)
        with self._write("post_idea") as conn:
            conn.execute(self._idea_insert, {
                "run_id": rid, "parent_id": None if parent is None else id_of(parent),
                "author": author, "title": title.strip(), "title_key": key, "body": body,
                "target": target, "tags": [str(x) for x in tags], "priority": float(priority),
                "status": "open", "claims": 0})
            row = conn.execute(_IDEA_BY_KEY, {"p_run": rid, "p_key": key}).mappings().first()
            if row is None:
                raise BoardError(f"post_idea: no run {rid}")
            return Idea.from_row(row)

    def claim_idea(self, run: Any, agent: str, lease_s: float = 300.0, *, target: str | None = None) -> Idea | None:
        """Atomically claim the open idea of highest priority (oldest first) for ``agent`` for
        ``lease_s`` seconds of the database's clock; an idea whose lease lapsed is open again.
        ``target``: only ideas with that target. Returns the claimed idea, or None when nothing is
        open. Keep it with :meth:`heartbeat`."""
        if lease_s <= 0:
            raise BoardError(f"claim_idea: lease_s must be positive, not {lease_s}")
        stmts = self._claims if target is None else claim_statements(self.dialect, True)
        params = {"p_run": id_of(run), "p_agent": agent, "p_lease": float(lease_s)}
        if target is not None:
            params["p_target"] = target
        with self._write("claim_idea") as conn:
            row = conn.execute(stmts.claim, params).mappings().first()
            if row is None:
                return None
            conn.execute(self._claims.lapse, {"p_idea": row["id"]})
            conn.execute(self._claims.record, {"p_idea": row["id"], "p_run": row["run_id"],
                                               "p_agent": agent})
            return Idea.from_row(row)

    def heartbeat(self, idea: Any, agent: str, lease_s: float | None = None) -> bool:
        """Extend ``agent``'s claim by its lease (or by ``lease_s``, which becomes its lease) from
        now. False when the claim is no longer ``agent``'s (it lapsed and another agent took the
        idea, or it was finished)."""
        with self._write("heartbeat") as conn:
            return conn.execute(self._claims.heartbeat, {
                "p_idea": id_of(idea), "p_agent": agent,
                "p_lease": None if lease_s is None else float(lease_s)}).rowcount == 1

    def finish_idea(self, idea: Any, agent: str, status: str = "done") -> bool:
        """Mark ``agent``'s claimed idea "done" or "failed". False (and nothing changes) when the
        claim is no longer ``agent``'s."""
        if status not in FINISH_STATUSES:
            raise BoardError(f"finish_idea: status must be 'done' or 'failed', not {status!r}")
        return self._end_claim(self._claims.finish, idea, agent, status)

    def release_idea(self, idea: Any, agent: str) -> bool:
        """Give ``agent``'s claimed idea back to the pool unfinished (status "open")."""
        return self._end_claim(self._claims.release, idea, agent, "released")

    def _end_claim(self, stmt, idea: Any, agent: str, status: str) -> bool:
        params = {"p_idea": id_of(idea), "p_agent": agent, "p_status": status}
        with self._write("finish_idea") as conn:
            if conn.execute(stmt, params).rowcount != 1:
                return False
            conn.execute(self._claims.close, params)
            return True

    # -- posts, candidates, evaluations -----------------------------------------------------------

    def post(self, run: Any, author: str, body: str, idea: Any = None, kind: str = "note") -> Post:
        """A message on an idea's thread (``idea``) or a free message on the run."""
        with self._write("post") as conn:
            row = conn.execute(_POST, {"run_id": id_of(run), "author": author, "kind": kind,
                                       "idea_id": None if idea is None else id_of(idea),
                                       "body": body}).mappings().one()
            return Post.from_row(row)

    def add_candidate(self, run: Any, author: str, source: str, idea: Any = None, *,
                      parent: Any = None, author_kind: str = "") -> str:
        """Store a candidate source; returns its id (``records.candidate_id``: a hash of run and
        source). ``parent`` is the candidate it modifies (lineage), ``author_kind`` what wrote it
        ("llm", "offline", ...). The same source added again to the run returns the same id and
        keeps the first author, idea and parent. A ``parent`` that is not a candidate is a
        BoardError."""
        rid = id_of(run)
        cid = candidate_id(rid, source)
        pid = None if parent is None else str(id_of(parent))
        if pid == cid:
            raise BoardError("add_candidate: a candidate cannot be its own parent")
        with self._write("add_candidate") as conn:
            conn.execute(self._insert(T_CANDIDATES).values(
                id=cid, run_id=rid, idea_id=None if idea is None else id_of(idea), author=author,
                source=source, source_hash=source_hash(source), created_at=db_now(),
                parent_id=pid, author_kind=str(author_kind or ""))
                .on_conflict_do_nothing(index_elements=["id"]))
        return cid

    def add_evaluation(self, candidate: Any, tier: str, point: Mapping[str, Any] | None,
                       metrics: Mapping[str, Any], verdict: str, reasons: Sequence[str] = (),
                       device: str = "", versions: Mapping[str, Any] | None = None,
                       timing_method: str = "", idempotency_key: str | None = None) -> Evaluation:
        """Record one measurement of a candidate: ``tier`` ("fast", "slow", ...), the workload
        ``point`` (dict, or None for all points), ``metrics`` (dict; ``metrics["speedup"]`` is also
        stored as a sortable column), ``verdict`` (e.g. "correct", "rejected"), ``reasons``,
        ``device``, software ``versions`` and the ``timing_method``.

        Idempotent: a retried write (same ``idempotency_key``; by default a hash of everything
        recorded, so the very same measurement) returns the first row and adds none."""
        cid = id_of(candidate)
        metrics = jsonable(dict(metrics))
        key = _key(idempotency_key) or content_key(
            "evaluation", cid, tier, None if point is None else jsonable(dict(point)), metrics, verdict,
            [str(r) for r in reasons], device, jsonable(dict(versions or {})), timing_method)
        with self._write("add_evaluation") as conn:
            rid = conn.execute(select(T_CANDIDATES.c.run_id)
                               .where(T_CANDIDATES.c.id == cid)).scalar_one_or_none()
            if rid is None:
                raise BoardError(f"add_evaluation: no candidate {cid}")
            values = dict(
                candidate_id=cid, run_id=rid, tier=tier,
                point=None if point is None else jsonable(dict(point)), metrics=metrics,
                speedup=_finite(metrics.get("speedup")), verdict=verdict,
                reasons=[str(r) for r in reasons], device=device,
                versions=jsonable(dict(versions or {})), timing_method=timing_method,
                created_at=db_now())
            return self._insert_once(conn, T_EVALUATIONS, values, key, Evaluation, "add_evaluation returned nothing")

    # -- accepted optimizations and drift ---------------------------------------------------------

    def add_optimization(self, run: Any, candidate: Any, name: str, targets: Sequence[str],
                         speedups: Mapping[str, float], per_point: Sequence[Mapping] = (),
                         plan_version: int = 1, status: str = "active",
                         idempotency_key: str | None = None) -> Optimization:
        """Record an accepted optimization: ``speedups`` as ``{"fast": x, "slow": y}``,
        ``per_point`` (list of dicts), the plan version it went into, status active|retired.
        Idempotent: one row per (run, candidate, name, plan version) unless another
        ``idempotency_key`` is given; a retry returns the first row."""
        if status not in OPTIMIZATION_STATUSES:
            raise BoardError(f"add_optimization: status must be active or retired, not {status!r}")
        rid, cid = id_of(run), id_of(candidate)
        targets = [str(x) for x in targets]
        key = _key(idempotency_key) or content_key("optimization", rid, cid, name, int(plan_version))
        with self._write("add_optimization") as conn:
            did = conn.execute(select(T_RUNS.c.deployment_id)
                               .where(T_RUNS.c.id == rid)).scalar_one_or_none()
            author = conn.execute(select(T_CANDIDATES.c.author)
                                  .where(T_CANDIDATES.c.id == cid)).scalar_one_or_none()
            if did is None or author is None:
                raise BoardError(f"add_optimization: no run {rid} or no candidate {cid}")
            values = dict(
                run_id=rid, deployment_id=did, candidate_id=cid, name=name, author=author,
                targets=targets, targets_key="," + ",".join(targets) + ",",
                speedups=jsonable(dict(speedups)), speedup_fast=_finite(speedups.get("fast")),
                speedup_slow=_finite(speedups.get("slow")), per_point=jsonable(list(per_point)),
                plan_version=int(plan_version), status=status, created_at=db_now(),
                updated_at=db_now())
            return self._insert_once(conn, T_OPTIMIZATIONS, values, key, Optimization,
                                     "add_optimization returned nothing")

    def set_optimization_status(self, optimization: Any, status: str) -> Optimization:
        """Retire (or re-activate) an accepted optimization."""
        if status not in OPTIMIZATION_STATUSES:
            raise BoardError(f"optimization status must be active or retired, not {status!r}")
        oid = id_of(optimization)
        with self._write("set_optimization_status") as conn:
            stmt = (update(T_OPTIMIZATIONS).where(T_OPTIMIZATIONS.c.id == oid)
                    .values(status=status, updated_at=db_now()).returning(*T_OPTIMIZATIONS.c))
            return self._one(conn, stmt, Optimization, f"no optimization {oid}")

    def add_drift_event(self, deployment: Any, drifted: bool, features: Sequence[Mapping] | Mapping,
                        run: Any = None, old_hash: str = "", new_hash: str = "") -> DriftEvent:
        """Record a drift check of a deployment's traffic: the verdict and the per-feature table
        (``traffic diff --json``'s ``features``: name, statistic, threshold, drifted)."""
        with self._write("add_drift_event") as conn:
            stmt = insert(T_DRIFT).values(
                deployment_id=id_of(deployment), run_id=None if run is None else id_of(run),
                drifted=bool(drifted), old_hash=old_hash, new_hash=new_hash,
                features=jsonable(features), created_at=db_now()).returning(*T_DRIFT.c)
            return self._one(conn, stmt, DriftEvent, "add_drift_event returned nothing")

    # -- memory across runs ----------------------------------------------------------------------

    def remember(self, run: Any, *, model: str, hw: str, shape_class: str, source: str, verdict: str,
                 speedup: float | None = None, kind: str = "source", target: str = "", title: str = "",
                 knobs: Mapping[str, Any] | None = None, metrics: Mapping[str, Any] | None = None) -> Tried:
        """Record that ``source`` was judged for (model, hw, shape_class) in ``run`` with ``verdict``
        ("accepted" | "correct" | "rejected"); a later judgement of the same source replaces it."""
        values = dict(model=model, hw=hw, shape_class=shape_class, source_hash=source_hash(source),
                      run_id=id_of(run), kind=kind, target=target or "", title=title or "",
                      knobs=jsonable(dict(knobs or {})), verdict=verdict,
                      speedup=_finite(speedup), metrics=jsonable(dict(metrics or {})), created_at=db_now())
        keep = ("model", "hw", "shape_class", "source_hash")
        with self._write("remember") as conn:
            stmt = (self._insert(T_TRIED).values(**values)
                    .on_conflict_do_update(index_elements=list(keep),
                                           set_={k: v for k, v in values.items() if k not in keep})
                    .returning(*T_TRIED.c))
            return self._one(conn, stmt, Tried, "remember returned nothing")

