"""The cost model on Gemma-4-31B: 50 sliding layers (window 1024, 16 KV heads of 256, K and V projections) and 10
full ones (4 KV heads of 512, V = K's projection), each kind's FLOPs and bytes weighted by its share of the layers;
on the 26B-A4B: the dense MLP beside 8 of 128 GeGLU experts in every layer."""

import pytest

from cost_model.layout import Layout, attention_weight_bytes_gpu, kv_bytes_per_token_layer_gpu
from cost_model.ops import layer_ops
from persistent_engine.models.spec import ModelSpec

H, HQ = 5376, 32


def test_kv_and_weight_bytes_count_each_layer_kind():
    spec = ModelSpec.from_name("gemma4")
    kv = (50 * 16 * 512 + 10 * 4 * 1024) / 60 * 2                # K + V elements per token, bf16
    assert kv_bytes_per_token_layer_gpu(spec, Layout()) == pytest.approx(kv)
    assert spec.kv_bytes_per_token() == pytest.approx(kv * 60)
    sliding = H * (HQ * 256 + 16 * 512) + HQ * 256 * H             # q, k, v, o
    full = H * (HQ * 512 + 4 * 512) + HQ * 512 * H                 # q, k (V = K), o
    assert attention_weight_bytes_gpu(spec, Layout()) == pytest.approx((50 * sliding + 10 * full) / 60 * 2)
    assert spec.attention_params(0) == sliding + 2 * 256 and spec.attention_params(5) == full + 2 * 512
    assert 30.5e9 < spec.total_params() < 31.5e9                   # the 31B (tied embeddings)


def test_decode_flops_and_bytes_weight_the_layer_kinds():
    spec = ModelSpec.from_name("gemma4")
    ctx = 32767                                                    # the decode token sees 32768 keys
    ops = {o.name: o for o in layer_ops(spec, Layout(), "dense", 1, 1, ctx, 0.0)}
    att = ops["attention_decode"]
    reads = (50 * 1024 * 16 * 512 + 10 * 32768 * 4 * 1024) / 60 * 2       # K + V bytes read, mean over layers
    new = (50 * (HQ * 512 + 16 * 512) + 10 * (HQ * 1024 + 4 * 1024)) / 60 * 2   # q and o rows, the token's K/V
    assert att.bytes == pytest.approx(reads + new)
    assert att.flops == pytest.approx((50 * 2 * HQ * 512 * 1024 + 10 * 2 * HQ * 1024 * 32768) / 60)
    qkv = ops["qkv_proj"]
    assert qkv.flops == pytest.approx(2 * H * (50 * (HQ + 32) * 256 + 10 * (HQ + 4) * 512) / 60)


def test_e2b_kv_sharing_layers_store_no_kv_and_run_double_wide_mlps():
    spec = ModelSpec.from_name("gemma-4-e2b")          # 35 layers, the last 20 read layers 13 / 14's K/V
    kv = (12 * 512 + 3 * 1024) / 35 * 2                 # 12 sliding (1 head of 256) + 3 full (512), K + V, bf16
    assert kv_bytes_per_token_layer_gpu(spec, Layout()) == pytest.approx(kv)
    assert spec.kv_bytes_per_token() == pytest.approx(kv * 35)
    ops = {o.name: o for o in layer_ops(spec, Layout(), "dense", 4, 1, 1000, 0.0)}
    h, q = 1536, 8 * (16 * 256 + 4 * 512) / 20                     # the sharing layers' mean q rows
    own = (12 * (8 * 256 + 2 * 256) + 3 * (8 * 512 + 2 * 512)) / 35
    assert ops["qkv_proj"].flops == pytest.approx(2 * 4 * h * (own + 20 / 35 * q))
    assert ops["mlp_down"].flops == pytest.approx(2 * 4 * h * 6144 * (15 + 2 * 20) / 35)
    assert {"ple_gate", "ple_out", "ple_proj"} <= ops.keys()
    assert ops["ple_gate"].flops == pytest.approx(2 * 4 * h * 256)


def test_26b_a4b_counts_the_dense_mlp_beside_the_routed_experts():
    spec = ModelSpec.from_name("gemma-4-26b-a4b")          # 30 layers, hidden 2816, MLP 2112, 128 experts of 704, top 8
    h, t = 2816, 4
    assert spec.layer_kinds() == ["moe"] * 30
    assert 25.0e9 < spec.total_params() < 25.4e9 and 3.7e9 < spec.active_params() < 3.9e9     # "25.2B, 3.8B active"
    ops = {o.name: o for o in layer_ops(spec, Layout(), "moe", t, 1, 1000, 0.0)}
    assert ops["shared_gate_up"].flops == pytest.approx(2 * t * h * 2 * 2112)           # the dense MLP, every token
    assert ops["shared_down"].flops == pytest.approx(2 * t * 2112 * h)
    assert ops["router"].flops == pytest.approx(2 * t * h * 128)
    assert ops["moe_experts"].flops == pytest.approx(2 * 3 * h * 704 * t * 8)           # 8 GeGLU experts a token
    assert ops["gemma4_moe_norms"].bytes == pytest.approx(8 * t * h * 2)
    dense = {o.name for o in layer_ops(ModelSpec.from_name("gemma4"), Layout(), "dense", t, 1, 1000, 0.0)}
    assert "gemma4_moe_norms" not in dense
