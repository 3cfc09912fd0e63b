"""Memory across runs: the ``tried`` table (a candidate judged for model, hw and shape class, with its
verdict), so that a recompile or a continued run does not judge it again.

Revision ID: 0004_tried
Revises: 0003_lineage
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = '0004_tried'
down_revision = '0003_lineage'
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_table(
        'tried',
        sa.Column('id', sa.Integer(), nullable=False),
        sa.Column('model', sa.String(length=200), nullable=False),
        sa.Column('hw', sa.String(length=100), nullable=False),
        sa.Column('shape_class', sa.String(length=64), nullable=False),
        sa.Column('source_hash', sa.String(length=64), nullable=False),
        sa.Column('run_id', sa.Integer(), nullable=False),
        sa.Column('kind', sa.String(length=20), nullable=False),
        sa.Column('target', sa.String(length=200), nullable=False),
        sa.Column('title', sa.Text(), nullable=False),
        sa.Column('knobs', sa.JSON(), nullable=False),
        sa.Column('verdict', sa.String(length=40), nullable=False),
        sa.Column('speedup', sa.Float(), nullable=True),
        sa.Column('metrics', sa.JSON(), nullable=False),
        sa.Column('created_at', sa.Float(), nullable=False),
        sa.ForeignKeyConstraint(['run_id'], ['runs.id'], ),
        sa.PrimaryKeyConstraint('id'),
        sa.UniqueConstraint('model', 'hw', 'shape_class', 'source_hash', name='uq_tried_key'),
    )
    op.create_index(op.f('ix_tried_shape_class'), 'tried', ['shape_class'], unique=False)
    op.create_index(op.f('ix_tried_run_id'), 'tried', ['run_id'], unique=False)


def downgrade() -> None:
    op.drop_index(op.f('ix_tried_run_id'), table_name='tried')
    op.drop_index(op.f('ix_tried_shape_class'), table_name='tried')
    op.drop_table('tried')
