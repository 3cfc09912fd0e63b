import json
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "traffic"
CONV, CODE = EXAMPLES / "azure2023_conv.parquet", EXAMPLES / "azure2023_code.csv"


def tkcc(*args):
    return subprocess.run([sys.executable, "-m", "compiler", "traffic", *map(str, args)],
                          capture_output=True, text=True, timeout=120)


def test_profile_json_contract():
    r = tkcc("profile", CODE, "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["rows"] == 8819 and d["duration_s"] == pytest.approx(3435.95, abs=0.01)
    assert d["requests_per_s"] == pytest.approx(2.566, abs=0.001)
    for name in ("input_tokens", "output_tokens"):
        assert {"mean", "p50", "p90", "p99", "max"} <= set(d[name])
    assert d["interarrival_cv"] > 10 and d["prefix_cache_hit_rate"] is None


def test_workload_points_conv_llama_1b_256(tmp_path):
    out = tmp_path / "p.json"
    r = tkcc("profile", CONV, "--json", "--workload", "--model", "llama-1b", "--max-num-seqs", "256",
             "--out", out)
    assert r.returncode == 0, r.stderr
    w = json.loads(r.stdout)["workload"]
    pts = w["points"]
    assert 2 <= len(pts) <= 16 and w["scheduler"]["max_num_seqs"] == 256
    assert sum(p["weight"] for p in pts) == pytest.approx(1.0, abs=1e-4)
    assert all(set(p) == {"phase", "batch", "context", "chunk", "weight"} for p in pts)
    assert all(1 <= p["batch"] <= 256 for p in pts) and {p["phase"] for p in pts} == {"decode", "prefill"}
    # the checked-in example points are what the CLI prints
    saved = json.loads((EXAMPLES / "azure2023_conv_llama-1b_points.json").read_text())
    assert saved["points"] == pts
    table = tkcc("profile", CONV, "--workload", "--model", "llama-1b")
    assert table.returncode == 0 and "workload points" in table.stdout and "decode" in table.stdout
    assert json.loads(out.read_text())["kind"] == "tkcc.traffic_profile"


def test_diff_exit_codes(tmp_path):
    saved = tmp_path / "code.json"
    assert tkcc("profile", CODE, "--out", saved).returncode == 0
    r = tkcc("diff", saved, CONV, "--json")
    assert r.returncode == 1, r.stderr
    d = json.loads(r.stdout)
    assert d["drift"] is True
    assert all({"name", "statistic", "threshold", "drifted"} <= set(f) for f in d["features"])
    same = tkcc("diff", CONV, EXAMPLES / "azure2023_conv.csv")
    assert same.returncode == 0 and "no drift" in same.stdout


def test_bad_input_is_one_line_exit_2(tmp_path):
    bad = tmp_path / "bad.csv"
    bad.write_text("timestamp,input_tokens,output_tokens\n0,5,1\n1,-3,2\n")
    for args in (("profile", bad), ("diff", CODE, bad), ("profile", tmp_path / "missing.csv"),
                 ("profile", CONV, "--workload")):
        r = tkcc(*args)
        assert r.returncode == 2, (args, r.stderr)
        assert "Traceback" not in r.stderr and len(r.stderr.strip().splitlines()) == 1
    assert "row 2 (line 3): input_tokens is negative" in tkcc("profile", bad).stderr
