"""benchmarks/search_vs_random.py without running a search: the row read from a plan.json, the per-model,
per-arm summary (mean and min-max over seeds) and its table on synthetic plans, the optimize command each
arm runs, and one line with exit 2 on a bad command line."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "search_vs_random.py"
spec = importlib.util.spec_from_file_location("search_vs_random_under_test", SCRIPT)
svr = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = svr
spec.loader.exec_module(svr)


def _plan(slow, fast, tried, accepted, kept, ops=("linear",)):
    return {"plan_speedup": {"slow": slow, "fast": fast, "per_point": []},
            "optimizations": [{"name": f"o{i}", "targets": [op], "author": f"a{i}"} for i, op in enumerate(ops[:kept])],
            "baseline": {"noise": {"fast": 0.01, "slow": 0.05}},
            "run": {"tried": tried, "phases_s": {"searching": 60.0},
                    "counts": {"tried": tried, "correct": tried, "fast_passed": accepted, "accepted": accepted,
                               "kept": kept, "dropped": [{"name": "x", "why": "no gain when composed"}]}}}


def _rows():
    return [svr.row_of(_plan(1.20, 1.3, 10, 3, 1), model="tiny-dense", arm="offline", seed=0, rc=0, wall_s=190),
            svr.row_of(_plan(1.10, 1.2, 8, 2, 1), model="tiny-dense", arm="offline", seed=1, rc=0, wall_s=190),
            svr.row_of(_plan(1.0, 1.0, 9, 0, 0, ops=()), model="tiny-dense", arm="random", seed=0, rc=0, wall_s=190),
            svr.row_of(_plan(1.05, 1.1, 7, 1, 1, ops=("silu_and_mul",)), model="tiny-dense", arm="random", seed=1,
                       rc=0, wall_s=190),
            svr.row_of(None, model="tiny-dense", arm="random", seed=2, rc=2, wall_s=80, error="engine not ready")]


def test_rows_read_the_plan_and_an_empty_plan_runs_the_baseline():
    rows = _rows()
    assert rows[0] == {"model": "tiny-dense", "arm": "offline", "seed": 0, "rc": 0, "wall_s": 190, "ok": True,
                       "speedup_slow": 1.2, "speedup_fast": 1.3, "judged": 10, "correct": 10, "fast_passed": 3,
                       "accepted": 3, "kept": 1, "noise_fast": 0.01, "noise_slow": 0.05, "search_s": 60.0,
                       "kept_ops": ["linear"], "kept_authors": ["a0"], "dropped": ["no gain when composed"]}
    empty = svr.row_of(_plan(None, None, 9, 0, 0, ops=()), model="m", arm="random", seed=0, rc=0, wall_s=1)
    assert empty["speedup_slow"] == empty["speedup_fast"] == 1.0 and empty["kept"] == 0
    assert rows[4]["ok"] is False and rows[4]["error"] == "engine not ready"


def test_summary_gives_mean_and_spread_per_model_and_arm_leaving_out_failed_runs():
    summary = {(s["model"], s["arm"]): s for s in svr.summarize(_rows())}
    off, rnd = summary["tiny-dense", "offline"], summary["tiny-dense", "random"]
    assert off["speedup_slow_mean"] == pytest.approx(1.15)
    assert (off["speedup_slow_min"], off["speedup_slow_max"]) == (1.1, 1.2)
    assert off["judged_mean"] == 9 and off["accepted_mean"] == 2.5 and off["failed"] == 0 and off["runs"] == 2
    assert rnd["runs"] == 3 and rnd["failed"] == 1 and rnd["speedup_slow_mean"] == pytest.approx(1.025)
    assert rnd["kept_mean"] == 0.5
    only_failed = svr.summarize([_rows()[4]])[0]
    assert only_failed["speedup_slow_mean"] is None and only_failed["judged_mean"] is None


def test_table_has_a_row_per_run_and_per_model_and_arm():
    rows = _rows()
    text = svr.format_table(rows, svr.summarize(rows))
    lines = text.splitlines()
    assert len(lines) == 1 + len(rows) + 2 + 2
    assert "1.200" in lines[1] and "linear" in lines[1] and "1.0%" in lines[1]
    assert "failed" in lines[5] and "engine not ready" in lines[5]
    assert "1.100-1.200" in text and "1.000-1.050" in text and "(1 failed)" in text


def test_each_arm_runs_optimize_with_its_agents_into_its_own_out(tmp_path):
    args = svr.parse_args(["--models", "tiny-dense", "--budget", "90s", "--agents", "3"])
    cmd = svr.optimize_command(args, "tiny-dense", "random", tmp_path / "r")
    assert cmd[1:4] == ["-m", "compiler", "optimize"] and "--fresh" in cmd
    assert cmd[cmd.index("--agents") + 1] == "random:3" and cmd[cmd.index("--out") + 1] == str(tmp_path / "r")
    assert cmd[cmd.index("--hw") + 1] == "cpu" and args.budget_s == 90 and args.seeds == [0, 1, 2]
    assert "--max-points" not in cmd and "--aa-runs" not in cmd                  # optimize's own defaults
    lean = svr.optimize_command(svr.parse_args(["--max-points", "1", "--aa-runs", "2"]), "tiny-moe", "offline",
                                tmp_path / "o")
    assert lean[lean.index("--max-points") + 1] == "1" and lean[lean.index("--aa-runs") + 1] == "2"
    assert lean[lean.index("--agents") + 1] == "offline:4"
    (tmp_path / "r" / "v1").mkdir(parents=True)
    (tmp_path / "r" / "v2").mkdir()
    (tmp_path / "r" / "v1" / "plan.json").write_text(json.dumps({"v": 1}))
    (tmp_path / "r" / "v2" / "plan.json").write_text(json.dumps({"v": 2}))
    assert svr.newest_plan(tmp_path / "r") == {"v": 2} and svr.newest_plan(tmp_path / "none") is None


@pytest.mark.parametrize("argv, says", [
    (["--device", "tpu"], "--device must be cpu or cuda"),
    (["--seeds", "1,x"], "--seeds must be comma-separated integers"),
    (["--models", "no-such-model"], "unknown model 'no-such-model'"),
    (["--budget", "soon"], "--budget: bad duration"),
    (["--agents", "0"], "--agents must be at least 1"),
    (["--max-points", "0"], "--max-points must be at least 1"),
    (["--traffic", "/nonexistent.csv"], "no such file"),
    (["--frobnicate"], "unrecognized arguments"),
])
def test_a_bad_argument_is_one_line_and_exit_2(argv, says, capsys):
    assert svr.main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and says in err and err.startswith("search_vs_random: error:")


def test_as_a_script_a_bad_argument_exits_2_without_a_traceback():
    r = subprocess.run([sys.executable, str(SCRIPT), "--seeds", "x"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "Traceback" not in r.stderr and r.stderr.count("\n") == 1
