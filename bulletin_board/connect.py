"""Opening a board's database: SQLite (default) or PostgreSQL, read-write or read-only.

SQLite, read-write: WAL journal (readers never block the writer), ``synchronous=NORMAL`` (a commit
is durable against a process crash, not against a power cut), a 30 s busy timeout, foreign keys on,
and every transaction started with ``BEGIN IMMEDIATE``: a transaction takes the write lock up front,
so a read-then-write (a claim, a migration) is atomic and never fails half-way with SQLITE_BUSY.
Reads in a read-write Board go through a second engine with plain deferred transactions, so they
do not take the write lock.

SQLite, read-only: the file is opened with the ``mode=ro`` URI and ``PRAGMA query_only``; it never
takes a write lock and cannot create the file. PostgreSQL, read-only: every transaction is
``READ ONLY`` (``default_transaction_read_only``).
"""

from __future__ import annotations

import os
import sqlite3
import urllib.parse
from dataclasses import dataclass

from sqlalchemy import Engine, create_engine, event
from sqlalchemy.engine import make_url
from sqlalchemy.pool import StaticPool

from .records import SchemaError

SQLITE_BUSY_TIMEOUT_MS = 30_000


@dataclass(frozen=True)
class Engines:
    """``write`` runs every write transaction; ``read`` every read query (same engine on PostgreSQL)."""

    write: Engine | None
    read: Engine
    dialect: str            # "sqlite" | "postgresql"
    url: str                # the URL with any password masked

    def dispose(self) -> None:
        if self.write is not None and self.write is not self.read:
            self.write.dispose()
        self.read.dispose()


def _sqlite_path(url) -> str | None:
    """The file of a SQLite URL; None for an in-memory database."""
    db = url.database
    return None if db in (None, "", ":memory:") else os.path.abspath(db)


def _sqlite_engine(path: str | None, *, immediate: bool, readonly: bool) -> Engine:
    if path is None:        # in memory: one shared connection (tests, scratch boards)
        engine = create_engine("sqlite://", poolclass=StaticPool,
                               connect_args={"check_same_thread": False})
    elif readonly:
        uri = f"file:{urllib.parse.quote(path)}?mode=ro"
        engine = create_engine(
            "sqlite://",
            creator=lambda: sqlite3.connect(uri, uri=True, check_same_thread=False,
                                            timeout=SQLITE_BUSY_TIMEOUT_MS / 1000))
    else:
        engine = create_engine(f"sqlite:///{path}", connect_args={"check_same_thread": False})

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_conn, _record):
        dbapi_conn.isolation_level = None          # we issue BEGIN ourselves (see "begin" below)
        cur = dbapi_conn.cursor()
        cur.execute(f"PRAGMA busy_timeout = {SQLITE_BUSY_TIMEOUT_MS}")
        cur.execute("PRAGMA foreign_keys = ON")
        if readonly:
            cur.execute("PRAGMA query_only = ON")
        elif path is not None:
            cur.execute("PRAGMA journal_mode = WAL")
            cur.execute("PRAGMA synchronous = NORMAL")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn):
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

    return engine


def open_engines(url: str, *, readonly: bool = False) -> Engines:
    """Engines for a board URL (``sqlite:///path``, ``sqlite://`` in memory,
    ``postgresql+psycopg://user@host:port/db``). Raises :class:`SchemaError` with one line when
    the URL is unusable or a read-only SQLite file does not exist."""
    try:
        parsed = make_url(url)
    except Exception as exc:  # noqa: BLE001 - sqlalchemy raises ArgumentError with a long text
        raise SchemaError(f"not a board URL: {url!r} ({exc})") from None
    backend = parsed.get_backend_name()
    masked = parsed.render_as_string(hide_password=True)
    if backend == "sqlite":
        path = _sqlite_path(parsed)
        if readonly:
            if path is None:
                raise SchemaError("a read-only board needs a SQLite file, not an in-memory database")
            if not os.path.exists(path):
                raise SchemaError(f"no board database at {path}")
            ro = _sqlite_engine(path, immediate=False, readonly=True)
            return Engines(write=None, read=ro, dialect="sqlite", url=masked)
        if path is not None:
            parent = os.path.dirname(path)
            if not os.path.isdir(parent):
                raise SchemaError(f"cannot create a board at {path}: no directory {parent}")
            write = _sqlite_engine(path, immediate=True, readonly=False)
            read = _sqlite_engine(path, immediate=False, readonly=False)
        else:
            write = read = _sqlite_engine(None, immediate=True, readonly=False)
        return Engines(write=write, read=read, dialect="sqlite", url=masked)
    if backend == "postgresql":
        if parsed.drivername == "postgresql":       # plain postgresql:// means psycopg 3 here
            parsed = parsed.set(drivername="postgresql+psycopg")
        args = {"options": "-c default_transaction_read_only=on"} if readonly else {}
        try:
            engine = create_engine(parsed, pool_pre_ping=True, pool_size=4, max_overflow=8,
                                   connect_args=args)
        except ModuleNotFoundError as exc:
            raise SchemaError(f"PostgreSQL boards need the psycopg package ({exc.name} missing): "
                              "pip install 'tkcc[postgres]'") from None
        return Engines(write=None if readonly else engine, read=engine, dialect="postgresql",
                       url=masked)
    raise SchemaError(f"unsupported board database {backend!r} (use sqlite:/// or postgresql://)")
