"""benchmarks/kda_ops.py at toy shapes on CPU: the Triton template (interpreted) agrees with the reference, the
peer table is read, the JSON is written."""

import importlib.util
import json
import os
import pathlib

BENCH = pathlib.Path(__file__).parents[1] / "benchmarks" / "kda_ops.py"


def _bench():
    spec = importlib.util.spec_from_file_location("kda_ops", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_tiny_run_checks_the_template_and_writes_rows(tmp_path, monkeypatch):
    monkeypatch.setenv("TRITON_INTERPRET", os.environ.get("TRITON_INTERPRET", "1"))
    bench, out = _bench(), tmp_path / "kda.json"
    assert bench.main(["--device", "cpu", "--tiny", "--samples", "1", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["batch"] for r in rows] == [1, 3]
    assert all(r["triton_max_err"]["state"] < 1e-4 and r["triton_max_err"]["o"] < 2e-2 for r in rows)
    peer = bench.peer_ms(64)
    assert 0 < peer["fused_recurrent_kda_packed_decode"] < peer["fused_kda_decode"] < 1
