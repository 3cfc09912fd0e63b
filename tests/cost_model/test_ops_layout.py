"""Hand-computed FLOPs, bytes and memory figures."""
import pytest

from cost_model import Layout, get_hardware, memory_fit, step_ops
from cost_model.comm import all_reduce_time, all_to_all_time
from cost_model.layout import kv_bytes_per_token_layer_gpu, weight_bytes_gpu
from cost_model.ops import expert_load
from persistent_engine.models.spec import ModelSpec
from traffic_profiles import TrafficPoint

H200 = get_hardware("h200")


def _op(ops, name):
    return next(o for o in ops if o.name == name)


def test_llama8b_decode_ops_by_hand():
    s = ModelSpec.from_name("llama-8b")            # H 4096, 32 q / 8 kv heads of 128, FFN 14336
    ops = step_ops(s, Layout(), TrafficPoint(phase="decode", batch=4, context=1000))
    qkv = _op(ops, "qkv_proj")
    assert qkv.count == 32
    assert qkv.flops == 2 * 4 * 4096 * (32 + 16) * 128
    assert qkv.bytes == 4096 * 6144 * 2 + 4 * (4096 + 6144) * 2
    att = _op(ops, "attention_decode")
    # each of 4 sequences reads 1001 tokens of K and V: 8 kv heads x 128 x 2 bytes
    assert att.bytes >= 4 * 1001 * 2 * 8 * 128 * 2
    assert att.flops == 4 * 4 * 32 * 128 * 1001
    # TP2 halves the projection
    ops2 = step_ops(s, Layout(tp=2), TrafficPoint(phase="decode", batch=4, context=1000))
    assert _op(ops2, "qkv_proj").flops == qkv.flops / 2
    assert _op(ops2, "attn_all_reduce").bytes == 4 * 4096 * 2


def test_weights_match_the_spec_at_tp1():
    for name in ("llama-8b", "qwen3-moe", "deepseek-v3"):
        s = ModelSpec.from_name(name)
        w = weight_bytes_gpu(s, Layout())
        assert w == pytest.approx(s.weight_bytes("bf16"), rel=0.01)
        # fp8: projections halve, embeddings / router stay bf16
        w8 = weight_bytes_gpu(s, Layout(dtype="fp8"))
        assert 0.5 * w < w8 < 0.6 * w


def test_kv_sharding():
    llama = ModelSpec.from_name("llama-8b")
    assert kv_bytes_per_token_layer_gpu(llama, Layout()) == 2 * 8 * 128 * 2
    assert kv_bytes_per_token_layer_gpu(llama, Layout(tp=8)) == 2 * 1 * 128 * 2
    ds = ModelSpec.from_name("deepseek-v3")             # MLA latent 512 + rope 64, replicated over TP
    assert kv_bytes_per_token_layer_gpu(ds, Layout(tp=8)) == 576 * 2
    assert kv_bytes_per_token_layer_gpu(ds, Layout(tp=8, dcp=8)) == 576 * 2 / 8


def test_deepseek_on_8xh200_fits_in_fp8_not_bf16():
    ds = ModelSpec.from_name("deepseek-v3")             # 671B parameters
    bf16 = memory_fit(ds, H200, Layout(tp=8), batch=1, context=2048)
    fp8 = memory_fit(ds, H200, Layout(tp=8, dtype="fp8"), batch=1, context=2048)
    # by hand: 671e9 x 2 B / 8 = 168 GB per GPU > 141 GiB x 0.92 = 139 GB; fp8 ~ 84 GB + bf16 embeddings
    assert 165e9 < bf16.weights < 172e9 and not bf16.fits
    assert 83e9 < fp8.weights < 88e9 and fp8.fits
    assert fp8.comm_buffers == pytest.approx(0.375e9)


def test_expected_distinct_experts_uniform():
    s = ModelSpec.from_name("qwen3-moe")             # 128 experts, top-8
    for t in (1, 4, 64):
        assign, distinct = expert_load(s, Layout(), t, skew=0.0)
        assert assign == pytest.approx(t * 8)
        assert distinct == pytest.approx(128 * (1 - (1 - 8 / 128) ** t))
    # skew concentrates load on the busiest EP rank
    lay = Layout(tp=1, dp=8, ep=8)
    flat, _ = expert_load(s, lay, 256, 0.0)
    skewed, _ = expert_load(s, lay, 256, 1.0)
    assert flat == pytest.approx(256 * 8 / 8) and skewed > 1.2 * flat


def test_collectives():
    # ring all-reduce of 64 MB on 8 GPUs: 2 x 7/8 x 64e6 / 450e9 = 249 us + latencies
    t = all_reduce_time(H200, 8, 64e6)
    assert 2 * 7 / 8 * 64e6 / 450e9 < t < 2 * 7 / 8 * 64e6 / 450e9 + 50e-6
    # 16 GPUs leave the 8-GPU domain: 8 of 15 peers are remote, at 50 GB/s scale-out
    assert all_to_all_time(H200, 16, 1e8) == pytest.approx(10e-6 + 5e-6 + 8 / 15 * 1e8 / 50e9)
    assert all_to_all_time(H200, 8, 1e8) == pytest.approx(10e-6 + 1e-6 + 1e8 / 450e9)
    nvl = get_hardware("gb200")
    assert all_to_all_time(nvl, 64, 1e8) < 2e-3                            # stays inside NVL72
