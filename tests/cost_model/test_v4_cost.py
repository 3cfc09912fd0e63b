"""The cost model on DeepSeek-V4-Flash: its step holds the hyper-connection, compressor, indexer and
compressed-attention ops, and attention cost grows far slower than the context (window + entries)."""

from cost_model.layout import Layout
from cost_model.ops import compressed_attended_keys, step_ops
from persistent_engine.models.spec import ModelSpec
from traffic_profiles import TrafficPoint


def _attn_flops(spec, ctx: int) -> float:
    ops = step_ops(spec, Layout(), TrafficPoint(phase="decode", batch=8, context=ctx), layers=[2, 3])
    return sum(o.flops * o.count for o in ops if o.name == "compressed_attention")


def test_v4_step_names_its_ops():
    spec = ModelSpec.from_name("deepseek")
    names = {o.name for o in step_ops(spec, Layout(), TrafficPoint(phase="decode", batch=4, context=1000), layers=[0, 2, 3])}
    assert {"hc_pre", "hc_post", "kv_compress", "csa_indexer", "compressed_attention", "grouped_o_a_proj"} <= names
    assert "mla_decode" not in names and "attention_decode" not in names


def test_v4_attention_is_sublinear_in_context():
    spec = ModelSpec.from_name("deepseek")
    assert compressed_attended_keys(65536, 128, 4, 512) == 128 + 512          # CSA: window + top-k entries
    assert compressed_attended_keys(65536, 128, 128, 0) == 128 + 512          # HCA: window + every entry
    assert _attn_flops(spec, 65536) < 2.5 * _attn_flops(spec, 16384)          # 4x the context, < 2.5x the work
    assert spec.kv_bytes_per_token_layer(layer=0) < spec.kv_bytes_per_token_layer(layer=2)   # window-only < CSA
