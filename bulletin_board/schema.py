"""The board's tables as SQLAlchemy 2 declarative models, and the database clock.

The tables are created and changed only by the Alembic migrations in ``bulletin_board/migrations``
(``tests/bulletin_board`` checks that the migrations produce exactly these models). The Board API
queries them through SQLAlchemy Core (``Model.__table__``) and hands out the frozen dataclasses of
``records.py``, never ORM objects.

Conventions:
- every timestamp is a float: seconds since the Unix epoch (UTC) read from the *database's* clock
  (:func:`db_now`), so that leases mean the same on every machine that shares a board;
- JSON columns stay JSON (``sqlalchemy.JSON``: ``json`` on PostgreSQL, text on SQLite);
- the columns the UI sorts or filters on are plain columns (``speedup_fast``, ``targets_key``, ...)
  next to the JSON they are derived from.
"""

from __future__ import annotations

from sqlalchemy import (JSON, Boolean, Float, ForeignKey, Index, Integer, String, Text,
                        UniqueConstraint)
from sqlalchemy.ext.compiler import compiles
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column
from sqlalchemy.sql.expression import FunctionElement


class db_now(FunctionElement):  # noqa: N801 - reads like the SQL function it compiles to
    """The database server's clock as float epoch seconds (microsecond resolution on PostgreSQL,
    millisecond on SQLite). Used for every timestamp and every lease."""

    type = Float()
    inherit_cache = True


@compiles(db_now)
def _db_now_default(element, compiler, **kw):  # noqa: ARG001
    return "CAST(EXTRACT(EPOCH FROM CURRENT_TIMESTAMP) AS DOUBLE PRECISION)"


@compiles(db_now, "postgresql")
def _db_now_pg(element, compiler, **kw):  # noqa: ARG001
    return "CAST(EXTRACT(EPOCH FROM clock_timestamp()) AS DOUBLE PRECISION)"


@compiles(db_now, "sqlite")
def _db_now_sqlite(element, compiler, **kw):  # noqa: ARG001
    return "((julianday('now') - 2440587.5) * 86400.0)"


class Base(DeclarativeBase):
    pass


class DeploymentRow(Base):
    """What is being served: a model on a hardware target under one traffic profile."""

    __tablename__ = "deployments"
    __table_args__ = (UniqueConstraint("model", "hw", "traffic_hash", name="uq_deployments_key"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    model: Mapped[str] = mapped_column(String(200))
    hw: Mapped[str] = mapped_column(String(100))
    traffic_hash: Mapped[str] = mapped_column(String(128))
    name: Mapped[str] = mapped_column(String(200), default="")
    created_at: Mapped[float] = mapped_column(Float)


class RunRow(Base):
    """One compile of a deployment, with its progress counters and baseline profile."""

    __tablename__ = "runs"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    deployment_id: Mapped[int] = mapped_column(ForeignKey("deployments.id"), index=True)
    model: Mapped[str] = mapped_column(String(200))
    hw: Mapped[str] = mapped_column(String(100))
    traffic_hash: Mapped[str] = mapped_column(String(128))
    status: Mapped[str] = mapped_column(String(20), default="running")
    message: Mapped[str] = mapped_column(Text, default="")
    config: Mapped[dict] = mapped_column(JSON)
    baseline: Mapped[dict | None] = mapped_column(JSON, nullable=True)
    candidates_tried: Mapped[int] = mapped_column(Integer, default=0)
    candidates_accepted: Mapped[int] = mapped_column(Integer, default=0)
    best_speedup: Mapped[float | None] = mapped_column(Float, nullable=True)
    engine_restarts: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[float] = mapped_column(Float)
    idempotency_key: Mapped[str | None] = mapped_column(String(64), nullable=True, unique=True, index=True)
    updated_at: Mapped[float] = mapped_column(Float)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class IdeaRow(Base):
    """An idea and its current claim. ``status``: open | claimed | done | failed. A claimed idea
    whose ``lease_expires_at`` is in the past is back in the pool (see ``Board.claim_idea``)."""

    __tablename__ = "ideas"
    __table_args__ = (
        UniqueConstraint("run_id", "title_key", name="uq_ideas_title"),
        Index("ix_ideas_pool", "run_id", "status", "priority", "id"),
    )

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"))
    parent_id: Mapped[int | None] = mapped_column(ForeignKey("ideas.id"), nullable=True)
    author: Mapped[str] = mapped_column(String(200))
    title: Mapped[str] = mapped_column(Text)
    title_key: Mapped[str] = mapped_column(String(64))     # sha1 of target + normalised title
    body: Mapped[str] = mapped_column(Text, default="")
    target: Mapped[str | None] = mapped_column(String(200), nullable=True, index=True)
    tags: Mapped[list] = mapped_column(JSON)
    priority: Mapped[float] = mapped_column(Float, default=0.0)
    status: Mapped[str] = mapped_column(String(20), default="open")
    claimed_by: Mapped[str | None] = mapped_column(String(200), nullable=True)
    lease_s: Mapped[float | None] = mapped_column(Float, nullable=True)
    lease_expires_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    heartbeat_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    claims: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[float] = mapped_column(Float)
    updated_at: Mapped[float] = mapped_column(Float)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class ClaimRow(Base):
    """The history of claims. ``status``: held | done | failed | lapsed (re-claimed by another
    after the lease ran out)."""

    __tablename__ = "claims"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    idea_id: Mapped[int] = mapped_column(ForeignKey("ideas.id"), index=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"), index=True)
    agent: Mapped[str] = mapped_column(String(200))
    status: Mapped[str] = mapped_column(String(20), default="held")
    claimed_at: Mapped[float] = mapped_column(Float)
    finished_at: Mapped[float | None] = mapped_column(Float, nullable=True)


class PostRow(Base):
    """A message: on an idea's thread (``idea_id``) or free on the run."""

    __tablename__ = "posts"
    __table_args__ = (Index("ix_posts_thread", "run_id", "idea_id", "id"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"))
    idea_id: Mapped[int | None] = mapped_column(ForeignKey("ideas.id"), nullable=True)
    author: Mapped[str] = mapped_column(String(200))
    kind: Mapped[str] = mapped_column(String(40), default="note")
    body: Mapped[str] = mapped_column(Text)
    created_at: Mapped[float] = mapped_column(Float)


class CandidateRow(Base):
    """A candidate source file. ``id`` is content-addressed (see ``records.candidate_id``).
    ``parent_id`` is the candidate it modifies (lineage; None for a fresh one) and ``author_kind``
    what wrote it ("llm", "offline", "seed", "files"; a sandbox policy may treat "llm" apart)."""

    __tablename__ = "candidates"

    id: Mapped[str] = mapped_column(String(64), primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"), index=True)
    idea_id: Mapped[int | None] = mapped_column(ForeignKey("ideas.id"), nullable=True, index=True)
    author: Mapped[str] = mapped_column(String(200))
    source: Mapped[str] = mapped_column(Text)
    source_hash: Mapped[str] = mapped_column(String(64), index=True)   # sha256 of the source
    created_at: Mapped[float] = mapped_column(Float)
    parent_id: Mapped[str | None] = mapped_column(ForeignKey("candidates.id", name="fk_candidates_parent_id"),
                                                  nullable=True, index=True)
    author_kind: Mapped[str] = mapped_column(String(20), default="", server_default="")


class EvaluationRow(Base):
    """One measurement of a candidate on one tier (and workload point, or all points)."""

    __tablename__ = "evaluations"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    candidate_id: Mapped[str] = mapped_column(ForeignKey("candidates.id"), index=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"), index=True)
    tier: Mapped[str] = mapped_column(String(20))
    point: Mapped[dict | None] = mapped_column(JSON, nullable=True)
    metrics: Mapped[dict] = mapped_column(JSON)
    speedup: Mapped[float | None] = mapped_column(Float, nullable=True)   # metrics["speedup"]
    verdict: Mapped[str] = mapped_column(String(40))
    reasons: Mapped[list] = mapped_column(JSON)
    device: Mapped[str] = mapped_column(String(200), default="")
    versions: Mapped[dict] = mapped_column(JSON)
    timing_method: Mapped[str] = mapped_column(String(200), default="")
    created_at: Mapped[float] = mapped_column(Float)
    idempotency_key: Mapped[str | None] = mapped_column(String(64), nullable=True, unique=True, index=True)


class OptimizationRow(Base):
    """An accepted optimization. ``status``: active | retired."""

    __tablename__ = "optimizations"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"), index=True)
    deployment_id: Mapped[int] = mapped_column(ForeignKey("deployments.id"), index=True)
    candidate_id: Mapped[str] = mapped_column(ForeignKey("candidates.id"))
    name: Mapped[str] = mapped_column(String(200))
    author: Mapped[str] = mapped_column(String(200))          # the candidate's author
    targets: Mapped[list] = mapped_column(JSON)
    targets_key: Mapped[str] = mapped_column(Text)             # ",op1,op2," for filtering by op
    speedups: Mapped[dict] = mapped_column(JSON)
    speedup_fast: Mapped[float | None] = mapped_column(Float, nullable=True)
    speedup_slow: Mapped[float | None] = mapped_column(Float, nullable=True)
    per_point: Mapped[list] = mapped_column(JSON)
    plan_version: Mapped[int] = mapped_column(Integer, default=1)
    status: Mapped[str] = mapped_column(String(20), default="active")
    created_at: Mapped[float] = mapped_column(Float)
    idempotency_key: Mapped[str | None] = mapped_column(String(64), nullable=True, unique=True, index=True)
    updated_at: Mapped[float] = mapped_column(Float)


class DriftEventRow(Base):
    """A drift check of a deployment's traffic: verdict and the per-feature table."""

    __tablename__ = "drift_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    deployment_id: Mapped[int] = mapped_column(ForeignKey("deployments.id"), index=True)
    run_id: Mapped[int | None] = mapped_column(ForeignKey("runs.id"), nullable=True)
    drifted: Mapped[bool] = mapped_column(Boolean)
    old_hash: Mapped[str] = mapped_column(String(128), default="")
    new_hash: Mapped[str] = mapped_column(String(128), default="")
    features: Mapped[list] = mapped_column(JSON)
    created_at: Mapped[float] = mapped_column(Float)


class TriedRow(Base):
    """The memory across runs: one candidate judged for a deployment (model, hw) under a shape class
    (the workload points and tiers it was judged on, bucketed: ``compiler.search.memory.shape_class``), with
    what it was (``kind`` "template" | "config" | "source", ``target`` op, ``title``, ``knobs`` of the
    idea body) and its verdict. One row per (model, hw, shape_class, source_hash): the latest judgement."""

    __tablename__ = "tried"
    __table_args__ = (UniqueConstraint("model", "hw", "shape_class", "source_hash", name="uq_tried_key"),)

    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    model: Mapped[str] = mapped_column(String(200))
    hw: Mapped[str] = mapped_column(String(100))
    shape_class: Mapped[str] = mapped_column(String(64), index=True)
    source_hash: Mapped[str] = mapped_column(String(64))
    run_id: Mapped[int] = mapped_column(ForeignKey("runs.id"), index=True)
    kind: Mapped[str] = mapped_column(String(20), default="source")
    target: Mapped[str] = mapped_column(String(200), default="")
    title: Mapped[str] = mapped_column(Text, default="")
    knobs: Mapped[dict] = mapped_column(JSON)
    verdict: Mapped[str] = mapped_column(String(40))          # "accepted" | "correct" | "rejected"
    speedup: Mapped[float | None] = mapped_column(Float, nullable=True)
    metrics: Mapped[dict] = mapped_column(JSON)               # what a later run needs to reuse the verdict
    created_at: Mapped[float] = mapped_column(Float)


T_DEPLOYMENTS = DeploymentRow.__table__
T_RUNS = RunRow.__table__
T_IDEAS = IdeaRow.__table__
T_CLAIMS = ClaimRow.__table__
T_POSTS = PostRow.__table__
T_CANDIDATES = CandidateRow.__table__
T_EVALUATIONS = EvaluationRow.__table__
T_OPTIMIZATIONS = OptimizationRow.__table__
T_DRIFT = DriftEventRow.__table__
T_TRIED = TriedRow.__table__
