"""benchmarks/judge_breakdown.py on CPU: one judged cycle, its round trips counted per request kind and read
back from its JSON (the batched verification: one op_checks request per op and seed, one steps request)."""

import importlib.util
import json
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "judge_breakdown.py"
spec = importlib.util.spec_from_file_location("judge_breakdown_under_test", SCRIPT)
jb = importlib.util.module_from_spec(spec)
sys.modules[spec.name] = jb
spec.loader.exec_module(jb)


def test_probe_counts_time_and_bytes_per_phase_and_kind():
    p = jb.Probe()
    p.phase = "verify"
    p.add("rpc steps", 0.5, 10)
    p.add("rpc steps", 0.25, 6)
    assert p.rows["verify"]["rpc steps"] == [2, 0.75, 16] and "rpc steps" not in p.rows["bench"]


@pytest.mark.slow
def test_cpu_cycle_counts_the_batched_round_trips(tmp_path, capsys):
    out = tmp_path / "breakdown.json"
    assert jb.main(["--cycles", "1", "--no-bench", "--settle-s", "0", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    verify = doc["per_phase"]["verify"]
    assert verify["rpc op_checks"]["per_cycle"] == 2            # one op (linear), two seeds: every shape at once
    assert verify["rpc steps"]["per_cycle"] == 1 and verify["rpc guards"]["per_cycle"] == 2
    assert verify["judge: op references"]["per_cycle"] == verify["judge: op outputs compared"]["per_cycle"] > 2
    assert doc["phase_median_s"]["verify"] > 0 and "rpc op_checks" in capsys.readouterr().out
