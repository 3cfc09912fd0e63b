import json
import subprocess
import sys

import pytest

from persistent_engine.models.spec import ALIASES, CONFIG_DIR, ModelSpec, SpecError


def test_spec_import_does_not_import_torch():
    code = "import sys, persistent_engine.models.spec; assert 'torch' not in sys.modules"
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.parametrize("alias", list(ALIASES))
def test_every_alias_parses(alias):
    s = ModelSpec.from_name(alias)
    assert s.num_layers > 0 and s.hidden_size > 0
    assert s.covering_layers()[0] == 0


def test_published_parameter_counts():
    # published totals: DeepSeek-V3 671B, Kimi-K2 1.04T (1026B without MTP), Qwen3-30B-A3B 30.5B
    assert round(ModelSpec.from_name("deepseek-v3").total_params() / 1e9) == 671
    assert 1020 < ModelSpec.from_name("kimi-k2").total_params() / 1e9 < 1040
    assert round(ModelSpec.from_name("qwen3-moe").total_params() / 1e9, 1) == 30.5
    assert 3.2 < ModelSpec.from_name("qwen3-moe").active_params() / 1e9 < 3.5
    assert round(ModelSpec.from_name("llama-8b").total_params() / 1e9, 1) == 8.0


def test_layer_kinds():
    ds = ModelSpec.from_name("deepseek-v3")
    assert ds.attention == "mla" and ds.layer_kind(2) == "dense" and ds.layer_kind(3) == "moe"
    assert ds.covering_layers() == [0, 3]
    glm = ModelSpec.from_name("glm-4.6")
    assert glm.rotary_dim == 64 and glm.qkv_bias and glm.qk_norm == "per_head"
    mm = ModelSpec.from_name("minimax-m2.5")
    assert mm.rotary_dim == 64 and mm.qk_norm == "per_layer" and mm.routing_bias
    assert ModelSpec.from_name("llama-1b").kv_bytes_per_token_layer() == 2 * 8 * 64 * 2


def test_config_path_and_unsupported_arch(tmp_path):
    cfg = json.loads((CONFIG_DIR / "tiny-dense.json").read_text())
    p = tmp_path / "config.json"
    p.write_text(json.dumps(cfg))
    assert ModelSpec.from_name(str(p)).hidden_size == 64
    assert ModelSpec.from_name(str(tmp_path)).hidden_size == 64
    cfg["architectures"] = ["MambaForCausalLM"]
    p.write_text(json.dumps(cfg))
    with pytest.raises(SpecError, match="supported: LlamaForCausalLM"):
        ModelSpec.from_name(str(p))
    with pytest.raises(SpecError, match="unknown model"):
        ModelSpec.from_name("no-such-model")


@pytest.mark.parametrize("alias", list(ALIASES))
def test_scaled_down_keeps_code_paths(alias):
    s = ModelSpec.from_name(alias)
    t = s.scaled_down()
    assert (t.family, t.attention, t.qk_norm, t.qkv_bias, t.is_moe, t.scoring, t.routing_bias) == \
        (s.family, s.attention, s.qk_norm, s.qkv_bias, s.is_moe, s.scoring, s.routing_bias)
    assert t.hidden_size == 64 and t.vocab_size == 256 and t.total_params() < 2e6
    assert set(t.layer_kinds()) == set(s.layer_kinds())
    assert (t.num_kv_heads < t.num_heads) == (s.num_kv_heads < s.num_heads)
    assert (t.rotary_dim < t.head_dim) == ((s.rotary_dim or s.head_dim) < s.head_dim)
    if s.is_moe:
        assert (t.n_group > 1) == (s.n_group > 1) and bool(t.num_shared_experts) == bool(s.num_shared_experts)
        assert t.num_experts % t.n_group == 0 and t.num_experts_per_tok <= t.topk_group * t.num_experts // t.n_group
    if s.attention == "mla":
        assert bool(t.q_lora_rank) == bool(s.q_lora_rank)


def test_a_config_path_reaches_an_executor_as_its_content(tmp_path, monkeypatch):
    """An executor runs in its own working directory (and may not read the user's files): a model given
    as a relative config path travels as the parsed config (``config_of_path``), and parses the same."""
    from persistent_engine.models.spec import config_of_path

    (tmp_path / "run").mkdir()
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "run" / "m.json").write_text((CONFIG_DIR / ALIASES["qwen3-moe"]).read_text())
    monkeypatch.chdir(tmp_path / "run")
    judged = {name: ModelSpec.from_name(name) for name in ("m.json", "m.json+tiny")}
    configs = {name: config_of_path(name) for name in judged}
    assert config_of_path("qwen3-moe") is None and config_of_path("qwen3-moe+tiny") is None

    monkeypatch.chdir(tmp_path / "elsewhere")
    with pytest.raises(SpecError, match="not found"):
        ModelSpec.from_name("m.json")
    for name, spec in judged.items():
        assert ModelSpec.from_name(name, configs[name]) == spec
