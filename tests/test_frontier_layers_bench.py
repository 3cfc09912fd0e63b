"""benchmarks/frontier_layers.py on CPU at toy size: one row per (model, batch), bytes that count a sparse
layer's selection rather than the whole context, and the JSON written."""

import importlib.util
import json
import pathlib

import pytest

from persistent_engine.models.spec import ModelSpec

BENCH = pathlib.Path(__file__).parents[1] / "benchmarks" / "frontier_layers.py"


def _bench():
    spec = importlib.util.spec_from_file_location("frontier_layers", BENCH)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_attended_tokens_follow_the_selection():
    fl = _bench()
    glm, m3 = ModelSpec.from_name("glm"), ModelSpec.from_name("minimax")
    assert fl.attended_tokens(glm, 3, "k", 4095) == 2048 and fl.attended_tokens(glm, 2, "v", 4095) == 4096
    assert fl.attended_tokens(m3, 3, "k", 9999) == 16 * 128 and fl.attended_tokens(m3, 0, "k", 9999) == 10000
    assert fl.attended_tokens(m3, 3, "index_k", 9999) == 10000


@pytest.mark.slow
def test_cpu_tiny_run_writes_rows(tmp_path):
    out = tmp_path / "fl.json"
    assert _bench().main(["--device", "cpu", "--tiny", "--samples", "1", "--out", str(out)]) == 0
    doc = json.loads(out.read_text())
    assert {r["model"] for r in doc["rows"]} == {"glm+tiny", "deepseek-v3.2+tiny", "minimax+tiny"}
    assert all(r["step_ms"] > 0 and r["bytes"]["total"] > 0 for r in doc["rows"])
    assert any("indexer_topk" in r.get("ops_ms", {}) for r in doc["rows"])


def test_qwen3_5_tiny_rows_count_the_linear_states(tmp_path):
    """Qwen3.5's linear layer: its recurrent state (fp32 [B, Hv, Dk, Dv]) and conv state count as read and written
    once (``bytes["state"]``); the full-attention layer its K/V over the context."""
    out = tmp_path / "fl.json"
    fl = _bench()
    assert fl.main(["--device", "cpu", "--tiny", "--models", "qwen3.5", "--samples", "1", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    spec = ModelSpec.from_name("qwen3.5+tiny")
    assert [r["kinds"] for r in rows][0] == ["moe/linear", "moe/dense"]
    state = 2 * spec.linear_num_v_heads * spec.linear_k_dim * spec.linear_v_dim * 4
    kv_full = 2 * spec.num_kv_heads * spec.head_dim * 2                  # bf16 K and V per cached token
    conv = 2 * spec.linear_conv_dim * (spec.linear_conv_kernel - 1) * 2
    for r in rows:
        assert r["bytes"]["state"] == r["batch"] * (state + conv)
        assert r["bytes"]["kv"] == r["batch"] * (r["context"] + 1) * kv_full
    assert any("gated_delta_decode" in r.get("ops_ms", {}) for r in rows)


def test_minimax_m2_7_tiny_rows_read_every_cached_token(tmp_path):
    """MiniMax-M2.7 (attn_type_list: full softmax attention on every layer): one covering layer, MoE over dense GQA
    attention that reads K and V of every cached token (bf16), no recurrent state."""
    out = tmp_path / "m27.json"
    args = ["--device", "cpu", "--tiny", "--models", "minimax-m2.7", "--samples", "1", "--out", str(out)]
    assert _bench().main(args) == 0
    rows = json.loads(out.read_text())["rows"]
    spec = ModelSpec.from_name("minimax-m2.7+tiny")
    assert {r["model"] for r in rows} == {"minimax-m2.7+tiny"} and all(r["kinds"] == ["moe/dense"] for r in rows)
    for r in rows:
        assert r["bytes"]["kv"] == r["batch"] * (r["context"] + 1) * 2 * spec.num_kv_heads * spec.head_dim * 2
        assert r["bytes"]["state"] == 0 and r["step_ms"] > 0


def test_cpu_tiny_kimi_counts_the_recurrent_state(tmp_path):
    out = tmp_path / "kimi.json"
    assert _bench().main(["--device", "cpu", "--tiny", "--models", "kimi", "--samples", "1", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    decode = [r for r in rows if r["phase"] == "decode"]
    assert decode and all(r["bytes"]["state"] > 0 and r["kinds"] == ["dense/kda", "moe/kda", "moe/dense"]
                          for r in decode)
    prefill = [r for r in rows if r["phase"] == "prefill"]
    assert len(prefill) == 1 and "kda_prefill" in prefill[0]["ops_ms"]
    assert _bench().SLICES["kimi"] == [0, 3] and ModelSpec.from_name("kimi").is_kda_layer(0)


def test_gpt_oss_tiny_rows_count_the_window(tmp_path):
    out = tmp_path / "fl.json"
    assert _bench().main(["--device", "cpu", "--tiny", "--models", "gpt-oss", "--samples", "1", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    assert [r["kinds"] for r in rows] == [["moe/dense", "moe/window8"]] * 2
    spec = ModelSpec.from_name("gpt-oss+tiny")
    assert _bench().attended_tokens(spec, 1, "k", 63) == 8 and _bench().attended_tokens(spec, 0, "k", 63) == 64


def test_cpu_tiny_nemotron_counts_the_mamba_state(tmp_path):
    """Nemotron-H's covering slice (Mamba-2, latent relu2 MoE, NoPE attention): the Mamba layer's SSM and conv states
    count as read and written once, K/V only on the attention layer; a prefill chunk runs the SSD scan."""
    out = tmp_path / "nemotron.json"
    assert _bench().main(["--device", "cpu", "--tiny", "--models", "nemotron", "--samples", "1", "--out", str(out)]) == 0
    rows = json.loads(out.read_text())["rows"]
    spec = ModelSpec.from_name("nemotron+tiny")
    state = 2 * (spec.mamba_num_heads * spec.mamba_head_dim * spec.ssm_state_size * 4
                 + spec.mamba_conv_dim * (spec.mamba_conv_kernel - 1) * 2)
    decode = [r for r in rows if r["phase"] == "decode"]
    assert decode and all(r["kinds"] == ["mamba", "moe", "attention"] for r in decode)
    for r in decode:
        assert r["bytes"]["state"] == r["batch"] * state
        assert r["bytes"]["kv"] == r["batch"] * (r["context"] + 1) * 2 * spec.num_kv_heads * spec.head_dim * 2
    prefill = [r for r in rows if r["phase"] == "prefill"]
    assert len(prefill) == 1 and "ssd_prefill" in prefill[0]["ops_ms"]
