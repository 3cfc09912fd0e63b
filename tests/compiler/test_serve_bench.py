"""``tkcc bench serve`` against a live ``tkcc serve`` (tiny-dense, CPU): measured TTFT/TPOT/ITL,
goodput, and the replay model's prediction for the same requests with its error."""

import json
import subprocess
import sys

import pytest

from compiler.serve import ServeServer
from compiler.serve_runtime import ServeOptions, build_runtime

TRACE = "examples/traffic/azure2023_conv.parquet"


@pytest.fixture(scope="module")
def server():
    with ServeServer(build_runtime(ServeOptions(model="tiny-dense", device="cpu", max_model_len=128))) as s:
        yield s


def _bench(*args):
    return subprocess.run([sys.executable, "-m", "compiler", "bench", "serve", "--traffic", TRACE, *args],
                          capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_bench_serve_json_and_prediction(server):
    r = _bench("--url", server.url + "/v1", "--rate", "8", "--max-requests", "8", "--max-input", "32",
               "--max-output", "6", "--json")
    assert r.returncode == 0, r.stderr
    res = json.loads(r.stdout)
    assert res["requests"] == 8 and res["completed"] == 8 and res["failed"] == 0
    assert res["output_tokens"] == sum(min(6, o) for o in (44, 109, 55, 16, 16, 84, 142, 84))
    for k in ("ttft_ms", "tpot_ms", "itl_ms"):
        assert all(res[k][q] is not None and res[k][q] >= 0 for q in ("p50", "p90", "p99"))
    assert res["output_tokens_per_s"] > 0 and 0 <= res["sla_attainment"] <= 1
    pred = res["predicted"]
    assert pred["ttft_ms"]["p50"] > 0 and pred["tpot_ms"]["p50"] > 0
    assert pred["scheduler"] == {"max_num_seqs": 64, "max_num_batched_tokens": 2048}   # read from the server
    assert all(isinstance(v, float) for v in pred["error"].values())
    assert "requests" in r.stderr                                           # the progress bar


@pytest.mark.slow
def test_bench_serve_table(server):
    r = _bench("--url", server.url, "--rate", "8", "--max-requests", "4", "--max-input", "16", "--max-output", "4")
    assert r.returncode == 0, r.stderr
    assert "TTFT" in r.stdout and "goodput" in r.stdout and "replay model" in r.stdout and "%" in r.stdout


def test_bench_serve_unreachable_server_is_one_line():
    r = _bench("--url", "http://127.0.0.1:9", "--no-predict")
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1 and "Traceback" not in r.stderr
