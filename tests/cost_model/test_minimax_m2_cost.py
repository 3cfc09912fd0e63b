"""The cost model on MiniMax-M2.7: attn_type_list gives full softmax attention (kind 1) on each of its 62 layers, so
every layer is costed as GQA attention over every cached token (48 query / 8 KV heads of 128) plus the 256-expert
MoE, the same ops as MiniMax-M2.5's; ``tkcc parallelism --model minimax-m2.7`` lays it out."""

import json
import subprocess
import sys

import pytest

from cost_model.layout import Layout
from cost_model.ops import layer_ops, step_ops, token_mixer
from persistent_engine.io_struct import WorkloadPoint
from persistent_engine.models.spec import ModelSpec


def test_every_layer_is_full_attention_read_over_the_whole_context():
    spec = ModelSpec.from_name("minimax-m2.7")
    assert {token_mixer(spec, i) for i in range(spec.num_layers)} == {"attention"}
    ctx = 8191                                                   # the decode token sees 8192 keys
    op = next(o for o in layer_ops(spec, Layout(), "moe", 1, 1, ctx, 0.0) if o.name == "attention_decode")
    kv = 8192 * 8 * (128 + 128) * 2                              # K and V of every cached token, bf16
    assert op.bytes == pytest.approx(kv + 48 * 256 * 2 + 8 * 256 * 2)    # + q and o rows, the new token's K/V
    assert op.flops == pytest.approx(2.0 * 48 * 256 * 8192)
    qkv = next(o for o in layer_ops(spec, Layout(), "moe", 1, 1, ctx, 0.0) if o.name == "qkv_proj")
    assert qkv.flops == pytest.approx(2.0 * 3072 * (48 + 2 * 8) * 128)


def test_m2_7_costs_what_m2_5_costs():
    m27, m25 = ModelSpec.from_name("minimax-m2.7"), ModelSpec.from_name("minimax-m2.5")
    for point in (WorkloadPoint("decode", 32, 4096), WorkloadPoint("prefill", 1, 0, 2048)):
        a, b = step_ops(m27, Layout(tp=8), point), step_ops(m25, Layout(tp=8), point)
        assert [(o.name, o.flops, o.bytes, o.count) for o in a] == [(o.name, o.flops, o.bytes, o.count) for o in b]
        assert sum(o.flops for o in a) > 0


def test_tkcc_parallelism_lays_out_minimax_m2_7():
    out = subprocess.run([sys.executable, "-m", "compiler", "parallelism", "--model", "minimax-m2.7", "--hw", "h200",
                          "--gpus", "8", "--json"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    doc = json.loads(out.stdout)
    assert doc["model"] == "minimax-m2.7" and doc["best"]["fits"] and doc["best"]["tokens_per_s_per_gpu"] > 0
