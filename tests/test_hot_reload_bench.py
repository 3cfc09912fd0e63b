"""benchmarks/hot_reload.py on CPU: cold starts, a few hot-reload cycles on sandboxed executors, and the
comparison with the in-process figure from before the judge/executor split, read back from its JSON."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "hot_reload.py"
spec = importlib.util.spec_from_file_location("hot_reload_under_test", SCRIPT)
hr = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = hr
spec.loader.exec_module(hr)


def test_comparison_with_before_names_each_phase_and_the_targets():
    vb = hr.compare_with_before({"load_s": 0.02, "verify_s": 0.2, "bench_s": 0.5, "unload_s": 0.01}, 0.8, 0.05)
    assert set(vb["phases"]) == set(hr.BEFORE["phase_s"])
    assert vb["phases"]["verify_s"]["delta_s"] == pytest.approx(0.2 - hr.BEFORE["phase_s"]["verify_s"])
    assert vb["cycle_delta_s"] == pytest.approx(0.8 - hr.BEFORE["cycle_s"]) and vb["pool_wait_median_s"] == 0.05
    assert vb["targets"] == {"cycle_under_1s": True, "at_least_3600_per_hour": True}
    assert not hr.compare_with_before({}, 1.2, 0.0)["targets"]["cycle_under_1s"]


def test_losers_are_mixed_in_and_the_stops_are_counted():
    names = [n for n, _ in hr.candidates(6, triton=False, loser_every=3)]
    assert names.count("torch linear (loser)") == 2 and names[2] == names[5] == "torch linear (loser)"
    assert "loser" not in " ".join(n for n, _ in hr.candidates(6, triton=False))
    pt = lambda stopped, n, affected=True: {"affected": affected, "samples": n, "stopped": stopped}   # noqa: E731
    rows = [{"bench_s": 0.1, "points": [pt("futility", 6), pt("futility", 6), pt("", 0, affected=False)]},
            {"bench_s": 0.5, "points": [pt("settled", 20), pt("", 50)]},
            {"bench_s": 0.3, "points": [pt("futility", 10), pt("settled", 25)]}]
    st = hr.stops_summary(rows)
    assert (st["points_timed"], st["stopped_futility"], st["stopped_settled"], st["all_samples"]) == (6, 3, 2, 1)
    assert st["median_pairs_futility"] == 6 and st["median_pairs"] == 15
    assert st["cycles_with_a_futility_stop"] == 2 and st["bench_median_s_with_a_futility_stop"] == pytest.approx(0.2)
    assert st["bench_median_s_without"] == 0.5


@pytest.mark.slow
def test_cpu_run_writes_the_cycles_and_the_split_figures(tmp_path, capsys):
    out = tmp_path / "hot.json"
    assert hr.main(["--device", "cpu", "--cycles", "2", "--cold", "1", "--samples", "3", "--queued", "1",
                    "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert doc["all_correct"] and len(doc["cycles"]) == 2
    # told of the next one, but on CPU the judge compiles nothing ahead by default (AHEAD["cpu"] = 0)
    assert doc["queued"] == 1 and doc["compiled_ahead"] == 0 and not any(r["compiled_ahead"] for r in doc["cycles"])
    assert all(r["executors_used"] >= k + 1 for k, r in enumerate(doc["cycles"]))    # one executor each
    assert doc["sandbox"] and doc["pool_size"] >= 1 and doc["ratio_restart_over_hot"] > 1
    assert doc["vs_before"]["before"]["cycle_s"] == 0.31
    assert doc["stops"]["points_timed"] >= 2 and doc["stops"]["stopped_futility"] == 0    # fixed samples: no stop
    printed = capsys.readouterr().out
    assert "judge/executor split" in printed and "the in-process engine on the H200" in printed
    assert "compiled ahead: 0 of 2 (told the next 1 as queued)" in printed
