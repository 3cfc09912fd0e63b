"""The cost model on MiMo-V2-Flash: its windowed (128 tokens, 8 KV heads) and full (4 KV heads) layers, K heads of 192
and V heads of 128, averaged over the layers' products (not the product of the averages)."""

import pytest

from cost_model.layout import Layout, attention_weight_bytes_gpu, kv_bytes_per_token_layer_gpu
from cost_model.ops import layer_ops
from persistent_engine.models.spec import ModelSpec


def test_kv_and_weight_bytes_count_each_layer_kind():
    spec = ModelSpec.from_name("mimo")                          # 9 full layers (4 KV heads), 39 windowed (8)
    assert kv_bytes_per_token_layer_gpu(spec, Layout()) == pytest.approx((9 * 4 + 39 * 8) / 48 * (192 + 128) * 2)
    assert kv_bytes_per_token_layer_gpu(spec, Layout(tp=8)) == pytest.approx((9 * 1 + 39 * 1) / 48 * 320 * 2)
    per_layer = [spec.attention_params(i) - 64 * spec.layer_sinks(i) for i in range(48)]   # the sinks: not GEMMs
    assert attention_weight_bytes_gpu(spec, Layout()) == pytest.approx(sum(per_layer) / 48 * 2)
    assert spec.attention_params(0) == 4096 * (64 * 192 + 4 * 320) + 64 * 128 * 4096


def test_decode_reads_the_window_on_windowed_layers_and_everything_on_full_ones():
    spec = ModelSpec.from_name("mimo")
    ctx = 32767                                                 # the decode token sees 32768 keys
    op = next(o for o in layer_ops(spec, Layout(), "moe", 1, 1, ctx, 0.0) if o.name == "attention_decode")
    kv = (9 * 32768 * 4 + 39 * 128 * 8) / 48 * 320 * 2         # K + V bytes read per layer, mean over layers
    assert op.bytes == pytest.approx(kv + 64 * 320 * 2 + 7 * 320 * 2)    # + q and o rows, the new token's K/V
    full = next(o for o in layer_ops(spec.replace(layer_windows=(), window_kv_heads=0), Layout(), "moe", 1, 1, ctx,
                                     0.0) if o.name == "attention_decode")
    assert full.bytes > 5 * op.bytes
