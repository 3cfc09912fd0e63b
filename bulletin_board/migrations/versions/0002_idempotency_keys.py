"""Idempotency keys: ``runs``, ``evaluations`` and ``optimizations`` get a nullable, unique
``idempotency_key``, so a writer that was killed after its commit but before it saw the
acknowledgement can retry the same write and get the first row back instead of a duplicate
(bulletin_board/board.py). Existing rows keep NULL (NULLs never collide).

Revision ID: 0002_idempotency_keys
Revises: 0001_initial
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = '0002_idempotency_keys'
down_revision = '0001_initial'
branch_labels = None
depends_on = None

TABLES = ("runs", "evaluations", "optimizations")


def upgrade() -> None:
    for table in TABLES:
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.add_column(sa.Column('idempotency_key', sa.String(length=64), nullable=True))
            batch_op.create_index(batch_op.f(f'ix_{table}_idempotency_key'), ['idempotency_key'], unique=True)


def downgrade() -> None:
    for table in TABLES:
        with op.batch_alter_table(table, schema=None) as batch_op:
            batch_op.drop_index(batch_op.f(f'ix_{table}_idempotency_key'))
            batch_op.drop_column('idempotency_key')
