"""No silent drops: every key of every config tkcc ships is implemented or listed as leaving the math
unchanged, and configs asking for something tkcc does not implement are refused with one line."""

import json
import subprocess
import sys

import pytest

from persistent_engine.models.config_keys import FAMILY_KEYS, MLA, MLA_IRRELEVANT, NO_MATH
from persistent_engine.models.neutral_keys import neutral_rule
from persistent_engine.models.spec import ARCHITECTURES, CONFIG_DIR, ModelSpec, SpecError
from persistent_engine.models.wrappers import unwrap

CONFIGS = sorted(p.name for p in CONFIG_DIR.glob("*.json"))


def _cfg(name: str) -> dict:
    return json.loads((CONFIG_DIR / name).read_text())


@pytest.mark.parametrize("name", CONFIGS)
def test_every_key_of_every_shipped_config_is_accounted_for(name):
    cfg, _ = unwrap(_cfg(name), name)                    # a multimodal wrapper: the text decoder inside it
    family = next(ARCHITECTURES[a] for a in cfg["architectures"] if a in ARCHITECTURES)
    known = FAMILY_KEYS[family]
    loose = [k for k in cfg if k not in known and k not in NO_MATH
             and not (known & MLA and k in MLA_IRRELEVANT)
             and not (neutral_rule(family, k) and neutral_rule(family, k)[0](cfg[k]))]   # at its neutral value
    assert loose == []
    ModelSpec.from_config(cfg, name=name)


@pytest.mark.parametrize("name", CONFIGS)
def test_an_unknown_key_is_refused_by_name(name):
    cfg = {**_cfg(name), "sliding_window_pattern_v9": 6}
    with pytest.raises(SpecError, match="'sliding_window_pattern_v9' is not implemented"):
        ModelSpec.from_config(cfg, name=name)


def test_every_no_math_key_says_why():
    assert all(isinstance(v, str) and len(v) > 8 for v in NO_MATH.values())


@pytest.mark.parametrize("base, change, key", [
    ("llama-8b.json", {"hidden_act": "gelu"}, "hidden_act"),
    ("llama-8b.json", {"mlp_bias": True}, "mlp_bias"),
    ("llama-8b.json", {"rope_scaling": {"rope_type": "longrope", "factor": 4.0}}, "rope_scaling"),
    ("deepseek.json", {"quantization_config": {"quant_method": "awq", "bits": 4}}, "quantization_config"),
    ("deepseek.json", {"topk_method": "weird"}, "topk_method"),
    ("llama-8b.json", {"sliding_window": 4096}, "sliding_window"),            # Llama has no windows in tkcc
    ("qwen3-moe.json", {"layer_types": ["chunked_attention"] * 48}, "layer_types"),
    ("deepseek-v3.2.json", {"index_topk_freq": 4}, "index_topk_freq"),        # a GLM-5.2 key, not V3.2's
    ("glm-5.2.json", {"layer_types": ["full_attention"] * 78}, "layer_types"),
    ("glm-4.6.json", {"indexer_types": ["full"] * 92}, "indexer_types"),     # a DSA key on a GQA family
    ("minimax-m3.json", {"attention_output_gate": True}, "attention_output_gate"),
    ("minimax-m3.json", {"swiglu_beta": 2.0}, "swiglu_beta"),
    ("minimax-m3.json", {"hidden_act": "silu"}, "hidden_act"),
    ("mixtral-8x7b.json", {"hidden_act": "gelu"}, "hidden_act"),
    ("gemma-2-9b.json", {"hidden_activation": "gelu"}, "hidden_activation"),
    ("gemma-2-9b.json", {"rope_local_base_freq": 10000.0}, "rope_local_base_freq"),     # a Gemma-3 key
    ("gemma-3-27b.json", {"use_bidirectional_attention": True}, "use_bidirectional_attention"),
    ("gemma-3-27b.json", {"attn_logit_softcapping": 50.0}, "attn_logit_softcapping"),
    ("gemma-3-27b.json", {"rope_scaling": {"rope_type": "yarn", "factor": 8.0}}, "rope_scaling"),
    ("gemma-3-27b.json", {"sliding_window_pattern": 6, "layer_types": ["chunked_attention"] * 62}, "layer_types"),
    ("llama-4-scout.json", {"layer_types": ["full_attention"] * 48}, "layer_types"),
    ("llama-4-scout.json", {"no_rope_layers": [1] * 47}, "no_rope_layers"),
    ("llama-4-scout.json", {"attention_bias": True}, "attention_bias"),
    ("mixtral-8x7b.json", {"attention_chunk_size": 8192}, "attention_chunk_size"),   # a Llama-4 key
])
def test_unimplemented_values_and_keys_are_refused(base, change, key):
    with pytest.raises(SpecError, match=f"'{key}'"):
        ModelSpec.from_config({**_cfg(base), **change}, name=base)


@pytest.mark.parametrize("change, message", [
    ({"sparse_score_type": "mean"}, "sparse_score_type"),
    ({"sparse_block_shape": [1, 2]}, "'sparse_block_shape' is not implemented"),
    ({"sparse_disable_index_value": [0] * 60}, "index value/output branch"),
    ({"sparse_num_index_heads": 8}, "sparse_num_index_heads"),
])
def test_minimax_m3_sparse_attention_settings_are_checked(change, message):
    cfg = _cfg("minimax-m3.json")
    cfg["sparse_attention_config"] = {**cfg["sparse_attention_config"], **change}
    with pytest.raises(SpecError, match=message):
        ModelSpec.from_config(cfg, name="m3")


def test_inconsistent_dsa_fields_are_refused():
    glm = _cfg("glm-5.2.json")
    with pytest.raises(SpecError, match="disagrees with index_topk_freq"):
        ModelSpec.from_config({**glm, "index_topk_freq": 2}, name="glm")
    with pytest.raises(SpecError, match="qk_head_dim"):
        ModelSpec.from_config({**glm, "qk_head_dim": 192}, name="glm")
    with pytest.raises(SpecError, match="indexer_types"):
        ModelSpec.from_config({**glm, "indexer_types": ["shared"] + glm["indexer_types"][1:]}, name="glm")
    assert ModelSpec.from_config({**glm, "indexer_types": None}, name="glm").indexer_types == \
        ModelSpec.from_config(glm, name="glm").indexer_types                   # derived from freq/offset


def test_the_cli_refuses_with_one_line_naming_the_key(tmp_path):
    cfg = {**_cfg("tiny-dense.json"), "sliding_window": 16, "use_sliding_window": True}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    cand = tmp_path / "c.py"
    cand.write_text("OVERRIDES = {}\n")
    out = subprocess.run([sys.executable, "-m", "compiler", "candidate", "check", str(cand), "--model",
                          str(tmp_path / "config.json")], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr and "'sliding_window'" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1
