"""The board's memory across runs (``Board.remember`` / ``recall``), on SQLite and PostgreSQL."""

from __future__ import annotations


def test_remembered_candidates_are_recalled_per_model_hw_and_shape_class(board):
    r1 = board.create_run(model="m", hw="h200", traffic_hash="a")
    r2 = board.create_run(model="m", hw="h200", traffic_hash="b")         # another traffic, same deployment
    board.remember(r1, model="m", hw="h200", shape_class="S", source="A = 1", verdict="rejected",
                   kind="template", target="rms_norm", title="t1", knobs={"block": 64})
    board.remember(r1, model="m", hw="h200", shape_class="S", source="B = 2", verdict="accepted", speedup=1.3,
                   metrics={"fast": 1.3, "slow": 1.2})
    board.remember(r1, model="m", hw="h200", shape_class="OTHER", source="C = 3", verdict="correct", speedup=1.0)
    board.remember(r1, model="m", hw="b200", shape_class="S", source="D = 4", verdict="correct", speedup=1.0)
    # the same source judged again (a later run): one row, the latest verdict
    again = board.remember(r2, model="m", hw="h200", shape_class="S", source="A = 1", verdict="correct",
                           speedup=float("nan"), kind="template", target="rms_norm", title="t1", knobs={"block": 64})
    assert again.run_id == r2.id and again.speedup is None
    got = board.recall("m", "h200", "S")
    assert [t.verdict for t in got] == ["accepted", "correct"]           # best speedup first
    assert got[0].metrics == {"fast": 1.3, "slow": 1.2} and got[1].knobs == {"block": 64}
    assert [t.title for t in board.recall("m", "h200", "S", kind="template")] == ["t1"]
    assert board.recall("m", "h200", "nope") == [] and len(board.recall("m", "b200", "S")) == 1


def test_a_claim_can_be_limited_to_one_target(board):
    run = board.create_run(model="m", hw="h200", traffic_hash="a")
    kernel = board.post_idea(run, author="k", title="fast rms", target="rms_norm", priority=0.9)
    config = board.post_idea(run, author="c", title="config{x=1}", target="config", priority=0.05)
    got = board.claim_idea(run, agent="config-search", target="config")
    assert got.id == config.id                       # the higher-priority kernel idea is left to others
    assert board.claim_idea(run, agent="config-search", target="config") is None
    assert board.claim_idea(run, agent="kernel", lease_s=60).id == kernel.id
