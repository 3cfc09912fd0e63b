"""Alembic environment of the board. Run only through ``bulletin_board.migrate`` (which passes an
open connection, already inside the transaction that holds the migration lock) or through the
``alembic`` command with ``-x url=...`` for writing a new revision."""

from __future__ import annotations

from alembic import context
from sqlalchemy import create_engine

from bulletin_board.schema import Base

config = context.config
connection = config.attributes.get("connection")

if connection is None:      # the alembic command line: alembic ... -x url=sqlite:///x.db revision
    url = context.get_x_argument(as_dictionary=True).get("url", "sqlite://")
    with create_engine(url).begin() as connection:
        context.configure(connection=connection, target_metadata=Base.metadata,
                          render_as_batch=True)
        with context.begin_transaction():
            context.run_migrations()
else:
    context.configure(connection=connection, target_metadata=Base.metadata, render_as_batch=True,
                      transactional_ddl=True)
    with context.begin_transaction():
        context.run_migrations()
