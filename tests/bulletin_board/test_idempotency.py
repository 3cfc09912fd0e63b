"""Board writes carry idempotency keys (issue 21): a writer killed after its commit but before it saw
the acknowledgement retries, and the retry is a no-op returning the first row. On SQLite and PostgreSQL;
a board of the first schema (0001) is upgraded in place, its rows kept."""

import shutil
from pathlib import Path

import pytest
from sqlalchemy import func, select, text

from bulletin_board import Board, BoardError, migrate
from bulletin_board.schema import T_EVALUATIONS, T_OPTIMIZATIONS, T_RUNS


def count(board, table) -> int:
    with board._e.read.connect() as conn:
        return conn.execute(select(func.count()).select_from(table)).scalar_one()


def _evaluate(board, cand, **kw):
    return board.add_evaluation(cand, tier="fast", point={"batch": 2}, metrics={"speedup": 1.2, "timings": {"x": 0.5}},
                                verdict="correct", reasons=[], device="cpu", timing_method="engine A/B", **kw)


def test_a_retried_evaluation_is_a_no_op(board):
    run = board.create_run("m", "cpu", "t")
    cand = board.add_candidate(run, "a", "OVERRIDES = {}\n")
    first = _evaluate(board, cand)
    again = _evaluate(board, cand)                       # the retry of the very same write
    assert again.id == first.id and count(board, T_EVALUATIONS) == 1
    other = board.add_evaluation(cand, tier="slow", point=None, metrics={"speedup": 1.1}, verdict="correct")
    assert other.id != first.id and count(board, T_EVALUATIONS) == 2
    # an explicit key: the second write with it returns the first, even with other metrics
    k1 = _evaluate(board, cand, idempotency_key="agent-3:eval:17")
    k2 = board.add_evaluation(cand, tier="fast", point=None, metrics={"speedup": 9.9}, verdict="correct",
                              idempotency_key="agent-3:eval:17")
    assert k1.id == k2.id and k2.speedup == 1.2 and count(board, T_EVALUATIONS) == 3


def test_retried_runs_and_optimizations_are_no_ops(board):
    r1 = board.create_run("m", "cpu", "t", idempotency_key="optimize:1234")
    r2 = board.create_run("m", "cpu", "t", idempotency_key="optimize:1234")
    assert r1.id == r2.id and count(board, T_RUNS) == 1
    assert board.create_run("m", "cpu", "t").id != r1.id            # no key: a new run each time
    cand = board.add_candidate(r1, "a", "OVERRIDES = {}\n")
    o1 = board.add_optimization(r1, cand, "x", ["rms_norm"], {"fast": 1.2, "slow": 1.1}, plan_version=1)
    o2 = board.add_optimization(r1, cand, "x", ["rms_norm"], {"fast": 1.2, "slow": 1.1}, plan_version=1)
    assert o1.id == o2.id and count(board, T_OPTIMIZATIONS) == 1
    assert board.add_optimization(r1, cand, "x", ["rms_norm"], {"fast": 1.2, "slow": 1.1}, plan_version=2).id != o1.id
    with pytest.raises(BoardError, match="1 to 64"):
        board.create_run("m", "cpu", "t", idempotency_key="k" * 65)


def test_a_first_schema_board_is_upgraded_with_its_rows(board_url, tmp_path, monkeypatch):
    """A board written by the 0001 schema is migrated to the keys on open; old rows keep a NULL key."""
    scripts = tmp_path / "migrations"
    (scripts / "versions").mkdir(parents=True)
    shipped = Path(migrate.MIGRATIONS_DIR)
    for name in ("env.py", "script.py.mako", "versions/0001_initial.py"):
        shutil.copy(shipped / name, scripts / name)
    with monkeypatch.context() as m:
        m.setattr(migrate, "MIGRATIONS_DIR", str(scripts))
        m.setattr(migrate, "HEAD", "0001_initial")
        old = Board(board_url)
        with old._write("legacy") as conn:             # rows as the 0001 code wrote them: no key column
            conn.execute(text("INSERT INTO deployments (id, model, hw, traffic_hash, name, created_at) "
                              "VALUES (1, 'm', 'cpu', 't', '', 0)"))
            conn.execute(text("INSERT INTO runs (id, deployment_id, model, hw, traffic_hash, status, message, config, "
                              "candidates_tried, candidates_accepted, engine_restarts, created_at, updated_at) "
                              "VALUES (1, 1, 'm', 'cpu', 't', 'running', '', '{}', 0, 0, 0, 0, 0)"))
            conn.execute(text("INSERT INTO candidates (id, run_id, author, source, source_hash, created_at) "
                              "VALUES ('c1', 1, 'a', 'OVERRIDES = {}', 'h', 0)"))
            conn.execute(text("INSERT INTO evaluations (candidate_id, run_id, tier, metrics, verdict, reasons, "
                              "device, versions, timing_method, created_at) VALUES ('c1', 1, 'fast', '{}', "
                              "'correct', '[]', '', '{}', '', 0)"))
        old.close()
    new = Board(board_url)
    try:
        assert new.schema_version == migrate.HEAD
        assert count(new, T_EVALUATIONS) == 1
        first = _evaluate(new, "c1")
        assert _evaluate(new, "c1").id == first.id and count(new, T_EVALUATIONS) == 2
    finally:
        new.close()
