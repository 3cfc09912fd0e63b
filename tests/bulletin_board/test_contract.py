"""The Board API contract (``bulletin_board.BoardAPI``), run against every implementation: ``Board`` on
SQLite and on PostgreSQL (see conftest.board_url)."""

from __future__ import annotations

import inspect
import json
import time

import numpy as np
import pytest
from sqlalchemy import text

from bulletin_board import Board, BoardAPI, BoardError, candidate_id


def protocol_methods() -> list[str]:
    return sorted(n for n, v in vars(BoardAPI).items() if callable(v) and not n.startswith("_"))


def test_the_board_is_the_protocol_with_the_same_signatures(board):
    assert isinstance(board, BoardAPI)
    methods = protocol_methods()
    public = sorted(n for n in dir(type(board)) if not n.startswith("_") and callable(getattr(type(board), n)))
    assert public == methods                 # nothing public beyond the protocol, nothing missing
    for name in methods:
        assert inspect.signature(getattr(type(board), name)) == inspect.signature(getattr(BoardAPI, name)), name


def wait_until_lapsed(board: Board, idea) -> None:
    """Sleep (database clock) until ``idea``'s lease has run out."""
    while board.db_time() <= idea.lease_expires_at:
        time.sleep(0.05)


def test_runs_deployments_and_progress(board):
    r1 = board.create_run("glm", "b200", "t1", config={"budget_s": 600})
    r2 = board.create_run(model="glm", hw="b200", traffic_hash="t1")
    r3 = board.create_run("glm", "h200", "t1")
    assert r1.deployment_id == r2.deployment_id != r3.deployment_id
    assert r1.status == "running" and r1.config == {"budget_s": 600} and r1.finished_at is None
    assert board.deployment("glm", "b200", "t1").id == r1.deployment_id

    for tried, speedup in ((2, 1.1), (1, 1.4), (3, 1.2), (1, float("nan"))):
        board.record_progress(r1, tried=tried, accepted=1, speedup=speedup)
    run = board.record_progress(r1.id, restarts=1)
    assert (run.candidates_tried, run.candidates_accepted, run.engine_restarts) == (7, 4, 1)
    assert run.best_speedup == pytest.approx(1.4)
    assert run.updated_at >= r1.updated_at

    board.set_baseline(r1, {"rms_norm": {"decode": 1.5e-5}, "points": [{"batch": 8}]})
    assert board.get_baseline(r1) == {"rms_norm": {"decode": 1.5e-5}, "points": [{"batch": 8}]}
    done = board.update_run(r1, status="done", message="ok")
    assert done.status == "done" and done.finished_at is not None and done.message == "ok"
    with pytest.raises(BoardError, match="run status"):
        board.update_run(r1, status="finished")
    with pytest.raises(BoardError, match="no run"):
        board.update_run(9999, message="x")

    page = board.list_runs(deployment=r1.deployment_id, sort="-date")
    assert page.total == 2 and [r.id for r in page.items] == [r2.id, r1.id]
    assert board.list_runs(status="done").total == 1
    assert board.get_run(9999) is None
    r4 = board.create_run("glm", "b200", "t2-drifted", deployment_hash="t1")     # a recompile's run
    assert r4.deployment_id == r1.deployment_id and r4.traffic_hash == "t2-drifted"


def test_ideas_are_unique_per_title_and_target(board):
    run = board.create_run("llama-1b", "cpu", "t")
    other = board.create_run("llama-1b", "cpu", "t")
    a = board.post_idea(run, "agent-1", "Fuse RMS norm", "body", target="rms_norm", tags=("fuse",))
    b = board.post_idea(run, "agent-2", "  fuse rms   NORM ", "other body", target="rms_norm")
    c = board.post_idea(run, "agent-2", "Fuse RMS norm", target="silu_and_mul", parent=a)
    d = board.post_idea(other, "agent-2", "Fuse RMS norm", target="rms_norm")
    assert a.id == b.id and b.author == "agent-1" and b.body == "body" and a.tags == ["fuse"]
    assert len({a.id, c.id, d.id}) == 3 and c.parent_id == a.id
    assert board.idea_exists(run, "fuse rms norm", "rms_norm")
    assert not board.idea_exists(run, "fuse rms norm", "linear")
    assert not board.idea_exists(run, "something else", "rms_norm")
    assert board.list_ideas(run).total == 2
    assert [i.id for i in board.list_ideas(run, parent=a).items] == [c.id]
    with pytest.raises(BoardError, match="title"):
        board.post_idea(run, "agent-1", "   ")
    with pytest.raises(BoardError):
        board.post_idea(424242, "agent-1", "no such run")


def test_claim_takes_highest_priority_then_oldest_and_stays_in_its_run(board):
    run, other = board.create_run("m", "cpu", "t"), board.create_run("m", "cpu", "t")
    low = board.post_idea(run, "a", "low", priority=0.0)
    high = board.post_idea(run, "a", "high", priority=5.0)
    low2 = board.post_idea(run, "a", "low2", priority=0.0)
    board.post_idea(other, "a", "elsewhere", priority=99.0)
    got = [board.claim_idea(run, agent=f"w{k}", lease_s=60) for k in range(4)]
    assert [g.id for g in got[:3]] == [high.id, low.id, low2.id]
    assert got[3] is None
    assert all(g.status == "claimed" and g.claims == 1 for g in got[:3])
    assert got[0].claimed_by == "w0" and got[0].lease_expires_at - got[0].heartbeat_at == \
        pytest.approx(60, abs=1e-3)
    assert board.idea_counts(run) == {"open": 0, "claimed": 3, "done": 0, "failed": 0}
    with pytest.raises(BoardError, match="lease_s"):
        board.claim_idea(run, "w", lease_s=0)


def test_lapsed_lease_returns_the_idea_to_the_pool(board):
    run = board.create_run("m", "cpu", "t")
    idea = board.post_idea(run, "a", "only idea")
    first = board.claim_idea(run, "slow-agent", lease_s=0.5)
    assert first.id == idea.id
    second = board.claim_idea(run, "fast-agent", lease_s=60)
    assert second is None or board.db_time() > first.lease_expires_at   # still held while live
    wait_until_lapsed(board, first)
    second = second or board.claim_idea(run, "fast-agent", lease_s=60)
    assert second.id == idea.id and second.claimed_by == "fast-agent" and second.claims == 2
    # the lapsed holder learns it lost the claim and cannot finish the idea
    assert board.heartbeat(first, "slow-agent") is False
    assert board.finish_idea(first, "slow-agent", "done") is False
    assert board.get_idea(idea).status == "claimed"
    assert board.finish_idea(second, "fast-agent", "failed") is True
    assert board.get_idea(idea).status == "failed"
    claims = board.list_claims(run, idea=idea).items
    assert [(c.agent, c.status) for c in claims] == \
        [("slow-agent", "lapsed"), ("fast-agent", "failed")]
    assert board.claim_idea(run, "x") is None                      # finished ideas stay finished


def test_heartbeat_extends_the_lease(board):
    run = board.create_run("m", "cpu", "t")
    board.post_idea(run, "a", "idea")
    held = board.claim_idea(run, "w", lease_s=30)
    assert board.heartbeat(held, "w") is True
    assert board.heartbeat(held, "somebody-else") is False
    assert board.heartbeat(held, "w", lease_s=120) is True
    now = board.get_idea(held)
    assert now.lease_s == 120
    assert now.lease_expires_at - now.heartbeat_at == pytest.approx(120, abs=1e-3)
    assert now.lease_expires_at > held.lease_expires_at


def test_finish_release_and_bad_status(board):
    run = board.create_run("m", "cpu", "t")
    a = board.post_idea(run, "x", "a")
    held = board.claim_idea(run, "w", lease_s=30)
    with pytest.raises(BoardError, match="status"):
        board.finish_idea(held, "w", status="maybe")
    assert board.release_idea(held, "w") is True
    idea = board.get_idea(a)
    assert idea.status == "open" and idea.claimed_by is None and idea.lease_expires_at is None
    again = board.claim_idea(run, "v", lease_s=30)
    assert again.id == a.id and again.claims == 2
    assert board.finish_idea(again.id, "v") is True
    done = board.get_idea(a)
    assert done.status == "done" and done.finished_at is not None and done.claimed_by == "v"
    assert board.finish_idea(again, "v") is False                  # idempotent, reports no claim
    assert [c.status for c in board.list_claims(run).items] == ["released", "done"]


def test_posts_threads_and_free_messages(board):
    run = board.create_run("m", "cpu", "t")
    idea = board.post_idea(run, "a", "idea")
    board.post(run, "a", "first on idea", idea=idea)
    board.post(run, "b", "a free message", kind="status")
    board.post(run.id, "c", "second on idea", idea=idea.id, kind="verdict")
    found, posts = board.thread(idea)
    assert found.id == idea.id and [p.body for p in posts] == ["first on idea", "second on idea"]
    assert [p.body for p in board.list_posts(run, free=True).items] == ["a free message"]
    assert board.list_posts(run, kind="verdict").items[0].author == "c"
    assert board.list_posts(run, sort="-id", limit=1).items[0].body == "second on idea"
    with pytest.raises(BoardError, match="no idea"):
        board.thread(12345)


def test_candidates_carry_their_parent_and_author_kind_and_the_run_its_lineage(board):
    run = board.create_run("m", "cpu", "t")
    root = board.add_candidate(run, "offline-kernel-0", "OVERRIDES = {}\n", author_kind="program")
    child = board.add_candidate(run, "claude-0", "OVERRIDES = {}  # v2\n", parent=root, author_kind="llm")
    grandchild = board.add_candidate(run, "gpt-0", "OVERRIDES = {}  # v3\n", parent=child, author_kind="llm")
    assert board.add_candidate(run, "gpt-1", "OVERRIDES = {}  # v2\n") == child      # dedupe keeps the first
    got = board.get_candidate(child)
    assert (got.parent_id, got.author_kind, got.author) == (root, "llm", "claude-0")
    assert board.get_candidate(root).parent_id is None and board.get_candidate(root).author_kind == "program"
    assert [c.id for c in board.list_candidates(run, parent=root).items] == [child]
    assert {c.id for c in board.list_candidates(run, author_kind="llm").items} == {child, grandchild}
    edges = sorted(board.lineage(run), key=lambda e: e["child_author"])   # same-millisecond ties go by id
    assert edges == [
        {"parent": root, "child": child, "parent_author": "offline-kernel-0", "child_author": "claude-0",
         "child_kind": "llm"},
        {"parent": child, "child": grandchild, "parent_author": "claude-0", "child_author": "gpt-0",
         "child_kind": "llm"}]
    with pytest.raises(BoardError, match="does not exist"):
        board.add_candidate(run, "gpt-0", "OVERRIDES = {}  # orphan\n", parent="f" * 32)
    src = "OVERRIDES = {}  # self\n"
    with pytest.raises(BoardError, match="its own parent"):
        board.add_candidate(run, "gpt-0", src, parent=candidate_id(run.id, src))
    exported = {c["id"]: c for c in board.export_run(run)["candidates"]}
    assert exported[child]["parent_id"] == root and exported[grandchild]["author_kind"] == "llm"


def test_candidates_are_content_addressed_and_evaluations_keep_json(board):
    run = board.create_run("m", "cpu", "t")
    idea = board.post_idea(run, "a", "idea")
    src = "OVERRIDES = {}\nDESCRIPTION = 'nothing'\n"
    cid = board.add_candidate(run, "agent-1", src, idea=idea)
    assert cid == candidate_id(run.id, src)
    assert board.add_candidate(run, "agent-2", src) == cid                # dedupe keeps the first
    other_run = board.create_run("m", "cpu", "t")
    assert board.add_candidate(other_run, "agent-2", src) != cid
    cand = board.get_candidate(cid)
    assert (cand.author, cand.idea_id, cand.source) == ("agent-1", idea.id, src)
    assert board.get_candidate("0" * 32) is None

    ev = board.add_evaluation(
        cid, tier="fast", point={"phase": "decode", "batch": 8, "context": 1024, "chunk": 1,
                                 "weight": 0.5},
        metrics={"speedup": np.float64(1.25), "samples": np.arange(3), "iqr": float("nan")},
        verdict="correct", reasons=[], device="cpu", versions={"torch": "2.13"},
        timing_method="perf_counter_ns median")
    assert ev.speedup == pytest.approx(1.25) and ev.run_id == run.id
    assert ev.metrics == {"speedup": 1.25, "samples": [0, 1, 2], "iqr": None}
    bad = board.add_evaluation(cid, "slow", None, {"speedup": None}, "rejected",
                               reasons=["max abs err 3.1 > 0.02"])
    assert bad.speedup is None and bad.reasons == ["max abs err 3.1 > 0.02"]
    assert board.list_evaluations(run).total == 2
    assert board.list_evaluations(candidate=cid, verdict="rejected").items[0].tier == "slow"
    assert [e.id for e in board.list_evaluations(run, sort="-speedup").items] == [ev.id, bad.id]
    with pytest.raises(BoardError, match="no candidate"):
        board.add_evaluation("f" * 32, "fast", None, {}, "correct")


def _optimizations(board):
    run = board.create_run("glm", "b200", "t")
    run2 = board.create_run("glm", "b200", "t")
    other = board.create_run("llama-8b", "h200", "t")
    made = []
    for k, (r, author, targets, fast, slow) in enumerate([
            (run, "a1", ["rms_norm"], 1.10, 1.05),
            (run, "a2", ["silu_and_mul", "linear"], 1.30, None),
            (run2, "a1", ["linear"], 1.50, 1.40), (other, "a3", ["rms_norm"], 2.0, 1.9),
            (run2, "a2", ["rms_norm_x"], 1.2, 1.2)]):
        cid = board.add_candidate(r, author, f"OVERRIDES = {{}}  # {k}")
        made.append(board.add_optimization(r, cid, f"opt{k}", targets, {"fast": fast, "slow": slow},
                                           per_point=[{"point": {"batch": 1}, "speedup": fast}],
                                           plan_version=1 + k % 2))
    return run, other, made


def test_optimizations_filter_sort_and_paginate(board):
    run, other, made = _optimizations(board)
    dep = run.deployment_id
    page = board.list_optimizations(deployment=dep, sort="-speedup")
    # speedup sorts by the slow tier, the fast one when not confirmed
    assert [o.name for o in page.items] == ["opt2", "opt1", "opt4", "opt0"] and page.total == 4
    assert [o.name for o in board.list_optimizations(op="rms_norm").items] == ["opt3", "opt0"]
    by_a2 = board.list_optimizations(agent="a2", sort="name").items
    assert [o.name for o in by_a2] == ["opt1", "opt4"]
    assert board.list_optimizations(run=run, plan_version=2).items[0].name == "opt1"
    assert made[1].speedup_slow is None and made[1].targets == ["silu_and_mul", "linear"]
    assert made[0].author == "a1" and made[0].deployment_id == dep

    seen = []
    for offset in range(0, 5, 2):
        p = board.list_optimizations(sort="date", limit=2, offset=offset)
        assert p.total == 5 and p.has_next == (offset + 2 < 5)
        seen += [o.id for o in p.items]
    assert seen == [o.id for o in made]

    retired = board.set_optimization_status(made[0], "retired")
    assert retired.status == "retired" and retired.updated_at >= made[0].updated_at
    assert board.list_optimizations(status="active", op="rms_norm").total == 1
    with pytest.raises(BoardError, match="active or retired"):
        board.set_optimization_status(made[0], "gone")
    with pytest.raises(BoardError, match="sort"):
        board.list_optimizations(sort="-fastest")
    with pytest.raises(BoardError, match="limit"):
        board.list_optimizations(limit=0)


def test_drift_history(board):
    run = board.create_run("glm", "b200", "t0")
    features = [{"name": "input_tokens", "statistic": 0.35, "threshold": 0.1, "drifted": True}]
    board.add_drift_event(run.deployment_id, False, [], old_hash="t0", new_hash="t0")
    ev = board.add_drift_event(run.deployment_id, True, features, run=run, old_hash="t0",
                               new_hash="t1")
    assert ev.drifted is True and ev.features == features
    page = board.list_drift_events(deployment=run.deployment_id)
    assert page.total == 2 and page.items[0].id == ev.id               # newest first
    assert board.list_drift_events(drifted=False).items[0].new_hash == "t0"


def test_export_run_is_json_and_complete(board):
    run, _, made = _optimizations(board)
    idea = board.post_idea(run, "a1", "idea", target="rms_norm")
    board.post(run, "a1", "on thread", idea=idea)
    board.post(run, "a1", "free")
    held = board.claim_idea(run, "a1", lease_s=30)
    board.finish_idea(held, "a1")
    board.add_evaluation(made[0].candidate_id, "fast", None, {"speedup": 1.1}, "correct")
    board.add_drift_event(run.deployment_id, True, [{"name": "x"}], run=run)
    board.set_baseline(run, {"op": 1.0})
    out = json.loads(json.dumps(board.export_run(run)))
    assert out["run"]["id"] == run.id and out["run"]["baseline"] == {"op": 1.0}
    assert out["deployment"]["model"] == "glm"
    assert [p["body"] for p in out["ideas"][0]["posts"]] == ["on thread"]
    assert [p["body"] for p in out["posts"]] == ["free"]
    assert len(out["candidates"]) == 2 and len(out["optimizations"]) == 2
    assert out["candidates"][0]["source"].startswith("OVERRIDES")
    assert len(out["evaluations"]) == 1 and len(out["drift_events"]) == 1
    assert out["claims"][0]["status"] == "done"
    with pytest.raises(BoardError, match="no run"):
        board.export_run(777)


def test_readonly_board_reads_and_never_writes(board, board_url):
    run = board.create_run("m", "cpu", "t")
    board.post_idea(run, "a", "idea")
    ro = Board(board_url, readonly=True)
    try:
        assert ro.list_ideas(run).total == 1 and ro.get_run(run).model == "m"
        with pytest.raises(BoardError, match="read-only"):
            ro.post_idea(run, "a", "another")
        with pytest.raises(BoardError, match="read-only"):
            ro.claim_idea(run, "a")
        with pytest.raises(Exception, match="(?i)read.?only"):       # even raw SQL cannot write
            with ro._e.read.begin() as conn:
                conn.execute(text("UPDATE runs SET message = 'x'"))
        # while a writer holds the write lock, the read-only board still reads
        with board._e.write.begin() as conn:
            conn.execute(text("UPDATE runs SET message = 'busy'"))
            assert ro.list_runs().total == 1
    finally:
        ro.close()
    assert board.get_run(run).message == "busy"
