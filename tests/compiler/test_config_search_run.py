"""Config search and memory across runs in real optimize runs (CPU, real engines): a tiny Llama on the
bundled Azure code trace accepts an engine/scheduler setting with its projected TTFT/TPOT effect, has
config ideas on its board, records the search's throughput, and ``tkcc plan apply`` applies the setting;
a continued run into the same plan root judges none of the first run's candidates again and keeps the
setting it accepted."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from bulletin_board import Board
from compiler.search.loop import OptimizeConfig, optimize

ROOT = Path(__file__).resolve().parents[2]
CODE = str(ROOT / "examples" / "traffic" / "azure2023_code.csv")

pytestmark = pytest.mark.slow


def _run(out: Path, search_s: float):
    return optimize(OptimizeConfig(model="llama-1b+tiny", hw="h200", traffic=CODE, out=str(out), budget_s=search_s,
                                   agents="offline:2", device="cpu", max_points=2, aa_runs=1, quiet=True))


def _consistent(throughput: dict) -> None:
    assert throughput["engines"], throughput
    for e in throughput["engines"].values():
        parts = e["executor_wait_s"] + e["compile_s"] + e["judging_s"] + e["other_s"] + e["idle_s"]
        assert parts == pytest.approx(e["wall_s"], abs=0.05)
        assert min(e["queue_wait_s"], e["judging_s"], e["idle_s"]) >= 0


def _judged(board: Board, run: int) -> set[str]:
    """Source hashes of the run's candidates with a verdict (a row "not judged" is the clock's, not theirs)."""
    hashes = {c.id: c.source_hash for c in board.list_candidates(run, limit=1000).items}
    return {hashes[e.candidate_id] for e in board.list_evaluations(run, tier="fast", limit=1000).items
            if (e.metrics or {}).get("status") != "not judged"}


@pytest.fixture(scope="module")
def first(tmp_path_factory):
    out = tmp_path_factory.mktemp("cfg") / "plan"
    result = _run(out, 40.0)
    board = Board(f"sqlite:///{out / 'board.db'}")
    yield out, result, board
    board.close()


@pytest.mark.timeout(1200)
def test_every_run_searches_configs_and_one_is_accepted_applied_and_measured(first):
    out, result, board = first
    config_ideas = board.list_ideas(1, target="config", limit=500).items
    assert config_ideas and all(i.title.startswith("config{") for i in config_ideas)

    plan = json.loads((result.plan_dir / "plan.json").read_text())
    configs = [o for o in plan["optimizations"] if o.get("projected")]
    assert configs, [o["name"] for o in plan["optimizations"]]
    p = configs[0]["projected"]
    assert p["tpot_mean_ms"]["before"] > 0 and p["ttft_mean_ms"]["after"] > 0 and p["tokens_per_s"]["after"] > 0
    assert max(p["ratios"].values()) > 1.01 and min(p["ratios"].values()) >= 0.98
    run = plan["run"]
    assert run["candidates_per_hour"] > 0 and 0 <= run["device_busy_fraction"] <= 1
    _consistent(run["throughput"])
    assert "Search throughput" in (result.plan_dir / "report.md").read_text()
    assert board.get_run(1).config["throughput"] == run["throughput"]

    applied = subprocess.run([sys.executable, "-m", "compiler", "plan", "apply", "--plan", str(result.plan_dir),
                              "--device", "cpu", "--json"], capture_output=True, text=True, timeout=600)
    assert applied.returncode == 0, applied.stderr[-2000:]
    doc = json.loads(applied.stdout)
    knobs = set(configs[0]["description"].split(":")[0].replace(" ", "").split(","))
    assert doc["config"] and {f"{k}={v}" for k, v in doc["config"].items() if k != "cuda_graph_batch_sizes"} <= knobs


@pytest.mark.timeout(1200)
def test_a_continued_run_judges_no_candidate_twice_and_keeps_the_accepted_setting(first):
    out, result, board = first
    plan = json.loads((result.plan_dir / "plan.json").read_text())
    second = _run(out, 15.0)                             # continues from v1: its plan's candidates are seeds
    judged = _judged(board, 1)                   # a candidate the first run's end cut is judged again: left out
    again = {c.source_hash for c in board.list_candidates(2, limit=1000).items}
    assert judged and not (judged & again)
    plan2 = json.loads((second.plan_dir / "plan.json").read_text())
    assert plan2["run"]["remembered"] >= len(plan["optimizations"])
    assert [o["name"] for o in plan2["optimizations"] if o.get("projected")]
