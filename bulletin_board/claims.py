"""Leased claims: the statements behind ``Board.claim_idea``, ``heartbeat``, ``finish_idea`` and
``release_idea``, built once per dialect (building a SQLAlchemy statement costs more than running
it on SQLite, and claims are the board's hot path).

The pool of a run: ideas that are ``open``, or ``claimed`` with ``lease_expires_at`` before the
database's clock (a lapsed lease). A claim is one conditional ``UPDATE ... RETURNING`` that picks
the pool's first idea (highest priority, then oldest) and takes it:

- SQLite: the write transaction starts with ``BEGIN IMMEDIATE`` (connect.py), so the pick and the
  update run under the database's single write lock: two claimers are serialised.
- PostgreSQL: the pick is ``SELECT ... FOR UPDATE SKIP LOCKED``: concurrent claimers lock
  different rows instead of waiting on each other; the outer ``UPDATE`` repeats the pool
  condition, so a row that left the pool meanwhile is not taken.

Then the idea's previous ``held`` claim row (if its lease lapsed) becomes ``lapsed`` and a new
``held`` claim row is inserted, in the same transaction. Cost: 3 statements, 1 transaction.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

from sqlalchemy import Float, and_, bindparam, func, insert, or_, select, update
from sqlalchemy.sql.dml import Insert, Update

from .schema import T_CLAIMS, T_IDEAS, db_now


@dataclass(frozen=True)
class ClaimStatements:
    claim: Update        # params p_run, p_agent, p_lease; RETURNING the idea
    lapse: Update        # params p_idea
    record: Insert       # params p_idea, p_run, p_agent
    heartbeat: Update    # params p_idea, p_agent, p_lease (None: keep the idea's lease_s)
    finish: Update       # params p_idea, p_agent, p_status (done | failed)
    release: Update      # params p_idea, p_agent
    close: Update        # params p_idea, p_agent, p_status (the claim row's final status)


@functools.lru_cache(maxsize=None)
def claim_statements(dialect: str, by_target: bool = False) -> ClaimStatements:
    """``by_target``: the claim takes only ideas whose target is ``p_target`` (a specialised agent)."""
    t, c, now = T_IDEAS, T_IDEAS.c, db_now()
    lease = bindparam("p_lease", type_=Float)
    in_pool = and_(c.run_id == bindparam("p_run"),
                   or_(c.status == "open", and_(c.status == "claimed", c.lease_expires_at < now)))
    if by_target:
        in_pool = and_(in_pool, c.target == bindparam("p_target"))
    pick = select(c.id).where(in_pool).order_by(c.priority.desc(), c.id).limit(1)
    if dialect == "postgresql":
        pick = pick.with_for_update(skip_locked=True)
    claim = (update(t).where(c.id == pick.scalar_subquery(), in_pool)
             .values(status="claimed", claimed_by=bindparam("p_agent"), lease_s=lease,
                     lease_expires_at=now + lease, heartbeat_at=now, claims=c.claims + 1,
                     updated_at=now)
             .returning(*t.c))
    held = and_(c.id == bindparam("p_idea"), c.claimed_by == bindparam("p_agent"),
                c.status == "claimed")
    new_lease = func.coalesce(lease, c.lease_s)
    cl = T_CLAIMS.c
    return ClaimStatements(
        claim=claim,
        lapse=(update(T_CLAIMS).where(cl.idea_id == bindparam("p_idea"), cl.status == "held")
               .values(status="lapsed", finished_at=now)),
        record=insert(T_CLAIMS).values(idea_id=bindparam("p_idea"), run_id=bindparam("p_run"),
                                       agent=bindparam("p_agent"), status="held", claimed_at=now),
        heartbeat=(update(t).where(held)
                   .values(lease_s=new_lease, lease_expires_at=now + new_lease, heartbeat_at=now)),
        finish=(update(t).where(held)
                .values(status=bindparam("p_status"), lease_expires_at=None, updated_at=now,
                        finished_at=now)),
        release=(update(t).where(held)
                 .values(status="open", claimed_by=None, lease_expires_at=None, updated_at=now)),
        close=(update(T_CLAIMS).where(cl.idea_id == bindparam("p_idea"),
                                      cl.agent == bindparam("p_agent"), cl.status == "held")
               .values(status=bindparam("p_status"), finished_at=now)),
    )
