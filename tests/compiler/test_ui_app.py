"""The UI over real HTTP: uvicorn on 127.0.0.1 (free port) serving a board filled through the
Board API (``compiler.ui.sample``), read-only; the ``tkcc ui`` command; PostgreSQL when
TKCC_TEST_PG_URL is set (``scripts/test_services.sh run``)."""

from __future__ import annotations

import re
import sqlite3
import subprocess
import sys

import httpx
import pytest

from bulletin_board import Board, BoardError, SchemaError
from compiler.ui import UIConfig, UIServer
from compiler.ui.sample import HOSTILE, SampleSpec, fill_board

ESCAPED = "&lt;script&gt;alert(1)&lt;/script&gt;"


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    path = tmp_path_factory.mktemp("ui") / "board.db"
    url = f"sqlite:///{path}"
    writer = Board(url)
    sample = fill_board(writer, SampleSpec(hostile=True, ideas=60, evaluations=120))
    with UIServer(UIConfig(board=url)) as server, httpx.Client(base_url=server.url, timeout=30) as client:
        yield server, client, writer, sample, path
    writer.close()


def _ids(client, **params) -> list[int]:
    r = client.get("/api/optimizations", params=params)
    assert r.status_code == 200, r.text
    return [o["id"] for o in r.json()["items"]]


def test_every_page_renders_and_shows_hostile_text_as_text(served):
    server, client, writer, s, _ = served
    pages = ["/", f"/deployments/{s.deployments[0]}", "/optimizations", f"/optimizations/{s.hostile_optimization}",
             "/runs", f"/runs/{s.runs[0]}", f"/runs/{s.runs[0]}?verdict=rejected&page=2&n=5", "/ideas",
             f"/ideas/{s.hostile_idea}", f"/ideas?run={s.runs[0]}&status=done", "/drift",
             f"/drift?deployment={s.deployments[0]}"]
    opt = writer.get_optimization(s.hostile_optimization)
    pages.append(f"/candidates/{opt.candidate_id}")
    for path in pages:
        r = client.get(path)
        assert r.status_code == 200, (path, r.text[:300])
        assert r.headers["content-type"].startswith("text/html")
        assert "script-src 'self'" in r.headers["content-security-policy"]
        assert HOSTILE not in r.text, path                 # never raw
    detail = client.get(f"/optimizations/{s.hostile_optimization}").text
    assert detail.count(ESCAPED) >= 4                       # author, idea title, post, code body
    assert "OVERRIDES" in detail and 'id="points"' in detail and "baseline ms" in detail
    assert client.get(f"/ideas/{s.hostile_idea}").text.count(ESCAPED) >= 3


def test_sorting_matches_the_board(served):
    _, client, writer, s, _ = served
    opts = writer.list_optimizations(limit=1000).items

    def speed(o):
        return o.speedup_slow if o.speedup_slow is not None else o.speedup_fast

    ids = _ids(client, sort="-speedup", n=200)
    got = [speed(writer.get_optimization(i)) for i in ids]
    assert got == sorted(got, reverse=True) and len(ids) == len(opts)
    ids = _ids(client, sort="agent", n=200)
    authors = [writer.get_optimization(i).author for i in ids]
    assert authors == sorted(authors)
    ids = _ids(client, sort="-date", n=200)
    dates = [writer.get_optimization(i).created_at for i in ids]
    assert dates == sorted(dates, reverse=True)
    # the HTML table lists the rows in the same order
    html = client.get("/optimizations", params={"sort": "speedup", "n": 200}).text
    rows = [int(x) for x in __import__("re").findall(r'<tr data-id="(\d+)"', html)]
    assert rows == _ids(client, sort="speedup", n=200)
    r = client.get("/optimizations", params={"sort": "1; DROP TABLE runs"})
    assert r.status_code == 400 and "cannot sort by" in r.text


def test_filtering_and_paging(served):
    _, client, writer, s, _ = served
    retired = _ids(client, status="retired", n=200)
    assert retired and all(writer.get_optimization(i).status == "retired" for i in retired)
    rms = _ids(client, op="rms_norm", n=200)
    assert rms and all("rms_norm" in writer.get_optimization(i).targets for i in rms)
    dep = s.deployments[1]
    in_dep = _ids(client, deployment=dep, n=200)
    assert sorted(in_dep) == sorted(o.id for o in writer.list_optimizations(deployment=dep, limit=1000).items)
    agent = writer.get_optimization(in_dep[0]).author
    assert all(writer.get_optimization(i).author == agent for i in _ids(client, agent=agent, n=200))
    page1, page2 = _ids(client, sort="-date", n=5, page=1), _ids(client, sort="-date", n=5, page=2)
    assert len(page1) == 5 and not set(page1) & set(page2)
    assert page1 + page2 == _ids(client, sort="-date", n=10)
    html = client.get("/optimizations", params={"n": 5, "page": 2, "status": "active"}).text
    total = writer.list_optimizations(status="active", limit=1).total
    assert f"page 2 of {-(-total // 5)} · {total} rows" in html
    assert 'rel="next" href="/optimizations?n=5&amp;status=active&amp;page=3"' in html
    assert client.get("/optimizations", params={"page": 999}).status_code == 200     # empty, not an error
    assert client.get("/optimizations", params={"page": 0}).status_code == 400
    ideas = client.get("/ideas", params={"run": s.runs[0], "status": "open", "n": 200}).text
    assert ideas.count('<td class="title">') == writer.list_ideas(s.runs[0], status="open").total


def test_unknown_ids_are_404(served):
    _, client, *_ = served
    for path in ("/optimizations/99999", "/runs/99999", "/ideas/99999", "/deployments/99999",
                 "/candidates/nope"):
        r = client.get(path)
        assert r.status_code == 404 and "no " in r.text
    assert client.get("/api/runs/99999").status_code == 404


def test_live_progress_and_no_write_lock(served):
    server, client, writer, s, path = served
    run = s.runs[-1]
    writer.update_run(run, message="composing", candidates_tried=77, best_speedup=1.77)
    doc = client.get(f"/api/runs/{run}").json()
    assert (doc["status"], doc["phase"], doc["tried"], doc["best_speedup"]) == ("running", "composing", 77, 1.77)
    # the UI holds no write lock: another process can take one while pages are being served ...
    conn = sqlite3.connect(path, timeout=0, isolation_level=None)
    conn.execute("BEGIN IMMEDIATE")
    try:  # ... and a writer's open transaction does not block the UI
        assert client.get(f"/runs/{run}").status_code == 200
    finally:
        conn.execute("ROLLBACK")
        conn.close()
    with pytest.raises(BoardError, match="read-only"):
        server.app.state.board.post(run, author="ui", body="must not be written")
    with pytest.raises(SchemaError, match="no board database"):
        UIServer(UIConfig(board=f"sqlite:///{path.parent / 'missing.db'}"))
    assert not (path.parent / "missing.db").exists()


def _tkcc(*args, timeout=60):
    return subprocess.run([sys.executable, "-m", "compiler.cli", "ui", *args], capture_output=True,
                          text=True, timeout=timeout)


def test_cli_refuses_remote_host_and_missing_board(tmp_path):
    r = _tkcc("--host", "0.0.0.0", "--board", str(tmp_path / "x.db"))
    assert r.returncode == 2 and "non-loopback" in r.stderr and "--allow-remote" in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
    r = _tkcc("--board", str(tmp_path / "missing.db"), "--port", "0")
    assert r.returncode == 2 and "no board database" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "missing.db").exists()


def test_cli_serves_and_refuses_a_busy_port(served, tmp_path):
    server, _, _, _, path = served
    r = _tkcc("--board", str(path), "--port", str(server.port))
    assert r.returncode == 2 and "cannot listen" in r.stderr and "Traceback" not in r.stderr
    proc = subprocess.Popen([sys.executable, "-m", "compiler.cli", "ui", "--board", f"sqlite:///{path}",
                             "--port", "0"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()              # "tkcc ui: serving ... at http://127.0.0.1:PORT/ ..."
        if "read-only" not in line:
            proc.kill()
            pytest.fail(f"tkcc ui did not start: {line!r} {proc.stderr.read()}")
        url = line.split(" at ")[1].split()[0]
        assert url.startswith("http://127.0.0.1:")
        r = httpx.get(url, timeout=30)
        assert r.status_code == 200 and "Deployments" in r.text
    finally:
        proc.terminate()
        proc.wait(timeout=30)


def test_the_ui_serves_every_board_backend(board_url):
    """The same pages on SQLite and PostgreSQL (``board_url``: tests/conftest.py), hostile text escaped."""
    writer = Board(board_url)
    s = fill_board(writer, SampleSpec(hostile=True, ideas=12, evaluations=20))
    with UIServer(UIConfig(board=board_url)) as server, httpx.Client(base_url=server.url, timeout=30) as c:
        for p in ("/", "/optimizations?sort=-speedup", f"/optimizations/{s.hostile_optimization}",
                  f"/runs/{s.runs[0]}", "/ideas", "/drift", f"/deployments/{s.deployments[0]}"):
            r = c.get(p)
            assert r.status_code == 200 and HOSTILE not in r.text, p
        ids = [o["id"] for o in c.get("/api/optimizations", params={"sort": "-speedup"}).json()["items"]]
        assert ids == [o.id for o in writer.list_optimizations(sort="-speedup").items]
        with pytest.raises(BoardError):
            server.app.state.board.post(s.runs[0], author="ui", body="x")
    writer.close()


def test_optimizations_whose_tiers_disagree_are_flagged(served):
    from compiler.plan.report import tiers_disagree

    _, client, writer, _, _ = served
    some = writer.list_optimizations(limit=1).items[0]     # one more whose slow tier finds no gain
    odd = writer.add_optimization(some.run_id, some.candidate_id, name="split_kv_fast_only", targets=["attention_decode"],
                                  speedups={"fast": 1.3, "slow": 0.97})
    html = client.get("/optimizations", params={"n": 200}).text
    rows = re.findall(r'<tr data-id="(\d+)">(.*?)</tr>', html, re.S)
    flagged = {int(i) for i, body in rows if "tiers disagree" in body}
    want = {o.id for o in writer.list_optimizations(limit=1000).items
            if tiers_disagree(o.speedup_fast, o.speedup_slow)}
    assert odd.id in flagged and flagged == want and len(rows) == len(writer.list_optimizations(limit=1000).items)


def test_the_run_page_shows_the_search_throughput_and_the_projected_settings(served):
    _, client, writer, s, _ = served
    rid = s.runs[-1]
    engines = {"fast-0": {"tier": "fast", "device": "cpu", "calls": 7, "queue_wait_s": 1.5, "executor_wait_s": 0.25,
                          "compile_s": 2.0, "judging_s": 30.5, "other_s": 1.0, "idle_s": 6.25, "wall_s": 40.0}}
    projected = {k: {"before": 10.0, "after": 5.0} for k in ("ttft_mean_ms", "ttft_p99_ms", "tpot_mean_ms",
                                                              "tokens_per_s", "tokens_per_busy_s")}
    run = writer.get_run(rid)
    writer.update_run(rid, config={**run.config, "candidates_per_hour": 630.0, "device_busy_fraction": 0.7625,
                                   "remembered": 3, "throughput": {"window_s": 40.0, "devices": 1, "engines": engines},
                                   "config_optimizations": [
                                       {"name": "config-ab12", "description": "max_chunk_tokens=512",
                                        "projected": {**projected, "label": "projected: replay", "modelled": ["the fit"]}},
                                       {"name": "config-cd34", "description": "max_num_seqs=8",
                                        "projected": {**projected, "label": "projected: replay", "modelled": ["the fit"],
                                                      "goodput_tokens_per_s": {"before": 32.5, "after": 69.25},
                                                      "slo_attained": {"before": 0.304, "after": 1.0}}}]})
    html = client.get(f"/runs/{rid}").text
    assert 'id="throughput"' in html and "630.0" in html and "0.7625" in html and "30.5" in html
    assert 'id="configs"' in html and "config-ab12" in html and "max_chunk_tokens=512" in html
    assert "10.0 &rarr; 5.0" in html and "3 remembered" in html
    assert "no SLO given" in html and "32.5 &rarr; 69.25 (0.304 &rarr; 1.0)" in html


def test_the_run_page_says_what_its_speedups_are_measured_against(served):
    """Issue 39: the words the plan writer records (``plan_writer.record_baseline``), escaped; before the plan
    is written, a line that says they come then."""
    from compiler.plan.writer import record_baseline
    from persistent_engine.executor.compiled_step import baseline_words

    _, client, writer, s, _ = served
    rid = s.runs[-1]
    assert "recorded when its plan is written" in client.get(f"/runs/{rid}").text or \
        "measured against the step" in client.get(f"/runs/{rid}").text
    record_baseline(writer, rid, {"fast": 1.25, "slow": 1.125, "baseline": baseline_words(True) + " <b>"})
    html = client.get(f"/runs/{rid}").text
    line = re.search(r'<p class="meta" id="baseline">(.*?)</p>', html, re.S).group(1)
    assert "torch.compile (inductor)" in line and "&lt;b&gt;" in line and "<b>" not in line
    assert "fast 1.25" in line and "slow 1.12" in line


def test_the_run_page_shows_the_runs_tally_kept_plan_and_what_was_dropped_and_why(served):
    """Issue 46: the run's one count (``compiler.search.tally``, recorded with the plan) on the run page and in
    /api/runs/{id}: kept and the plan's speedup beside the best single candidate, each dropped one with why."""
    from compiler.plan.writer import record_baseline
    from compiler.search.tally import Tally

    _, client, writer, s, _ = served
    rid = s.runs[0]
    t = Tally(tried=9, correct=7, fast_passed=3, accepted=3, kept=1, plan_speedup=1.111, best_single=1.2,
              dropped=(("k-<i>x</i>", "overrides an op of a faster accepted candidate"), ("config-1", "superseded")))
    record_baseline(writer, rid, {"fast": 1.2, "slow": 1.111, "baseline": "the step"}, t.to_dict())
    api = client.get(f"/api/runs/{rid}").json()
    assert (api["kept"], api["plan_speedup"]) == (1, 1.111)
    html = client.get(f"/runs/{rid}").text
    bar = re.search(r'<div class="progress".*?</div>', html, re.S).group(0)
    assert '<span class="p-kept">1</span>' in bar and '<span class="p-plan">1.111x</span>' in bar
    assert "best single" in bar
    dropped = html[html.index('id="dropped"'):]
    assert "Accepted, not kept (2)" in dropped and "k-&lt;i&gt;x&lt;/i&gt;" in dropped and "superseded" in dropped
