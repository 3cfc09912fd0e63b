"""The UI driven by a real headless Chromium (Debian ``chromium``, via the ``playwright`` package):
the optimization list, sorting, filtering and paging, a detail page with code and measurements,
hostile text shown as text, and live progress of a running run. The UI is served by uvicorn on
127.0.0.1 over a board filled through the Board API. Skipped only when no chromium binary exists."""

from __future__ import annotations

import os
import shutil

import pytest

from bulletin_board import Board
from compiler.ui import UIConfig, UIServer
from compiler.ui.sample import HOSTILE, SampleSpec, fill_board

CHROMIUM = os.environ.get("TKCC_CHROMIUM") or "/usr/bin/chromium"
pytestmark = pytest.mark.skipif(not (os.path.exists(CHROMIUM) or shutil.which("chromium")),
                                reason="no chromium binary (scripts/test_services.sh install)")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
        "--disable-sync", "--no-first-run"]


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    from playwright.sync_api import sync_playwright

    url = f"sqlite:///{tmp_path_factory.mktemp('ui-browser') / 'board.db'}"
    writer = Board(url)
    sample = fill_board(writer, SampleSpec(hostile=True, ideas=60, evaluations=150, seed=3))
    with UIServer(UIConfig(board=url, poll_ms=250)) as server, sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM if os.path.exists(CHROMIUM)
                                     else shutil.which("chromium"), args=ARGS)
        yield server, browser, writer, sample
        browser.close()
    writer.close()


@pytest.fixture
def page(site):
    server, browser, *_ = site
    ctx = browser.new_context(base_url=server.url, viewport={"width": 1280, "height": 900})
    pg = ctx.new_page()
    pg.dialogs = []
    pg.errors = []
    pg.on("dialog", lambda d: (pg.dialogs.append(d.message), d.dismiss()))
    pg.on("pageerror", lambda e: pg.errors.append(str(e)))
    yield pg
    ctx.close()


def column(page, css: str) -> list[str]:
    return page.locator(f"#optimizations tbody td.{css}").all_inner_texts()


def ids(page) -> list[int]:
    return [int(x) for x in page.eval_on_selector_all("#optimizations tbody tr[data-id]",
                                                      "els => els.map(e => e.dataset.id)")]


def speedups(page) -> list[float]:
    return [float(t.rstrip("x")) for t in column(page, "speedup")]


def test_list_shows_the_optimizations(page, site):
    _, _, writer, _ = site
    page.goto("/optimizations")
    total = writer.list_optimizations(limit=1).total
    best = writer.list_optimizations(sort="-speedup", limit=50).items
    assert page.locator("#optimizations tbody tr").count() == min(total, 50)
    assert ids(page) == [o.id for o in best]
    assert column(page, "name") == [o.name for o in best]
    assert f"{total} rows" in page.locator(".pager .where").inner_text()


def test_sorting_by_clicking_the_headers(page):
    page.goto("/optimizations?sort=date")
    page.click("a.sort[data-sort=speedup]")
    page.wait_for_url("**sort=-speedup**")
    got = speedups(page)
    assert got == sorted(got, reverse=True) and len(got) > 5
    page.click("a.sort[data-sort=speedup]")             # again: ascending
    page.wait_for_url("**sort=speedup**")
    got = speedups(page)
    assert got == sorted(got)
    page.click("a.sort[data-sort=agent]")
    page.wait_for_url("**sort=-agent**")
    agents = column(page, "agent")
    assert agents == sorted(agents, reverse=True) and len(set(agents)) > 1
    page.click("a.sort[data-sort=op]")
    page.wait_for_url("**sort=-op**")
    assert "op ↓" in page.locator("a.sort.on").inner_text()


def test_filtering_with_the_form(page, site):
    _, _, writer, sample = site
    page.goto("/optimizations")
    page.select_option("select[name=status]", "active")
    page.select_option("select[name=op]", "rms_norm")
    page.select_option("select[name=deployment]", str(sample.deployments[0]))
    page.click("form.filters button[type=submit]")
    page.wait_for_url("**op=rms_norm**")
    want = writer.list_optimizations(deployment=sample.deployments[0], status="active", op="rms_norm",
                                     sort="-speedup", limit=50).items
    assert want, "the sample has active rms_norm optimizations"
    assert ids(page) == [o.id for o in want]
    assert set(column(page, "op")) == {"rms_norm"}
    assert page.locator("select[name=op]").input_value() == "rms_norm"     # the form keeps the filter


def test_paging_forward_and_back(page, site):
    _, _, writer, _ = site
    total = writer.list_optimizations(limit=1).total
    page.goto("/optimizations?n=10&sort=-date")
    first = ids(page)
    page.click(".pager a[rel=next]")
    page.wait_for_url("**page=2**")
    second = ids(page)
    assert len(first) == 10 and second and not set(first) & set(second)
    assert f"page 2 of {-(-total // 10)}" in page.locator(".pager .where").inner_text()
    assert second == [o.id for o in writer.list_optimizations(sort="-date", limit=10, offset=10).items]
    page.click(".pager a[rel=prev]")
    page.wait_for_url(lambda u: "page=" not in u)
    assert ids(page) == first


def test_detail_page_shows_code_and_measurements(page, site):
    _, _, writer, _ = site
    top = writer.list_optimizations(sort="-speedup", limit=1).items[0]
    page.goto("/optimizations")
    page.click(f"#optimizations tbody tr[data-id='{top.id}'] td.name a")
    page.wait_for_url(f"**/optimizations/{top.id}")
    code = page.locator("#code")
    assert code.is_visible()
    assert code.inner_text().strip() == writer.get_candidate(top.candidate_id).source.strip()
    assert code.locator("span.k").count() > 5                          # highlighted
    points = page.locator("#points tbody tr")
    assert points.count() == len(top.per_point) == 4
    assert f"{top.per_point[1]['fast']:.3f}x" in points.nth(1).inner_text()
    tiers = page.locator("#tiers tbody").inner_text()
    assert f"{top.speedup_fast:.3f}x" in tiers and f"{top.speedup_slow:.3f}x" in tiers
    assert page.locator("table.measurements").count() == 2          # fast and slow tier, per point
    assert "baseline ms" in page.locator("table.measurements").first.inner_text()
    assert page.locator(".idea h3").count() == 1                     # the idea thread behind it
    assert not page.errors


def test_hostile_text_is_shown_as_text(page, site):
    _, _, writer, sample = site
    for path in (f"/optimizations/{sample.hostile_optimization}", f"/ideas/{sample.hostile_idea}",
                 f"/ideas?run={sample.runs[0]}&sort=id", f"/optimizations?agent=agent%20{HOSTILE}"):
        page.goto(path)
        page.wait_for_load_state("load")
        shown = page.locator("table.grid tbody, .idea, #code").get_by_text(HOSTILE, exact=False)
        assert shown.count() >= 1 and shown.first.is_visible(), path
        scripts = page.eval_on_selector_all("script", "els => els.map(e => e.src || e.textContent)")
        assert scripts == [page.url.split("/", 3)[0] + "//" + page.url.split("/")[2] + "/static/ui.js"], scripts
    page.goto(f"/optimizations/{sample.hostile_optimization}")
    assert HOSTILE in page.locator("#code").inner_text()             # in the code body
    assert f"agent {HOSTILE}" in page.locator(".meta .author").first.inner_text()   # the author
    assert HOSTILE in page.locator(".idea h3").inner_text()           # the idea title
    page.wait_for_timeout(300)
    assert page.dialogs == [] and not page.errors


def test_running_run_progress_updates_live(page, site):
    from playwright.sync_api import expect

    _, _, writer, sample = site
    run = sample.runs[-1]
    writer.update_run(run, status="running", message="searching", candidates_tried=5)
    page.goto(f"/runs/{run}")
    bar = page.locator(f".progress[data-run-id='{run}']")
    assert bar.locator(".p-tried").inner_text() == "5"
    writer.update_run(run, message="composing", candidates_tried=123, best_speedup=1.987)
    expect(bar.locator(".p-tried")).to_have_text("123", timeout=15000)     # polled, no reload
    assert bar.locator(".p-phase").inner_text() == "composing"
    assert bar.locator(".p-best").inner_text() == "1.987x"
    writer.update_run(run, status="done", message="done")
    expect(bar).to_have_attribute("data-status", "done", timeout=15000)
    assert bar.locator(".status").inner_text() == "done"
    assert float(bar.locator("progress").get_attribute("value") or 0) >= 0 and not page.errors


def test_lineage_is_navigable_from_the_run_page_to_parent_and_child(page, site):
    _, _, writer, sample = site
    run = sample.runs[0]
    edge = writer.lineage(run)[0]
    page.goto(f"/runs/{run}")
    rows = page.locator("#lineage tbody tr")
    assert rows.count() == len(writer.lineage(run))
    first = rows.nth(0).inner_text()
    assert edge["parent_author"] in first and edge["child_author"] in first
    page.click(f'#lineage a[href="/candidates/{edge["child"]}"]')
    page.wait_for_url(f"**/candidates/{edge['child']}")
    page.click("#lineage a.parent")
    page.wait_for_url(f"**/candidates/{edge['parent']}")
    assert f'/candidates/{edge["child"]}' in page.locator("#lineage").inner_html()
    page.goto(f"/runs/{run}")
    agents = page.locator("#agents tbody tr")
    claude = [t for t in agents.all_inner_texts() if t.startswith("claude-1")]
    assert claude and "$0.2940" in claude[0] and not page.errors


def test_a_cpu_run_for_h200_is_named_projected_and_measured_and_a_setting_not_better_says_so(page, site):
    import json

    _, _, writer, _ = site
    run = writer.create_run("tiny-dense", "h200", "cpu-run-traffic",
                            config={"budget_s": 60, "device": "cpu", "device_name": "x86_64", "matches_hw": False})
    idea = writer.post_idea(run, author="config-0", title="config{max_num_seqs=8}", target="config", tags=["config"])
    claimed = writer.claim_idea(run, "config-0", target="config")
    writer.post(run, author="config-0", idea=idea, kind="result", body=json.dumps(
        {"kind": "config", "feasible": False, "gain": 0.981, "status": "not better",
         "why": "trades a figure away (tpot x0.981) or drops requests; score x0.981", "submitted": False}))
    writer.finish_idea(claimed, agent="config-0", status="done")
    cand = writer.add_candidate(run, "config-0", "CONFIG = {'max_num_seqs': 8}\n", idea)
    writer.add_evaluation(cand, "fast", None, {"speedup": 0.981, "accepted": False, "status": "not better",
                                               "decision": "config replay x0.981 does not beat the baseline"},
                          "correct", device="cpu")
    page.goto(f"/runs/{run.id}")
    assert page.locator("table.evals tbody tr").first.locator(".status").all_inner_texts() == ["correct", "not better"]
    assert "tiny-dense projected for h200, measured on cpu" in page.locator("h1").inner_text()
    assert "measured on cpu" in page.locator("#baseline").inner_text()
    page.goto(f"/ideas/{idea.id}")
    assert page.locator(".post .outcome .status").inner_text() == "not better"
    assert page.locator("h3 .status").first.inner_text() == "done"
    page.goto(f"/deployments/{run.deployment_id}")
    assert page.locator("#measured-on").inner_text() == "measured on cpu"
    assert "target hardware h200" in page.locator("p.meta").first.inner_text() and not page.errors
