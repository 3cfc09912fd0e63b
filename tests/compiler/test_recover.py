"""compiler.search.recover: the accepted candidates of a run that wrote no plan are re-verified by the next run
into the same root (real boards on both backends; one real optimize run on tiny-dense, CPU engines)."""

from pathlib import Path

import pytest

from bulletin_board import Board
from compiler.search import recover
from compiler.search.loop import OptimizeConfig, optimize

ROOT = Path(__file__).resolve().parents[2]
CONV = str(ROOT / "examples" / "traffic" / "azure2023_conv.csv")
CANDIDATES = Path(__file__).with_name("candidates")
SOURCE = (CANDIDATES / "silu_fused.py").read_text()


def _run_with(board, status, message, sources, model="tiny-dense", hw="h200"):
    """A run holding ``sources`` ({source: accepted?}) as the loop records them, left in ``status``."""
    run = board.create_run(model=model, hw=hw, traffic_hash="t")
    for i, (src, accepted) in enumerate(sources.items()):
        cid = board.add_candidate(run.id, author=f"agent-{i}", source=src)
        board.add_evaluation(cid, tier="fast", point=None, verdict="correct",
                             metrics={"speedup": 1.3, "accepted": accepted, "decision": "x"})
    board.update_run(run.id, status=status, message=message)
    return run.id


def test_only_accepted_candidates_of_unfinished_runs_are_recovered_once(board_url, monkeypatch):
    board = Board(board_url)                                    # SQLite and PostgreSQL (tests/conftest.py)
    a, b = SOURCE, SOURCE + "\n# another\n"
    killed = _run_with(board, "failed", "KeyboardInterrupt: ", {a: True, b: False})
    _run_with(board, "done", "plan /x/v1", {b: True})                       # wrote its plan
    _run_with(board, "interrupted", "plan /x/v2", {b: True})                # Ctrl-C, plan written
    _run_with(board, "failed", "boom", {b: True}, model="tiny-moe")         # another model
    live = _run_with(board, "running", "searching", {b: True})              # still mirroring progress
    seeds, runs = recover.recovered_seeds(board, "tiny-dense", "h200")
    assert seeds == [(f"run{killed}:agent-0", a)] and runs == [killed]
    assert recover.recovered_seeds(board, "tiny-dense", "h200", known=(("p", a),))[0] == []
    monkeypatch.setattr(recover, "STALE_S", -1.0)                           # the live run went silent
    seeds, runs = recover.recovered_seeds(board, "tiny-dense", "h200")
    assert [s for _, s in seeds] == [b, a] and runs == [live, killed]
    recover.mark_recovered(board, runs, 99)
    assert recover.recovered_seeds(board, "tiny-dense", "h200") == ([], [])
    assert board.get_run(killed).status == "failed" and board.get_run(killed).message == "recovered by run 99"
    board.close()


@pytest.mark.slow
def test_the_next_run_re_verifies_what_a_killed_run_accepted(tmp_path):
    out = tmp_path / "tiny"
    out.mkdir()
    board = Board(f"sqlite:///{(out / 'board.db').resolve()}")
    killed = _run_with(board, "running", "searching", {SOURCE: True})
    # a run dead for longer than STALE_S: its progress mirror stopped long ago
    board._update_run(killed, {"updated_at": board.db_time() - 2 * recover.STALE_S}, "test")
    board.close()
    cfg = OptimizeConfig(model="tiny-dense", hw="h200", traffic=CONV, out=str(out), budget_s=5,
                         agents="offline:1", max_points=1, aa_runs=1, quiet=True)
    res = optimize(cfg)
    board = Board(f"sqlite:///{(out / 'board.db').resolve()}")
    new = max(board.list_runs().items, key=lambda r: r.created_at)
    authors = {c.author: c.source for c in board.list_candidates(new.id, limit=1000).items}
    assert authors.get(f"seed:run{killed}:agent-0") == SOURCE                # considered first
    assert board.get_run(killed).message == f"recovered by run {new.id}"
    assert res.plan is not None
    board.close()


def test_a_board_that_cannot_answer_does_not_stop_the_run(caplog):
    """Recovery is best effort, like all board bookkeeping: a failing board means no seeds, a warning."""
    import time

    from compiler.search import loop
    from compiler.search.progress import Progress

    class Unreachable:                   # a board whose database went away
        def db_time(self):
            raise ConnectionError("database gone")

    cfg = OptimizeConfig(model="tiny-dense", hw="h200", traffic=CONV, out="unused")
    assert loop._recovered(cfg, Unreachable(), Progress(time.monotonic() + 1, quiet=True)) == (cfg, [])
    assert "recovered_seeds failed: database gone" in caplog.text
