"""Nemotron-H configs: the Hub's Nemotron-3 Nano and Super config.json load with their exact key sets, sizes agree
with the published parameter counts, values tkcc does not implement are refused by name (one line), the cost model
counts the Mamba states, and ``tkcc parallelism`` plans the model."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from cost_model.layout import Layout, kv_bytes_per_seq_gpu, weight_bytes_gpu
from cost_model.ops import step_ops
from persistent_engine.models.aliases import ALIASES, CONFIG_DIR, RELEASES
from persistent_engine.models.spec import ModelSpec, SpecError
from traffic_profiles import TrafficPoint


def _config(name="nemotron-3-super"):
    return json.loads((CONFIG_DIR / f"{name}.json").read_text())


def test_aliases_name_the_releases():
    assert ALIASES["nemotron"] == ALIASES["nemotron-3-super"] == "nemotron-3-super.json"
    assert ALIASES["nemotron-3-nano"] == "nemotron-3-nano.json"
    assert "Super" in RELEASES["nemotron"] and "Nano" in RELEASES["nemotron-3-nano"]


def test_super_and_nano_fields_and_sizes():
    s = ModelSpec.from_name("nemotron")
    assert (s.family, s.num_layers, s.hybrid_pattern.count("M"), s.hybrid_pattern.count("E"),
            s.hybrid_pattern.count("*")) == ("nemotron_h", 88, 40, 40, 8)
    assert (s.mamba_num_heads, s.mamba_head_dim, s.ssm_state_size, s.mamba_n_groups, s.mamba_conv_kernel) == (
        128, 64, 128, 8, 4)
    assert (s.num_experts, s.num_experts_per_tok, s.latent_moe_size, s.routed_scaling_factor, s.mlp_act) == (
        512, 22, 1024, 5.0, "relu2")
    assert not any(s.uses_rope(i) for i in range(s.num_layers)) and s.rms_norm_eps == 1e-5
    # the BF16 checkpoint's 123.61 B parameters less its 2.94 B MTP layer; 12.77 B active
    assert abs(s.total_params() - 120.67e9) < 0.01e9 and abs(s.active_params() - 12.77e9) < 0.01e9
    n = ModelSpec.from_name("nemotron-3-nano")
    assert (n.num_layers, n.num_experts, n.latent_moe_size, n.mamba_num_heads) == (52, 128, 0, 64)
    assert abs(n.total_params() - 31.58e9) < 0.01e9                  # "31.6B total parameters"
    # K/V on the 8 attention layers only; a Mamba layer's state: 128 x 64 x 128 fp32 + 10240 x 3 bf16
    assert s.kv_bytes_per_token() == 8 * 2 * 2 * 128 * 2
    assert s.state_bytes_per_seq_layer(0) == 128 * 64 * 128 * 4 + 10240 * 3 * 2 and s.state_bytes_per_seq_layer(1) == 0


def test_layers_block_type_form_reads_like_the_pattern():
    cfg = _config("nemotron-3-nano")
    pattern = cfg.pop("hybrid_override_pattern")
    cfg["layers_block_type"] = [{"M": "mamba", "E": "moe", "*": "attention", "-": "mlp"}[ch] for ch in pattern]
    assert ModelSpec.from_config(cfg, "n").hybrid_pattern == pattern


def test_tiny_keeps_every_block_kind():
    t = ModelSpec.from_name("nemotron+tiny")
    assert t.hybrid_pattern == "ME*" and t.covering_layers() == [0, 1, 2] and t.latent_moe_size == 32
    assert t.mamba_n_groups == 2 and t.num_experts == 16 and t.layer_kind(1) == "moe"


@pytest.mark.parametrize("edit,word", [
    (lambda c: c.update(mlp_hidden_act="silu"), "mlp_hidden_act"),
    (lambda c: c.update(mamba_hidden_act="gelu"), "mamba_hidden_act"),
    (lambda c: c.update(use_conv_bias=False), "use_conv_bias"),
    (lambda c: c.update(mamba_proj_bias=True), "mamba_proj_bias"),
    (lambda c: c.update(residual_in_fp32=True), "residual_in_fp32"),
    (lambda c: c.update(time_step_limit=[0.001, 0.1]), "time_step_limit"),
    (lambda c: c.update(mamba_ssm_cache_dtype="bfloat16"), "mamba_ssm_cache_dtype"),
    (lambda c: c.update(sliding_window=4096), "sliding_window"),
    (lambda c: c.update(hybrid_override_pattern=c["hybrid_override_pattern"][:-1] + "X"), "letter 'X'"),
    (lambda c: c.update(num_hidden_layers=87), "num_hidden_layers"),
    (lambda c: c.update(n_groups=3), "n_groups"),
    (lambda c: c.update(norm_eps=1e-6), "norm_eps"),
    (lambda c: c.update(mamba_chunk_scan_v2=True), "mamba_chunk_scan_v2"),
    (lambda c: c.update(quantization_config={"quant_method": "modelopt"}), "quantization_config"),
])
def test_a_changed_config_is_refused_with_one_line(edit, word):
    cfg = _config()
    edit(cfg)
    with pytest.raises(SpecError) as e:
        ModelSpec.from_config(cfg, name="super")
    assert word in str(e.value) and "\n" not in str(e.value)


def test_cost_model_counts_states_and_relu2_experts():
    s = ModelSpec.from_name("nemotron")
    one = Layout(tp=1)
    dec = {o.name: o for o in step_ops(s, one, TrafficPoint("decode", batch=8, context=4096))}
    ssd = dec["ssd_decode"]
    state = 8 * 128 * 64 * 128 * 4.0
    assert ssd.count == 40 and ssd.bytes >= 2 * state and ssd.flops == 8 * 128 * 6.0 * 64 * 128
    assert dec["moe_experts_relu2"].count == 40 and "rotary_embedding" not in dec and "mlp_gate_up" not in dec
    assert dec["attention_decode"].count == 8
    pre = {o.name: o for o in step_ops(s, one, TrafficPoint("prefill", batch=1, context=0, chunk=2048))}
    assert pre["ssd_prefill"].flops == 2048 * 128 * (2.0 * 128 * (128 + 64) + 4.0 * 64 * 128)
    # memory: a sequence's K/V on the 8 attention layers plus 40 Mamba states; tp2 halves the heads of both
    per_seq = kv_bytes_per_seq_gpu(s, one, 4096)
    assert per_seq == 4096 * 8 * 2 * 2 * 128 * 2 + 40 * (128 * 64 * 128 * 4 + 10240 * 3 * 2)
    assert kv_bytes_per_seq_gpu(s, Layout(tp=2), 4096) < per_seq
    assert abs(weight_bytes_gpu(s, one) / 2 - s.total_params()) / s.total_params() < 0.01


def test_parallelism_plans_nemotron():
    out = subprocess.run([sys.executable, "-m", "compiler", "parallelism", "--model", "nemotron", "--hw", "h200",
                          "--gpus", "8", "--json"], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    doc = json.loads(out.stdout)
    assert doc["model"] == "nemotron" and doc["best"]


def test_tensor_parallel_refuses_nemotron_by_name():
    from persistent_engine.parallel.tensor_parallel import ParallelConfig, ParallelError, check_supported

    with pytest.raises(ParallelError, match="Nemotron-H"):
        check_supported(ModelSpec.from_name("nemotron"), ParallelConfig(tp=2))
