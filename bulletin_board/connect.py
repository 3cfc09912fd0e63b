"""Opening a board's database: SQLite (default) or PostgreSQL, read-write or read-only.

SQLite, read-write: WAL journal (readers never block the writer), ``synchronous=NORMAL`` (a commit
is durable against a process crash, not against a power cut), a 30 s busy timeout, foreign keys on,
and every transaction started with ``BEGIN IMMEDIATE``: a transaction takes the write lock up front,
so a read-then-write (a claim, a migration) is atomic and never fails half-way with SQLITE_BUSY.
Waiting for that lock is done by :func:`write_transaction`: tkcc writers of one file queue on an
``flock`` of ``<file>-lock`` (woken by the kernel when it is free), and ``BEGIN IMMEDIATE`` is
retried after short jittered sleeps (0.5-4 ms) for up to 30 s against any other writer. SQLite's
own busy handler backs off to 100 ms sleeps, which leaves the lock idle most of the time when many
processes write (measured: 16 processes claimed 5x slower with it).
Reads in a read-write Board go through a second engine with plain deferred transactions, so they
do not take the write lock.

SQLite, read-only: the file is opened with the ``mode=ro`` URI and ``PRAGMA query_only``; it never
takes a write lock and cannot create the file. PostgreSQL, read-only: every transaction is
``READ ONLY`` (``default_transaction_read_only``).
"""

from __future__ import annotations

import contextlib
import os
import random
import sqlite3
import time
import urllib.parse
from dataclasses import dataclass
from typing import Iterator

try:
    import fcntl
except ImportError:                 # not on POSIX: writers poll SQLite's lock only
    fcntl = None

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy.exc import OperationalError
from sqlalchemy.engine import make_url
from sqlalchemy.pool import StaticPool

from .records import SchemaError

SQLITE_BUSY_TIMEOUT_MS = 30_000     # how long a write waits for SQLite's write lock in all
SQLITE_WRITER_WAIT_MS = 2           # ... SQLite's own busy handler waiting this long at a time


@dataclass(frozen=True)
class Engines:
    """``write`` runs every write transaction; ``read`` every read query (one engine on
    PostgreSQL)."""

    write: Engine | None
    read: Engine
    dialect: str            # "sqlite" | "postgresql"
    url: str                # the URL with any password masked
    lock_path: str | None = None    # SQLite file: writers queue on an flock of this file

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
        if immediate:                              # write_transaction does the waiting
            cur.execute(f"PRAGMA busy_timeout = {SQLITE_WRITER_WAIT_MS}")
        cur.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn):
        conn.exec_driver_sql("BEGIN IMMEDIATE" if immediate else "BEGIN")

    return engine


@contextlib.contextmanager
def _queue(lock_path: str | None) -> Iterator[None]:
    """Writers of one SQLite file wait in the kernel (``flock``) rather than polling SQLite's lock:
    the waiter is woken when the lock is free, so the lock never sits idle. Cost: open + flock +
    close, a few microseconds. Released by the kernel if the process dies."""
    if lock_path is None or fcntl is None:
        yield
        return
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT, 0o666)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)                                # releases the flock


@contextlib.contextmanager
def write_transaction(engines: Engines) -> Iterator[Connection]:
    """A write transaction on ``engines.write``, committed when the block ends, rolled back when it
    raises. On SQLite, waits for the write lock by retrying ``BEGIN IMMEDIATE`` (nothing has run
    yet when it fails, so a retry is safe)."""
    with _queue(engines.lock_path), engines.write.connect() as conn:
        if engines.dialect == "sqlite":
            deadline = time.monotonic() + SQLITE_BUSY_TIMEOUT_MS / 1000
            pause = 0.0005
            while True:
                try:
                    conn.begin()
                    break
                except OperationalError as exc:
                    busy = "locked" in str(exc.orig) or "busy" in str(exc.orig)
                    if not busy or time.monotonic() > deadline:
                        raise
                time.sleep(random.uniform(pause / 2, pause))
                pause = min(pause * 2, 0.004)
        else:
            conn.begin()
        try:
            yield conn
        except BaseException:
            conn.rollback()
            raise
        conn.commit()


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
                raise SchemaError("a read-only board needs a SQLite file, not an in-memory "
                                  "database")
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
            return Engines(write=write, read=read, dialect="sqlite", url=masked,
                           lock_path=path + "-lock")
        write = _sqlite_engine(None, immediate=True, readonly=False)
        return Engines(write=write, read=write, dialect="sqlite", url=masked)
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
