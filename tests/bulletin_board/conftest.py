"""Fixtures of the board's contract suite: every test that takes ``board_url`` (or ``board``) runs
on SQLite (a file in tmp_path) and on PostgreSQL (a fresh database on the server that
``scripts/test_services.sh run`` starts and names in TKCC_TEST_PG_URL; skipped without it)."""

from __future__ import annotations

import os
import uuid

import pytest

from bulletin_board import Board

PG_URL = os.environ.get("TKCC_TEST_PG_URL")


def _pg_admin():
    from sqlalchemy import create_engine

    return create_engine(PG_URL, isolation_level="AUTOCOMMIT")


@pytest.fixture(params=["sqlite", "postgresql"])
def board_url(request, tmp_path):
    """A URL of an empty database on each backend."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'board.db'}"
        return
    if not PG_URL:
        pytest.skip("PostgreSQL tests need TKCC_TEST_PG_URL (scripts/test_services.sh run ...)")
    from sqlalchemy import text
    from sqlalchemy.engine import make_url

    name = f"tkcc_t_{uuid.uuid4().hex[:12]}"
    admin = _pg_admin()
    with admin.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    try:
        yield make_url(PG_URL).set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.connect() as conn:
            conn.execute(text(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)'))
        admin.dispose()


@pytest.fixture
def board(board_url):
    b = Board(board_url)
    yield b
    b.close()
