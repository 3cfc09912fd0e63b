"""Issue 46: before a run starts anything, the engines' start-up is estimated (what this machine measured
before, else a lower bound from an engine's floor and its weights) and a budget that leaves less is refused
with the estimate: one line, exit 2, nothing written. A run that judged no candidate says so."""

from __future__ import annotations

import json
import types
from pathlib import Path

import pytest

from compiler import cli
from compiler.commands import optimize as cmd_optimize
from compiler.search import loop
from compiler.search import startup_estimate as se
from compiler.search.budget import Budget

ROOT = Path(__file__).resolve().parents[2]
CONV = str(ROOT / "examples" / "traffic" / "azure2023_conv.csv")


def _cfg(model: str, budget_s: float, out: Path) -> loop.OptimizeConfig:
    return loop.OptimizeConfig(model=model, hw="h200", traffic=CONV, out=str(out), budget_s=budget_s,
                               wall_s=budget_s, device="cpu", max_points=2)


def _optimize(model: str, budget: str, out: Path) -> int:
    return cli.main(["optimize", "--model", model, "--hw", "h200", "--traffic", CONV, "--budget", budget,
                     "--device", "cpu", "--agents", "offline:2", "--max-points", "2", "--out", str(out), "--quiet"])


def test_records_are_kept_per_key_atomically_and_a_lower_bound_never_hides_a_measurement(tmp_path, monkeypatch):
    monkeypatch.delenv("TKCC_STARTUP_FILE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert se.cache_path() == tmp_path / "tkcc" / "startup.json"
    dev = {"kind": "cpu", "name": "x86_64"}
    k, other = se.key("tiny-dense", dev, [0], [0, 1]), se.key("tiny-dense", dev, [0], [0, 1, 2])
    assert k != other and k != se.key("tiny-dense", dev, [0], [0, 1], weights="/ckpt")
    assert se.estimate(k, "cpu", [10 ** 6])[1].startswith("they need at least")
    se.record(k, 41.26)
    se.record(k, 500.0, ready=False)            # a later run not ready after 500 s: the measurement stays
    se.record(other, 90.0, ready=False)
    doc = json.loads(se.cache_path().read_text())
    assert doc[k]["seconds"] == 41.3 and doc[k]["ready"] and doc[other] == {**doc[other], "ready": False}
    assert [p.name for p in se.cache_path().parent.iterdir()] == ["startup.json"]      # no temporary left
    seconds, basis = se.estimate(k, "cpu", [10 ** 6])
    assert seconds == pytest.approx(41.3) and "took 41 s on this machine" in basis
    assert "were not ready after 90 s" in se.estimate(other, "cpu", [10 ** 6])[1]


def test_fallback_is_the_floor_plus_the_slower_tiers_weights():
    assert se.fallback_s("cpu", [0]) == se.FLOOR_S["cpu"]
    assert se.fallback_s("cpu", [13 * 10 ** 7, 26 * 10 ** 7]) == pytest.approx(se.FLOOR_S["cpu"] + 2.0)
    assert se.fallback_s("cuda", [10 ** 11]) == se.FLOOR_S["cuda"]


def test_a_recorded_start_up_longer_than_the_budget_gives_is_refused_before_anything_starts(tmp_path, capsys):
    cfg = _cfg("tiny-dense", 60.0, tmp_path / "p")
    se.record(loop.startup_key(cfg, loop.gather_inputs(cfg)), 500.0)
    assert _optimize("tiny-dense", "1m", tmp_path / "p") == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("tkcc optimize: --budget 1m leaves "), err
    assert "to start the engines; they took 500 s on this machine" in err[0] and "give --budget 12m or more" in err[0]
    assert Budget(12 * 60.0, 0.0).search_end >= 500 + 60 > Budget(11 * 60.0, 0.0).search_end
    assert not (tmp_path / "p").exists()        # no board, no plan


def test_with_nothing_measured_the_lower_bound_refuses_only_what_cannot_fit(tmp_path, capsys):
    assert _optimize("llama-1b", "20s", tmp_path / "p") == 2      # 10 s left; 8 layers on a CPU need more
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "they need at least" in err[0] and "GB of weights" in err[0], err
    assert not (tmp_path / "p").exists()
    # the demo (compiler/demo.py: tiny-dense, --budget 3m on CPU) is not refused on the rule
    cfg = _cfg("tiny-dense", 180.0, tmp_path / "d")
    assert loop.startup_check(cfg, loop.gather_inputs(cfg), Budget(180.0)) < 10


def test_the_fleets_start_up_is_recorded_and_a_start_not_ready_in_time_as_a_lower_bound(tmp_path, monkeypatch):
    from persistent_engine import EngineStartError

    monkeypatch.setattr(loop, "start_fleet", lambda cfg, fleet_cfg: "fleet")
    assert loop._start_within(None, None, Budget(60.0), "k") == "fleet"
    assert json.loads(se.cache_path().read_text())["k"]["ready"] is True

    def not_ready(cfg, fleet_cfg):
        raise EngineStartError("engine not ready within 3 s")
    monkeypatch.setattr(loop, "start_fleet", not_ready)
    with pytest.raises(se.BudgetError, match="not ready within the run's budget"):
        loop._start_within(None, types.SimpleNamespace(start_timeout_s=3.0), Budget(0.5), "slow")
    assert json.loads(se.cache_path().read_text())["slow"]["ready"] is False


def test_a_run_that_judged_no_candidate_warns_and_says_so_in_its_summary(tmp_path, monkeypatch, capsys):
    seen = {}
    plan = types.SimpleNamespace(run={"tried": 0})
    monkeypatch.setattr(loop, "optimize", lambda cfg: types.SimpleNamespace(plan=plan, plan_dir=tmp_path,
                                                                           interrupted=False))
    monkeypatch.setattr(cmd_optimize, "_summary", lambda vdir, p, as_json, **extra: seen.update(extra))
    assert _optimize("tiny-dense", "1m", tmp_path / "p") == 0
    assert "no candidate was judged within --budget 1m" in seen["warning"] and seen["judged"] == 0
    assert "tkcc optimize: warning: no candidate was judged" in capsys.readouterr().err


def test_a_run_whose_agents_had_nothing_new_says_so_not_that_the_budget_was_short(tmp_path, monkeypatch, capsys):
    seen = {}
    exhausted = [{"name": "offline-kernel-0", "stopped": "exhausted"}, {"name": "config-search", "stopped": "exhausted"}]
    plan = types.SimpleNamespace(run={"tried": 0, "agent_reports": exhausted})
    monkeypatch.setattr(loop, "optimize", lambda cfg: types.SimpleNamespace(plan=plan, plan_dir=tmp_path,
                                                                           interrupted=False))
    monkeypatch.setattr(cmd_optimize, "_summary", lambda vdir, p, as_json, **extra: seen.update(extra))
    assert _optimize("tiny-dense", "3m", tmp_path / "p") == 0
    assert "the agents had nothing new to propose" in seen["warning"] and "--fresh" in seen["warning"]
    assert "start-up" not in capsys.readouterr().err
