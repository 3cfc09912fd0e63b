import numpy as np
import pytest

from traffic_profiles import (RooflineStepTime, SchedulerConfig, Slo, StepShape, Trace, TrafficPoint, replay,
                              workload_points)

# a 1B-ish model on an H200-ish device, as plain numbers
ROOF = RooflineStepTime(weight_bytes=2.5e9, kv_bytes_per_token=32768, flops_per_token=2.5e9,
                        bandwidth=3.84e12, flops=6e14, attn_flops_per_pair=65536)


def _trace(ts, inp, out, cached=None):
    n = len(ts)
    return Trace(timestamp_s=np.asarray(ts, dtype=float), input_tokens=np.asarray(inp),
                 output_tokens=np.asarray(out), cached_tokens=None if cached is None else np.asarray(cached))


def test_point_dict_roundtrip():
    p = TrafficPoint("decode", 8, 1024, 1, 0.25)
    assert TrafficPoint.from_dict(p.to_dict()) == p
    assert set(p.to_dict()) == {"phase", "batch", "context", "chunk", "weight"}


def test_one_request_by_hand():
    # constant step time 1 ms: prefill 100 tokens (1 step, emits token 1), then 9 decode steps
    w = replay(_trace([0.0], [100], [10]), lambda s: 1e-3, SchedulerConfig())
    assert w.summary["simulated_s"] == pytest.approx(0.010)
    pts = {p.phase: p for p in w.points}
    assert pts["prefill"] == TrafficPoint("prefill", 1, 0, 100, pytest.approx(0.1))
    assert pts["decode"].batch == 1 and pts["decode"].weight == pytest.approx(0.9)
    assert pts["decode"].context == 104            # contexts 100..108, mean 104
    assert w.summary["ttft_p50_s"] == pytest.approx(1e-3)


def test_the_share_of_requests_within_an_slo_and_their_goodput_by_hand():
    # 1 ms a step; request 0 alone: first token at 1 ms, 9 more by 10 ms (TPOT 1 ms); request 1 arrives at
    # 100 ms with 2000 prompt tokens in 512-token chunks: first token after 4 steps (4 ms), one more at 5 ms
    t = _trace([0.0, 0.1], [100, 2000], [10, 2])
    cfg = SchedulerConfig(max_num_batched_tokens=512)
    assert "slo_attained" not in replay(t, lambda s: 1e-3, cfg).summary       # no SLO, no such figures
    both = replay(t, lambda s: 1e-3, cfg, slo=Slo(ttft_s=5e-3, tpot_s=2e-3)).summary
    assert both["slo_attained"] == 1.0
    assert both["goodput_tokens_per_s"] == pytest.approx(12 / both["simulated_s"])
    first_only = replay(t, lambda s: 1e-3, cfg, slo=Slo(ttft_s=3e-3)).summary          # request 1 took 4 ms
    assert first_only["slo_attained"] == 0.5
    assert first_only["goodput_tokens_per_s"] == pytest.approx(10 / first_only["simulated_s"])
    assert replay(t, lambda s: 1e-3, cfg, slo=Slo(tpot_s=0.5e-3)).summary["slo_attained"] == 0.0
    assert Slo(ttft_s=0.5, tpot_s=0.05).describe() == "TTFT <= 500 ms and TPOT <= 50 ms"
    assert Slo(ttft_s=1.0).met(0.9, None) and not Slo(tpot_s=0.01).met(0.0, 0.02)


def test_chunked_prefill_and_prefix_caching():
    t = _trace([0.0], [10000], [2], cached=[6000])
    chunks = [p.chunk for p in replay(t, lambda s: 1e-3, SchedulerConfig(max_num_batched_tokens=4096,
                                                                         prefix_caching=False)).points
              if p.phase == "prefill"]
    assert sorted(chunks) == [1808, 4096, 4096]             # 10000 tokens in 4096-token chunks
    cached = replay(t, lambda s: 1e-3, SchedulerConfig(max_num_batched_tokens=4096))
    pre = [p for p in cached.points if p.phase == "prefill"]
    assert pre[0].context == 6000 and pre[0].chunk == 4000     # one chunk, then one decode step
    assert cached.summary["simulated_s"] == pytest.approx(0.002)


def test_load_fills_max_num_seqs():
    rng = np.random.default_rng(0)
    n = 3000
    t = _trace(np.sort(rng.uniform(0, 1.0, n)), rng.integers(50, 500, n), rng.integers(100, 300, n))
    w = replay(t, ROOF, SchedulerConfig(max_num_seqs=64))
    assert len(w.points) <= 16
    assert sum(p.weight for p in w.points) == pytest.approx(1.0)
    dec = [p for p in w.points if p.phase == "decode"]
    assert max(p.batch for p in dec) == 64 and all(p.chunk == 1 for p in dec)
    assert w.summary["mean_decode_batch"] > 40
    small = replay(t, ROOF, SchedulerConfig(max_num_seqs=16, max_points=6))
    assert len(small.points) <= 6 and max(p.batch for p in small.points) <= 16


def test_kv_capacity_limits_the_batch():
    t = _trace(np.zeros(100), np.full(100, 900), np.full(100, 100))
    w = replay(t, ROOF, SchedulerConfig(kv_capacity_tokens=10_000))        # 10 sequences of 1000
    assert max(p.batch for p in w.points if p.phase == "decode") == 10


def test_roofline_is_memory_then_compute_bound():
    decode = ROOF(StepShape(decode_batch=1, decode_context=1000))
    assert decode == pytest.approx(20e-6 + (2.5e9 + 32768 * 1000) / 3.84e12)
    prefill = ROOF(StepShape(prefill=((8192, 0),)))
    assert prefill > 20 * decode                        # 8192 tokens: compute bound


def test_azure_conv_llama_1b_points(conv_trace):
    pts = workload_points(conv_trace, ROOF, SchedulerConfig(max_num_seqs=256))
    assert 2 <= len(pts) <= 16 and sum(p.weight for p in pts) == pytest.approx(1.0)
    assert {p.phase for p in pts} == {"decode", "prefill"}
    decode_weight = sum(p.weight for p in pts if p.phase == "decode")
    assert decode_weight > 0.8                          # light load: mostly small-batch decode
