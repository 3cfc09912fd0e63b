"""benchmarks/step_kernels.py: the interval arithmetic on hand-made kernel timelines, and a CPU run
(top-level aten ops stand in for kernels) of the reference and a plan, read back from its JSON."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from test_e2e_decode_bench import CORRECT, write_plan

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "step_kernels.py"
spec = importlib.util.spec_from_file_location("step_kernels_under_test", SCRIPT)
sk = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = sk
spec.loader.exec_module(sk)


def test_busy_is_the_union_and_idle_the_gaps_of_each_replay():
    # two replays; in each, k1 and k2 overlap by 2 us, then a 3 us gap, then k3; one stray kernel between
    def replay(t0):
        return [("k1", t0, t0 + 10), ("k2", t0 + 8, t0 + 12), ("k3", t0 + 15, t0 + 20)]
    ivs = replay(0.0) + replay(2000.0) + [("stray", 1000.0, 1001.0)]
    # CUPTI's device-side range of each replay's record_function window (the H200 run of 2026-11-29 counted
    # it as a kernel spanning the whole replay: busy = span, idle 0)
    ivs += [(sk.MARK, -0.5, 25.0), (sk.MARK, 1999.5, 2025.0)]
    windows = [(-1.0, 30.0), (1999.0, 2030.0)]
    assert sk.union_us(replay(0.0)) == 17.0
    assert [len(g) for g in sk.by_window(ivs, windows)] == [3, 3]
    s = sk.summarize(ivs, windows)
    assert (s["steps"], s["kernels"], s["busy_us"], s["span_us"], s["idle_us"]) == (2, 3, 17.0, 20.0, 3.0)
    assert s["top"][0] == {"kernel": "k1", "calls_per_step": 1.0, "us_per_step": 10.0, "us_per_call": 10.0}
    assert [r["kernel"] for r in s["top"]] == ["k1", "k3", "k2"]
    with pytest.raises(RuntimeError, match="the profiler saw kernels in 2 of 3 replays"):
        sk.summarize(ivs, windows + [(5000.0, 5100.0)])


def test_cpu_run_profiles_reference_and_plan(tmp_path):
    vdir = write_plan(tmp_path / "plan", "rms-fp32", CORRECT)
    out = tmp_path / "kernels.json"
    assert sk.main(["--device", "cpu", "--cases", "tiny-dense:all@2/24", "--plan", str(vdir.parent),
                    "--steps", "3", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["cases"]
    assert [r["variant"] for r in rows] == ["reference", "tkcc"] and rows[1]["plan"] == str(vdir)
    for r in rows:
        assert r["steps"] == 3 and r["kernels"] > 10 and 0 < r["busy_us"] <= r["span_us"]
        assert 0 <= r["idle_us"] < r["span_us"]
        assert r["floor_us"] > 0 and any(k["kernel"] == "aten::linear" for k in r["top"])
        # the step profile per op: every kernel matched to its op, the replay's time beside the sync-timed one
        assert r["per_op_matched"] == 1.0 and r["per_op"]["attention_decode"]["kernels"] >= 2
        assert all("sync_ms" in row for row in r["per_op"].values())


def test_bad_case_is_one_line_and_exit_2(capsys):
    assert sk.main(["--device", "cpu", "--cases", "no-such-model:all@1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("step_kernels: unknown model 'no-such-model'") and err.count("\n") == 1
