"""What the Board hands out: frozen, typed, JSON-able records (one per table) and a ``Page``.

Every record has an ``id``; every Board method that takes a run, idea, candidate, deployment or
optimization accepts either the record or its bare id. ``to_dict()`` gives plain JSON types.
Timestamps are float epoch seconds from the database's clock.
"""

from __future__ import annotations

import dataclasses
import hashlib
from dataclasses import dataclass
from typing import Any, Generic, Mapping, TypeVar

IDEA_STATUSES = ("open", "claimed", "done", "failed")
FINISH_STATUSES = ("done", "failed")
RUN_STATUSES = ("running", "done", "failed", "interrupted")
OPTIMIZATION_STATUSES = ("active", "retired")


class BoardError(ValueError):
    """A request the board cannot serve (unknown id, bad status, bad sort key). One line, exit 2."""

    user_error = True


class SchemaError(BoardError):
    """The database's schema is newer or older than this code, or the database cannot be opened."""


def candidate_id(run_id: int, source: str) -> str:
    """The content-addressed id of a candidate: sha256 of the run id and the source, 32 hex digits.
    The same source added twice to one run is one candidate; in another run it is another."""
    return hashlib.sha256(f"{int(run_id)}\0{source}".encode()).hexdigest()[:32]


def source_hash(source: str) -> str:
    """sha256 of a candidate's source, hex (stored next to the candidate)."""
    return hashlib.sha256(source.encode()).hexdigest()


def id_of(obj: Any) -> Any:
    """A record's id, or the object itself when it already is an id."""
    return getattr(obj, "id", obj)


R = TypeVar("R", bound="Record")


@dataclass(frozen=True)
class Record:
    id: Any

    @classmethod
    def from_row(cls: type[R], row: Mapping[str, Any]) -> R:
        names = [f.name for f in dataclasses.fields(cls)]
        return cls(**{n: row[n] for n in names})

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class Deployment(Record):
    id: int
    model: str
    hw: str
    traffic_hash: str
    name: str
    created_at: float


@dataclass(frozen=True)
class Run(Record):
    id: int
    deployment_id: int
    model: str
    hw: str
    traffic_hash: str
    status: str
    message: str
    config: dict
    candidates_tried: int
    candidates_accepted: int
    best_speedup: float | None
    engine_restarts: int
    created_at: float
    updated_at: float
    finished_at: float | None


@dataclass(frozen=True)
class Idea(Record):
    id: int
    run_id: int
    parent_id: int | None
    author: str
    title: str
    body: str
    target: str | None
    tags: list
    priority: float
    status: str
    claimed_by: str | None
    lease_s: float | None
    lease_expires_at: float | None
    heartbeat_at: float | None
    claims: int
    created_at: float
    updated_at: float
    finished_at: float | None


@dataclass(frozen=True)
class Claim(Record):
    id: int
    idea_id: int
    run_id: int
    agent: str
    status: str
    claimed_at: float
    finished_at: float | None


@dataclass(frozen=True)
class Post(Record):
    id: int
    run_id: int
    idea_id: int | None
    author: str
    kind: str
    body: str
    created_at: float


@dataclass(frozen=True)
class Candidate(Record):
    id: str
    run_id: int
    idea_id: int | None
    author: str
    source: str
    source_hash: str
    created_at: float
    parent_id: str | None = None
    author_kind: str = ""


@dataclass(frozen=True)
class Evaluation(Record):
    id: int
    candidate_id: str
    run_id: int
    tier: str
    point: dict | None
    metrics: dict
    speedup: float | None
    verdict: str
    reasons: list
    device: str
    versions: dict
    timing_method: str
    created_at: float


@dataclass(frozen=True)
class Optimization(Record):
    id: int
    run_id: int
    deployment_id: int
    candidate_id: str
    name: str
    author: str
    targets: list
    speedups: dict
    speedup_fast: float | None
    speedup_slow: float | None
    per_point: list
    plan_version: int
    status: str
    created_at: float
    updated_at: float


@dataclass(frozen=True)
class Tried(Record):
    """A candidate judged before for (model, hw, shape_class): see ``schema.TriedRow``."""

    id: int
    model: str
    hw: str
    shape_class: str
    source_hash: str
    run_id: int
    kind: str
    target: str
    title: str
    knobs: dict
    verdict: str
    speedup: float | None
    metrics: dict
    created_at: float


@dataclass(frozen=True)
class DriftEvent(Record):
    id: int
    deployment_id: int
    run_id: int | None
    drifted: bool
    old_hash: str
    new_hash: str
    features: list
    created_at: float


T = TypeVar("T")


@dataclass(frozen=True)
class Page(Generic[T]):
    """One page of a read query: ``items`` and ``total`` (rows matching the filters, all pages)."""

    items: tuple[T, ...]
    total: int
    limit: int
    offset: int

    @property
    def has_next(self) -> bool:
        return self.offset + len(self.items) < self.total

    def to_dict(self) -> dict:
        return {"items": [i.to_dict() for i in self.items], "total": self.total,
                "limit": self.limit, "offset": self.offset}
