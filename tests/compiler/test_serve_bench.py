"""``tkcc bench serve`` against a live ``tkcc serve`` (tiny-dense, CPU): measured TTFT/TPOT/ITL,
goodput, and the replay model's prediction for the same requests with its error."""

import json
import subprocess
import sys

import pytest

from compiler.serve.openai_app import ServeServer
from compiler.serve.runtime import ServeOptions, build_runtime

TRACE = "examples/traffic/azure2023_conv.parquet"


@pytest.fixture(scope="module")
def server():
    rt = build_runtime(ServeOptions(model="tiny-dense", device="cpu", max_model_len=128))
    with ServeServer(rt) as s:
        s.engine = rt.engine
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


def test_step_time_charges_each_forward_pass_only_when_it_runs():
    from traffic_profiles.workload import StepShape

    from compiler.serve.bench import LinearStepTime

    st = LinearStepTime(a=1e-3, b=1e-4, c=1e-5, p=5e-3)
    assert st(StepShape(4, 100.0)) == pytest.approx(1e-3 + 4e-4)                          # decode pass only
    assert st(StepShape(0, 0.0, ((200, 0),))) == pytest.approx(5e-3 + 2e-3)              # prefill pass only
    assert st(StepShape(4, 100.0, ((100, 0), (100, 50)))) == pytest.approx(1.4e-3 + 7e-3)  # both
    long = LinearStepTime(a=1e-3, b=1e-4, c=1e-5, p=5e-3, d=1e-6)                        # + context
    assert long(StepShape(4, 1000.0)) == pytest.approx(1.4e-3 + 1e-3)


@pytest.mark.slow
def test_runs_draw_fresh_prompts_so_the_prefix_cache_never_hits(server):
    """Two runs of the same trace on one server: no prefix-cache hits unless the seed is fixed."""
    from compiler.serve.bench import BenchOptions, run_bench

    kv = server.engine.kv
    opts = BenchOptions(traffic=TRACE, url=server.url, rate=50, max_requests=3, max_input=40, max_output=2,
                        predict=False)
    hits0 = kv.hit_tokens
    run_bench(opts)
    run_bench(opts)
    assert kv.hit_tokens == hits0
    fixed = BenchOptions(**{**opts.__dict__, "seed": 7})
    run_bench(fixed)
    run_bench(fixed)                                     # the same prompts again: whole blocks hit
    assert kv.hit_tokens > hits0
