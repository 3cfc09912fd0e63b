"""Many processes on one board, on SQLite and PostgreSQL: exactly-once claims, the lease of a
killed process lapses, and a process killed while writing leaves nothing half-written."""

from __future__ import annotations

import hashlib
import json
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import pytest

from bulletin_board import candidate_id

WORKER = str(Path(__file__).with_name("board_worker.py"))
ROOT = str(Path(__file__).resolve().parents[2])


def spawn(*args: str) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, WORKER, *args], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    line = proc.stdout.readline().strip()
    if line != "ready":
        proc.kill()
        raise AssertionError(f"worker did not start: {line!r} {proc.stderr.read()[-2000:]}")
    return proc


@pytest.mark.slow
def test_16_processes_claim_every_idea_exactly_once(board, board_url, tmp_path):
    procs_n, cycles = 16, 200
    run = board.create_run("m", "cpu", "stress")
    ideas = {board.post_idea(run, "seed", f"idea {k}").id for k in range(procs_n * cycles)}
    go = tmp_path / "go"
    procs = [spawn("claim", board_url, str(run.id), f"w{i}", str(go)) for i in range(procs_n)]
    go.touch()                                          # all start claiming at once
    per_worker = []
    for p in procs:
        out, err = p.communicate(timeout=500)
        assert p.returncode == 0, err[-2000:]
        per_worker.append(json.loads(out.strip().splitlines()[-1]))
    claimed = [i for got in per_worker for i in got]
    assert len(claimed) == len(ideas) and set(claimed) == ideas      # each claimed exactly once
    assert sum(1 for got in per_worker if got) >= 2                  # they really competed
    assert board.idea_counts(run) == {"open": 0, "claimed": 0, "done": len(ideas), "failed": 0}
    claims = board.list_claims(run, limit=1)
    assert claims.total == len(ideas)
    assert board.list_claims(run, status="done", limit=1).total == len(ideas)
    assert Counter(d["claims"] for d in board._all(board.list_ideas, run=run)) == {1: len(ideas)}


def test_killed_holder_lease_lapses_and_the_idea_returns(board, board_url):
    run = board.create_run("m", "cpu", "t")
    idea = board.post_idea(run, "seed", "the idea")
    proc = spawn("hold", board_url, str(run.id), "doomed", "1.0")
    held = json.loads(proc.stdout.readline())
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    proc.stdout.close()
    proc.stderr.close()
    assert held["id"] == idea.id
    got = board.claim_idea(run, "survivor", lease_s=60)
    assert got is None or board.db_time() > held["lease_expires_at"]   # not before the lease ends
    while got is None:
        time.sleep(0.05)
        got = board.claim_idea(run, "survivor", lease_s=60)
    assert got.id == idea.id and got.claims == 2
    assert [(c.agent, c.status) for c in board.list_claims(run).items] == \
        [("doomed", "lapsed"), ("survivor", "held")]


def _expected_source(k: int, size: int) -> str:
    sys.path.insert(0, str(Path(WORKER).parent))
    try:
        from board_worker import payload
    finally:
        sys.path.pop(0)
    return f"# candidate {k}\nOVERRIDES = {{}}\n# {payload(k, size)}\n"


def test_killed_writer_leaves_nothing_half_written(board, board_url):
    size = 2_000_000
    run = board.create_run("m", "cpu", "t")
    rng = random.Random(0)
    mid_write = rounds = 0
    while rounds < 8 and mid_write < 3:
        rounds += 1
        proc = spawn("write", board_url, str(run.id), str(size))
        while not proc.stdout.readline().startswith("done"):       # let one pair complete
            pass
        assert proc.stdout.readline().startswith("start")
        time.sleep(rng.uniform(0.0, 0.15))
        proc.send_signal(signal.SIGKILL)
        rest = proc.stdout.read().split()
        proc.wait(timeout=30)
        proc.stdout.close()
        proc.stderr.close()
        mid_write += not rest or rest[-2] == "start"               # killed between start and done
    assert mid_write >= 1
    cands = board._all(board.list_candidates, run=run)
    assert cands
    for c in cands:
        k = int(c["source"].split("\n", 1)[0].split()[-1])
        assert c["source"] == _expected_source(k, size)
        assert c["id"] == candidate_id(run.id, c["source"])
        assert c["source_hash"] == hashlib.sha256(c["source"].encode()).hexdigest()
    ids = {c["id"] for c in cands}
    evals = board._all(board.list_evaluations, run=run)
    assert len(evals) >= len(cands) - rounds     # a round leaves at most one without evaluation
    for e in evals:
        samples = e["metrics"]["samples"]
        assert e["candidate_id"] in ids and len(samples) == size // 8
        assert e["metrics"]["check"] == hashlib.sha256(json.dumps(samples).encode()).hexdigest()
