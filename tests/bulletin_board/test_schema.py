"""Schema versions and migrations, on SQLite and PostgreSQL: the shipped migrations build exactly
the models, a newer database is refused, an older one is upgraded (or refused read-only), and
opening errors are one line."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from sqlalchemy import create_engine, text

from bulletin_board import SCHEMA_VERSION, Board, BoardError, SchemaError, migrate
from bulletin_board.schema import Base


def test_head_is_the_newest_shipped_migration():
    assert migrate.known_revisions()[-1] == SCHEMA_VERSION == migrate.HEAD


def test_migrations_build_exactly_the_models(board, board_url):
    from alembic.autogenerate import compare_metadata
    from alembic.migration import MigrationContext

    assert board.schema_version == SCHEMA_VERSION
    engine = create_engine(board_url)
    with engine.connect() as conn:
        diff = compare_metadata(MigrationContext.configure(conn), Base.metadata)
        version = conn.execute(text("SELECT version_num FROM alembic_version")).scalar_one()
    engine.dispose()
    assert diff == [] and version == SCHEMA_VERSION


def test_a_newer_schema_is_refused_with_one_line(board, board_url):
    run = board.create_run("m", "cpu", "t")
    with board._e.write.begin() as conn:
        conn.execute(text("UPDATE alembic_version SET version_num = '0099_from_the_future'"))
    for kw in ({}, {"readonly": True}):
        with pytest.raises(SchemaError) as err:
            Board(board_url, **kw)
        msg = str(err.value)
        assert "0099_from_the_future" in msg and "newer" in msg and "upgrade tkcc" in msg
        assert "\n" not in msg and err.value.user_error
    assert board.get_run(run).model == "m"                             # data untouched


NEXT_REVISION = '''
import sqlalchemy as sa
from alembic import op

revision = "0099_test"
down_revision = "{head}"
branch_labels = None
depends_on = None


def upgrade():
    op.add_column("runs", sa.Column("note", sa.Text(), nullable=True))


def downgrade():
    op.drop_column("runs", "note")
'''


def test_an_older_schema_is_upgraded_or_refused_read_only(board, board_url, tmp_path, monkeypatch):
    """A board at the shipped head opened by code whose head is one newer (a migration written here)."""
    run = board.create_run("m", "cpu", "t")
    board.close()
    scripts = tmp_path / "migrations"
    (scripts / "versions").mkdir(parents=True)
    shipped = Path(migrate.MIGRATIONS_DIR)
    shipped_head = migrate.HEAD
    for name in ("env.py", "script.py.mako", *(f"versions/{p.name}" for p in (shipped / "versions").glob("0*.py"))):
        shutil.copy(shipped / name, scripts / name)
    (scripts / "versions" / "0099_test.py").write_text(NEXT_REVISION.replace("{head}", shipped_head))
    monkeypatch.setattr(migrate, "MIGRATIONS_DIR", str(scripts))
    monkeypatch.setattr(migrate, "HEAD", "0099_test")

    with pytest.raises(SchemaError, match="older than this tkcc.*open it read-write"):
        Board(board_url, readonly=True)
    with pytest.raises(SchemaError, match=f"{shipped_head}, older"):
        Board(board_url, migrate=False)
    upgraded = Board(board_url)
    try:
        assert upgraded.schema_version == "0099_test" and upgraded.get_run(run).model == "m"
        with upgraded._e.read.connect() as conn:
            assert conn.execute(text("SELECT note FROM runs")).all() == [(None,)]
            assert conn.execute(text("SELECT version_num FROM alembic_version")).scalar_one() == \
                "0099_test"
    finally:
        upgraded.close()
    Board(board_url, readonly=True).close()                           # now current


def test_read_only_needs_an_existing_board(tmp_path):
    with pytest.raises(SchemaError, match="no board database"):
        Board(f"sqlite:///{tmp_path / 'missing.db'}", readonly=True)
    assert not (tmp_path / "missing.db").exists()
    Board(f"sqlite:///{tmp_path / 'empty.db'}", migrate=False).close()   # a new board is created
    engine = create_engine(f"sqlite:///{tmp_path / 'bare.db'}")
    with engine.begin() as conn:
        conn.execute(text("CREATE TABLE other (x INTEGER)"))
    engine.dispose()
    with pytest.raises(SchemaError, match="no tables yet"):
        Board(f"sqlite:///{tmp_path / 'bare.db'}", readonly=True)


@pytest.mark.parametrize("url, match", [
    ("mysql://u@h/db", "unsupported board database"),
    ("not a url", "not a board URL"),
    ("sqlite:////no/such/dir/board.db", "no directory"),
    ("postgresql://tkcc@127.0.0.1:9/none", "cannot open the board"),
])
def test_unusable_urls_fail_with_one_line(url, match):
    with pytest.raises(SchemaError, match=match) as err:
        Board(url)
    assert "\n" not in str(err.value)


def test_many_processes_open_a_new_board_at_once(board_url):
    """Concurrent first opens serialise on the migration lock: one creates, the others wait."""
    code = "import sys; from bulletin_board import Board; Board(sys.argv[1]).close(); print('ok')"
    procs = [subprocess.Popen([sys.executable, "-c", code, board_url], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for _ in range(4)]
    for p in procs:
        out, err = p.communicate(timeout=120)
        assert p.returncode == 0 and out.strip() == "ok", err[-2000:]
    with Board(board_url) as b:
        assert b.schema_version == SCHEMA_VERSION and b.list_runs().total == 0


def test_bad_writes_are_board_errors(board):
    with pytest.raises(BoardError, match="does not exist"):
        board.post(31337, "a", "to no run")
    with pytest.raises(BoardError, match="no run"):
        board.add_optimization(31337, "x" * 32, "n", [], {})
