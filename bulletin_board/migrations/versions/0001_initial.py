"""Initial schema: deployments, runs, ideas, claims, posts, candidates, evaluations, optimizations,
drift events (see bulletin_board/schema.py for what each column means).

Revision ID: 0001_initial
Revises: 
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op


revision = '0001_initial'
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    _deployments()
    _ideas()
    _discussion()
    _results()


def _deployments() -> None:
    """Deployments, their runs and drift events."""
    op.create_table('deployments',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('model', sa.String(length=200), nullable=False),
    sa.Column('hw', sa.String(length=100), nullable=False),
    sa.Column('traffic_hash', sa.String(length=128), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('created_at', sa.Float(), nullable=False),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('model', 'hw', 'traffic_hash', name='uq_deployments_key')
    )
    op.create_table('runs',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('deployment_id', sa.Integer(), nullable=False),
    sa.Column('model', sa.String(length=200), nullable=False),
    sa.Column('hw', sa.String(length=100), nullable=False),
    sa.Column('traffic_hash', sa.String(length=128), nullable=False),
    sa.Column('status', sa.String(length=20), nullable=False),
    sa.Column('message', sa.Text(), nullable=False),
    sa.Column('config', sa.JSON(), nullable=False),
    sa.Column('baseline', sa.JSON(), nullable=True),
    sa.Column('candidates_tried', sa.Integer(), nullable=False),
    sa.Column('candidates_accepted', sa.Integer(), nullable=False),
    sa.Column('best_speedup', sa.Float(), nullable=True),
    sa.Column('engine_restarts', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.Float(), nullable=False),
    sa.Column('updated_at', sa.Float(), nullable=False),
    sa.Column('finished_at', sa.Float(), nullable=True),
    sa.ForeignKeyConstraint(['deployment_id'], ['deployments.id'], ),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('runs', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_runs_deployment_id'), ['deployment_id'], unique=False)

    op.create_table('drift_events',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('deployment_id', sa.Integer(), nullable=False),
    sa.Column('run_id', sa.Integer(), nullable=True),
    sa.Column('drifted', sa.Boolean(), nullable=False),
    sa.Column('old_hash', sa.String(length=128), nullable=False),
    sa.Column('new_hash', sa.String(length=128), nullable=False),
    sa.Column('features', sa.JSON(), nullable=False),
    sa.Column('created_at', sa.Float(), nullable=False),
    sa.ForeignKeyConstraint(['deployment_id'], ['deployments.id'], ),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], ),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('drift_events', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_drift_events_deployment_id'), ['deployment_id'], unique=False)


def _ideas() -> None:
    """Ideas and the candidates written for them."""
    op.create_table('ideas',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('run_id', sa.Integer(), nullable=False),
    sa.Column('parent_id', sa.Integer(), nullable=True),
    sa.Column('author', sa.String(length=200), nullable=False),
    sa.Column('title', sa.Text(), nullable=False),
    sa.Column('title_key', sa.String(length=64), nullable=False),
    sa.Column('body', sa.Text(), nullable=False),
    sa.Column('target', sa.String(length=200), nullable=True),
    sa.Column('tags', sa.JSON(), nullable=False),
    sa.Column('priority', sa.Float(), nullable=False),
    sa.Column('status', sa.String(length=20), nullable=False),
    sa.Column('claimed_by', sa.String(length=200), nullable=True),
    sa.Column('lease_s', sa.Float(), nullable=True),
    sa.Column('lease_expires_at', sa.Float(), nullable=True),
    sa.Column('heartbeat_at', sa.Float(), nullable=True),
    sa.Column('claims', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.Float(), nullable=False),
    sa.Column('updated_at', sa.Float(), nullable=False),
    sa.Column('finished_at', sa.Float(), nullable=True),
    sa.ForeignKeyConstraint(['parent_id'], ['ideas.id'], ),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], ),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('run_id', 'title_key', name='uq_ideas_title')
    )
    with op.batch_alter_table('ideas', schema=None) as batch_op:
        batch_op.create_index('ix_ideas_pool', ['run_id', 'status', 'priority', 'id'], unique=False)
        batch_op.create_index(batch_op.f('ix_ideas_target'), ['target'], unique=False)

    op.create_table('candidates',
    sa.Column('id', sa.String(length=64), nullable=False),
    sa.Column('run_id', sa.Integer(), nullable=False),
    sa.Column('idea_id', sa.Integer(), nullable=True),
    sa.Column('author', sa.String(length=200), nullable=False),
    sa.Column('source', sa.Text(), nullable=False),
    sa.Column('source_hash', sa.String(length=64), nullable=False),
    sa.Column('created_at', sa.Float(), nullable=False),
    sa.ForeignKeyConstraint(['idea_id'], ['ideas.id'], ),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], ),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('candidates', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_candidates_idea_id'), ['idea_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_candidates_run_id'), ['run_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_candidates_source_hash'), ['source_hash'], unique=False)


def _discussion() -> None:
    """Claims on ideas and the posts of their threads."""
    op.create_table('claims',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('idea_id', sa.Integer(), nullable=False),
    sa.Column('run_id', sa.Integer(), nullable=False),
    sa.Column('agent', sa.String(length=200), nullable=False),
    sa.Column('status', sa.String(length=20), nullable=False),
    sa.Column('claimed_at', sa.Float(), nullable=False),
    sa.Column('finished_at', sa.Float(), nullable=True),
    sa.ForeignKeyConstraint(['idea_id'], ['ideas.id'], ),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], ),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('claims', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_claims_idea_id'), ['idea_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_claims_run_id'), ['run_id'], unique=False)

    op.create_table('posts',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('run_id', sa.Integer(), nullable=False),
    sa.Column('idea_id', sa.Integer(), nullable=True),
    sa.Column('author', sa.String(length=200), nullable=False),
    sa.Column('kind', sa.String(length=40), nullable=False),
    sa.Column('body', sa.Text(), nullable=False),
    sa.Column('created_at', sa.Float(), nullable=False),
    sa.ForeignKeyConstraint(['idea_id'], ['ideas.id'], ),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], ),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('posts', schema=None) as batch_op:
        batch_op.create_index('ix_posts_thread', ['run_id', 'idea_id', 'id'], unique=False)


def _results() -> None:
    """Evaluations of candidates and the optimizations a run keeps."""
    op.create_table('evaluations',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('candidate_id', sa.String(length=64), nullable=False),
    sa.Column('run_id', sa.Integer(), nullable=False),
    sa.Column('tier', sa.String(length=20), nullable=False),
    sa.Column('point', sa.JSON(), nullable=True),
    sa.Column('metrics', sa.JSON(), nullable=False),
    sa.Column('speedup', sa.Float(), nullable=True),
    sa.Column('verdict', sa.String(length=40), nullable=False),
    sa.Column('reasons', sa.JSON(), nullable=False),
    sa.Column('device', sa.String(length=200), nullable=False),
    sa.Column('versions', sa.JSON(), nullable=False),
    sa.Column('timing_method', sa.String(length=200), nullable=False),
    sa.Column('created_at', sa.Float(), nullable=False),
    sa.ForeignKeyConstraint(['candidate_id'], ['candidates.id'], ),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], ),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('evaluations', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_evaluations_candidate_id'), ['candidate_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_evaluations_run_id'), ['run_id'], unique=False)

    op.create_table('optimizations',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('run_id', sa.Integer(), nullable=False),
    sa.Column('deployment_id', sa.Integer(), nullable=False),
    sa.Column('candidate_id', sa.String(length=64), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('author', sa.String(length=200), nullable=False),
    sa.Column('targets', sa.JSON(), nullable=False),
    sa.Column('targets_key', sa.Text(), nullable=False),
    sa.Column('speedups', sa.JSON(), nullable=False),
    sa.Column('speedup_fast', sa.Float(), nullable=True),
    sa.Column('speedup_slow', sa.Float(), nullable=True),
    sa.Column('per_point', sa.JSON(), nullable=False),
    sa.Column('plan_version', sa.Integer(), nullable=False),
    sa.Column('status', sa.String(length=20), nullable=False),
    sa.Column('created_at', sa.Float(), nullable=False),
    sa.Column('updated_at', sa.Float(), nullable=False),
    sa.ForeignKeyConstraint(['candidate_id'], ['candidates.id'], ),
    sa.ForeignKeyConstraint(['deployment_id'], ['deployments.id'], ),
    sa.ForeignKeyConstraint(['run_id'], ['runs.id'], ),
    sa.PrimaryKeyConstraint('id')
    )
    with op.batch_alter_table('optimizations', schema=None) as batch_op:
        batch_op.create_index(batch_op.f('ix_optimizations_deployment_id'), ['deployment_id'], unique=False)
        batch_op.create_index(batch_op.f('ix_optimizations_run_id'), ['run_id'], unique=False)


def downgrade() -> None:
    for table in ("optimizations", "evaluations", "posts", "claims", "candidates", "ideas",
                  "drift_events", "runs", "deployments"):
        op.drop_table(table)
