"""Candidate lineage: the candidate a candidate modifies (``parent_id``) and what kind of author wrote
it (``author_kind``: "llm", "offline", "seed", "files", ... ; "" for candidates recorded before).

Revision ID: 0003_lineage
Revises: 0002_idempotency_keys
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = '0003_lineage'
down_revision = '0002_idempotency_keys'
branch_labels = None
depends_on = None


def upgrade() -> None:
    # plain ADD COLUMNs, no table rebuild: SQLite cannot rebuild ``candidates`` under PRAGMA foreign_keys
    # while evaluations reference its rows, so there the REFERENCES clause rides on the ADD COLUMN
    if op.get_bind().dialect.name == "sqlite":
        op.execute("ALTER TABLE candidates ADD COLUMN parent_id VARCHAR(64) REFERENCES candidates (id)")
    else:
        op.add_column('candidates', sa.Column('parent_id', sa.String(length=64), nullable=True))
        op.create_foreign_key('fk_candidates_parent_id', 'candidates', 'candidates', ['parent_id'], ['id'])
    op.add_column('candidates', sa.Column('author_kind', sa.String(length=20), nullable=False,
                                          server_default=''))
    op.create_index(op.f('ix_candidates_parent_id'), 'candidates', ['parent_id'], unique=False)


def downgrade() -> None:
    with op.batch_alter_table('candidates', schema=None) as batch_op:
        if op.get_bind().dialect.name != "sqlite":     # SQLite's rebuild drops the unnamed REFERENCES
            batch_op.drop_constraint('fk_candidates_parent_id', type_='foreignkey')
        batch_op.drop_index(batch_op.f('ix_candidates_parent_id'))
        batch_op.drop_column('author_kind')
        batch_op.drop_column('parent_id')
