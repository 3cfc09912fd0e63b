"""Schema versions: check a board's schema when it opens; create or upgrade it under a lock.

The schema's version is the Alembic revision stored in ``alembic_version``. The migrations ship in
the package (``bulletin_board/migrations``), so an installed tkcc can upgrade a board by itself.

- no tables yet: create them (run every migration), unless read-only;
- at :data:`HEAD`: nothing to do (one ``SELECT``, no Alembic import: opening a board stays cheap);
- an older revision this code knows: upgrade it (read-write) or say it is too old (read-only);
- a revision this code does not know: the database was written by a newer tkcc; refuse.

Concurrent openers are serialised: SQLite by ``BEGIN IMMEDIATE`` (connect.py), PostgreSQL by a
transaction-level advisory lock; migrations run inside that transaction (both have transactional
DDL), so a process killed during a migration leaves the old schema.
"""

from __future__ import annotations

import os

from sqlalchemy import Connection, inspect, text

from .connect import Engines, write_transaction
from .records import SchemaError

HEAD = "0004_tried"              # the newest revision in migrations/versions (a test checks it)
_PG_LOCK_KEY = 0x7ECC_B0A2D        # pg_advisory_xact_lock key of board migrations
MIGRATIONS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "migrations")


def alembic_config(connection: Connection | None = None):
    """An Alembic ``Config`` of the packaged migrations (optionally bound to a connection)."""
    from alembic.config import Config

    cfg = Config()
    cfg.set_main_option("script_location", MIGRATIONS_DIR)
    if connection is not None:
        cfg.attributes["connection"] = connection
    return cfg


def known_revisions() -> list[str]:
    """Every revision this code ships, oldest first."""
    from alembic.script import ScriptDirectory

    scripts = ScriptDirectory.from_config(alembic_config())
    return [s.revision for s in reversed(list(scripts.walk_revisions()))]


def current_revision(conn: Connection) -> str | None:
    """The schema revision stored in the database; None when it has no board tables at all.
    Raises :class:`SchemaError` for a database that holds other tables but no board."""
    names = set(inspect(conn).get_table_names())
    if "alembic_version" not in names:
        if "ideas" in names or "runs" in names:
            raise SchemaError("the database has board tables but no schema version; it was not "
                              "created by tkcc")
        return None
    rows = conn.execute(text("SELECT version_num FROM alembic_version")).scalars().all()
    if len(rows) != 1:
        raise SchemaError(f"the board's schema version table holds {len(rows)} rows, expected 1")
    return rows[0]


def _too_new(found: str, url: str) -> SchemaError:
    return SchemaError(f"the board at {url} has schema version {found}, newer than this tkcc "
                       f"(which knows up to {HEAD}): upgrade tkcc to use it")


def check_schema(engines: Engines) -> str:
    """Read-only check: the schema must be exactly :data:`HEAD`. Returns it."""
    with engines.read.connect() as conn:
        found = current_revision(conn)
    if found == HEAD:
        return found
    if found is None:
        raise SchemaError(f"the board at {engines.url} has no tables yet: open it read-write once "
                          "to create them")
    if found in known_revisions():
        raise SchemaError(f"the board at {engines.url} has schema version {found}, older than this "
                          f"tkcc ({HEAD}): open it read-write (with migrations on) once to "
                          "upgrade it")
    raise _too_new(found, engines.url)


def ensure_schema(engines: Engines, *, migrate: bool = True) -> str:
    """Create or upgrade the schema to :data:`HEAD` (under the migration lock). With
    ``migrate=False`` an older schema is an error instead. Returns the revision."""
    if engines.write is None:
        return check_schema(engines)
    with engines.read.connect() as conn:                 # fast path: already at head
        found = current_revision(conn)
    if found == HEAD:
        return found
    if found is not None and not migrate:
        return check_schema(engines)
    from alembic import command

    with write_transaction(engines) as conn:             # BEGIN IMMEDIATE on SQLite
        if engines.dialect == "postgresql":
            conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _PG_LOCK_KEY})
        found = current_revision(conn)                   # again, under the lock
        if found == HEAD:
            return found
        if found is not None and found not in known_revisions():
            raise _too_new(found, engines.url)
        command.upgrade(alembic_config(conn), HEAD)
    return HEAD
