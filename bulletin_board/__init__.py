"""bulletin_board: the shared SQL store of a tkcc run (see DESIGN.md "Board").

``BoardAPI`` (api.py) is the interface and its contract; ``Board`` implements it.
``Board(url)`` opens (creating or migrating) a board on SQLite (default, one machine) or PostgreSQL
(many machines): runs and deployments, ideas with atomic leased claims, posts, candidates,
evaluations, accepted optimizations and drift events; paginated read queries for the UI; export.
Imports only SQLAlchemy (and Alembic when a schema must be created or upgraded).
"""

from .api import BoardAPI
from .board import Board, jsonable
from .dashboard import DeploymentSummary, HistoryPoint, UIQueries
from .migrate import HEAD as SCHEMA_VERSION
from .records import (IDEA_STATUSES, OPTIMIZATION_STATUSES, RUN_STATUSES, BoardError, Candidate, Claim, Deployment, DriftEvent, Evaluation, Idea,
                      Optimization, Page, Post, Run, SchemaError, Tried, candidate_id,
                      source_hash)

__all__ = [
    "Board", "BoardAPI", "BoardError", "SchemaError", "SCHEMA_VERSION", "Page",
    "Run", "Deployment", "Idea", "Claim", "Post", "Candidate", "Evaluation", "Optimization",
    "DriftEvent", "Tried", "UIQueries", "DeploymentSummary", "HistoryPoint", "candidate_id", "source_hash", "jsonable",
    "IDEA_STATUSES", "OPTIMIZATION_STATUSES", "RUN_STATUSES",
]
