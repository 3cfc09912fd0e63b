"""The cost model knows sparse and windowed attention: DSA and MiniMax-M3 read their selection (not the
context) in the attention and the whole context only in the indexer; sliding windows read the window."""

import json

from cost_model.layout import Layout
from cost_model.ops import attended_keys, step_ops
from persistent_engine.models.spec import CONFIG_DIR, ModelSpec
from traffic_profiles import TrafficPoint


def _bytes(spec, ctx, name):
    ops = step_ops(spec, Layout(tp=8), TrafficPoint(phase="decode", batch=16, context=ctx))
    return sum(o.bytes * o.count for o in ops if o.name == name)


def test_dsa_attention_reads_the_top_k_and_the_indexer_the_context():
    v32, v3 = ModelSpec.from_name("deepseek-v3.2"), ModelSpec.from_name("deepseek-v3")
    assert _bytes(v32, 1000, "mla_decode") == _bytes(v3, 1000, "mla_decode")          # below the top-k: dense
    assert _bytes(v32, 32000, "mla_decode") < _bytes(v3, 32000, "mla_decode") / 10    # 2048 of 32k tokens
    assert _bytes(v32, 32000, "indexer_topk") > 10 * _bytes(v32, 2000, "indexer_topk")
    assert _bytes(v3, 32000, "indexer_topk") == 0
    glm51, glm52 = ModelSpec.from_name("glm-5.1"), ModelSpec.from_name("glm")
    assert 3 < _bytes(glm51, 8000, "indexer_topk") / _bytes(glm52, 8000, "indexer_topk") < 4    # 78 vs 21 full layers


def test_block_sparse_and_windows_bound_the_keys():
    m3 = ModelSpec.from_name("minimax")
    assert attended_keys(m3, 100) == 100 and attended_keys(m3, 1e6) < 0.1 * 1e6
    cfg = json.loads((CONFIG_DIR / "qwen3-moe.json").read_text())
    q = ModelSpec.from_config({**cfg, "use_sliding_window": True, "sliding_window": 1024, "max_window_layers": 24},
                              name="q")
    assert attended_keys(q, 100) == 100 and attended_keys(q, 9000) == (9000 + 1024) / 2
    assert _bytes(q, 9000, "attention_decode") < _bytes(ModelSpec.from_config(cfg, name="q"), 9000, "attention_decode")
