"""Candidate lineage: the candidate a candidate modifies (``parent_id``) and what kind of author wrote
it (``author_kind``: "llm", "offline", "seed", "files", ... ; "" for candidates recorded before).

Revision ID: 0003_lineage
Revises: 0001_initial
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = '0003_lineage'
down_revision = '0002_idempotency_keys'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('candidates', schema=None) as batch_op:
        batch_op.add_column(sa.Column('parent_id', sa.String(length=64), nullable=True))
        batch_op.add_column(sa.Column('author_kind', sa.String(length=20), nullable=False,
                                      server_default=''))
        batch_op.create_index(batch_op.f('ix_candidates_parent_id'), ['parent_id'], unique=False)
        batch_op.create_foreign_key('fk_candidates_parent_id', 'candidates', ['parent_id'], ['id'])


def downgrade() -> None:
    with op.batch_alter_table('candidates', schema=None) as batch_op:
        batch_op.drop_constraint('fk_candidates_parent_id', type_='foreignkey')
        batch_op.drop_index(batch_op.f('ix_candidates_parent_id'))
        batch_op.drop_column('author_kind')
        batch_op.drop_column('parent_id')
