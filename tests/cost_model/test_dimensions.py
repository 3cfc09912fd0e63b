"""The dimensions cost model II adds: KV-cache dtype, EP/DCP as free factors, length distributions,
queueing in TTFT, quantization as a quality trade-off, the default objective."""
import math

import pytest

from cost_model import Layout, TrafficShape, estimate_step, get_hardware, memory_fit, search
from cost_model.efficiency import curve_efficiency
from cost_model.layout import kv_bytes_per_seq_gpu
from cost_model.queueing import wait_s
from cost_model.search import DEFAULT_OBJECTIVE, SLA, enumerate_layouts, evaluate_layout, native_weight_dtype
from cost_model.traffic import length_buckets
from persistent_engine.models.spec import ModelSpec
from traffic_profiles import TrafficPoint

H200 = get_hardware("h200")
LLAMA = ModelSpec.from_name("llama-8b")


def test_fp8_kv_halves_kv_bytes_and_attention_time():
    bf, f8 = Layout(), Layout(kv_dtype="fp8")
    assert kv_bytes_per_seq_gpu(LLAMA, f8, 4096) == 0.5 * kv_bytes_per_seq_gpu(LLAMA, bf, 4096)
    assert memory_fit(LLAMA, H200, f8, 64, 4096).kv == pytest.approx(0.5 * memory_fit(LLAMA, H200, bf, 64, 4096).kv)
    eff = curve_efficiency(H200)
    p = TrafficPoint(phase="decode", batch=64, context=8192)
    t_bf = estimate_step(LLAMA, H200, bf, p, eff=eff).by_class["attention"]
    t_f8 = estimate_step(LLAMA, H200, f8, p, eff=eff).by_class["attention"]
    assert 0.4 * t_bf < t_f8 < 0.85 * t_bf
    r = search(LLAMA, H200, 1, allow_quantized=True)
    assert any(c.layout.kv_dtype == "fp8" and "fp8 KV cache" in c.quality for c in r.configs)


def test_ep_and_dcp_are_free_factors():
    qwen = ModelSpec.from_name("qwen3-moe")
    # SGLang's --ep-size: EP larger than TP and smaller than the whole MLP group (tp * dp), a free factor
    layouts = enumerate_layouts(qwen, H200, 8, framework="sglang")
    assert any(L.tp < L.ep < L.tp * L.dp for L in layouts)
    assert {L.ep for L in layouts if L.tp == 2 and L.dp == 4} == {1, 2, 4, 8}
    # vLLM's --enable-expert-parallel: all of tp * dp or nothing
    assert {L.ep for L in enumerate_layouts(qwen, H200, 8) if L.tp == 2 and L.dp == 4} == {1, 8}
    ds = enumerate_layouts(ModelSpec.from_name("deepseek-v3"), H200, 8, dtypes=("fp8",))
    assert {L.dcp for L in ds if L.tp == 8} == {1, 2, 4, 8}
    r = search(qwen, H200, 8)
    assert any(c.layout.ep > c.layout.tp for c in r.configs)


def test_queueing_matches_mm1_and_grows_with_load():
    # M/M/1: W_q = rho / (1 - rho) * E[S]
    assert wait_s(5.0, 0.1, ca=1.0, cs=1.0) == pytest.approx(0.5 / 0.5 * 0.1)
    assert wait_s(10.0, 0.1) == math.inf
    assert wait_s(5.0, 0.1, ca=2.0, cs=1.0) > wait_s(5.0, 0.1, ca=1.0, cs=1.0)      # burstier arrivals
    assert wait_s(15.0, 0.1, servers=2) < wait_s(7.5, 0.1, servers=1)                # pooling helps


def test_ttft_grows_with_arrival_rate():
    L, sla = Layout(), SLA()
    ttft = []
    for rate in (0.5, 5.0, 20.0, 1e4):
        rows = evaluate_layout(LLAMA, H200, 1, L, TrafficShape(isl=4096, osl=256, rate=rate), sla,
                               eff=curve_efficiency(H200), batches=(64,))
        ttft.append(rows[0].ttft_ms)
    assert ttft[0] < ttft[1] < ttft[2] and ttft[3] == math.inf
    assert ttft[2] > 1.5 * ttft[0]


def test_length_distributions_from_a_profile():
    prof = {"input_tokens": {"mean": 2000, "p50": 1000, "p90": 5000, "p99": 12000, "max": 16000},
            "output_tokens": {"mean": 300, "p50": 200, "p90": 700, "p99": 1500, "max": 2000},
            "requests_per_s": 3.0, "interarrival_cv": 2.5, "prefix_cache_hit_rate": None}
    t = TrafficShape.from_profile(prof)
    assert len(t.isl_dist) == 6 and t.rate == 3.0 and t.interarrival_cv == 2.5
    assert sum(n * p for n, p in t.isl_dist) == pytest.approx(2000, rel=0.02)
    assert max(n for n, _ in t.isl_dist) <= 16000
    assert t.decode_context > t.isl + t.osl // 2              # long outputs spend more decode steps
    assert length_buckets({"mean": 10, "p50": 10, "p90": 10}) == ()
    # the mean prefill over the distribution is longer than the prefill of the mean (attention is
    # superlinear in length) and its variability adds queueing
    flat = TrafficShape(isl=t.isl, osl=t.osl, rate=3.0)
    eff = curve_efficiency(H200)
    dist = evaluate_layout(LLAMA, H200, 1, Layout(), t, SLA(), eff=eff, batches=(32,))[0]
    mean = evaluate_layout(LLAMA, H200, 1, Layout(), flat, SLA(), eff=eff, batches=(32,))[0]
    assert dist.ttft_ms > mean.ttft_ms


def test_quantized_weights_are_a_tradeoff_not_a_default():
    r = search(LLAMA, H200, 8)
    assert r.best.layout.dtype == "bf16" and r.best.layout.kv_dtype == "bf16" and not r.best.quality
    assert any(c.quality and c.layout.dtype in ("fp8", "fp4") for c in r.configs)
    q = search(LLAMA, H200, 8, allow_quantized=True)
    assert q.best.tokens_per_s_per_gpu >= r.best.tokens_per_s_per_gpu
    assert native_weight_dtype(ModelSpec.from_name("deepseek-v3")) == "fp8"
    assert native_weight_dtype(LLAMA) == "bf16"
    ds = search(ModelSpec.from_name("deepseek-v3"), H200, 8)
    assert ds.best is not None and ds.best.layout.dtype == "fp8" and not ds.best.quality   # its checkpoint is fp8


def test_default_objective_is_stated_and_interactive():
    r = search(LLAMA, H200, 8)
    assert r.objective == DEFAULT_OBJECTIVE and "TPOT <= 50 ms" in r.message
    assert r.best.tpot_ms <= 50 and r.best.stable
    d = r.to_dict()
    assert d["objective"] == DEFAULT_OBJECTIVE and d["best"]["stable"]
    s = search(LLAMA, H200, 8, sla=SLA(tpot_ms=200))
    assert s.objective.startswith("SLA") and s.best.tokens_per_s_per_gpu >= r.best.tokens_per_s_per_gpu
