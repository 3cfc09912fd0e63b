import json
import subprocess
import sys
from pathlib import Path
from persistent_engine.io_struct import WorkloadPoint

ROOT = Path(__file__).resolve().parents[2]


def test_forward_benchmark_runs_on_cpu_and_writes_json(tmp_path):
    out = tmp_path / "cpu-forward.json"
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "forward.py"), "--device", "cpu", "--threads", "1",
                           "--cases", "tiny-dense:all@1", "tiny-moe:0,1@4", "--context", "32", "--samples", "2",
                           "--peak-gbs", "10", "--out", str(out)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    assert "tiny-moe:0,1@4" in proc.stdout and "% of peak" in proc.stdout
    doc = json.loads(out.read_text())
    assert doc["device"] == "cpu" and doc["datasheet_bandwidth_gbs"] == 10 and len(doc["rows"]) == 2
    dense, moe = doc["rows"]
    assert dense["layers"] == [0, 1] and moe["layers"] == [0, 1] and moe["batch"] == 4
    # tiny-dense, batch 1: every weight except the tied embedding's unread rows... tied -> read once as lm_head
    assert dense["bytes_read"]["weights"] > 0 and dense["bytes_read"]["kv"] == 2 * 2 * 2 * 16 * 2 * 33
    for r in doc["rows"]:
        assert r["ms_per_step"] > 0 and r["pct_datasheet"] > 0
        eager = r["timings"]["eager"]                        # FairTimer's two modes; no graph on CPU
        assert r["ms_per_step"] == r["eager_ms"] == eager["back_to_back_ms"] and eager["one_replay_ms"] > 0
        assert r["timings"]["graph"] is None and eager["one_replay_samples"] == 2 and eager["dispatch_ms"] is None
        assert abs(r["achieved_gbs"] - r["bytes_read"]["total"] / r["ms_per_step"] / 1e6) < 1e-6


def test_moe_bytes_count_only_routed_experts():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import forward
    from persistent_engine.models.decoder import build_model
    from persistent_engine.inputs.workloads import make_workload
    model = build_model("tiny-moe", layers=[1])                  # 8 experts, top-2
    one = forward.bytes_read(model, make_workload(model, WorkloadPoint(phase="decode", batch=1, context=8)))
    many = forward.bytes_read(model, make_workload(model, WorkloadPoint(phase="decode", batch=64, context=8)))
    expert = (2 * 32 * 64 + 64 * 32) * 2
    assert many["weights"] - one["weights"] == (8 - 2) * expert + 63 * 64 * 2     # all experts vs 2; embed rows
