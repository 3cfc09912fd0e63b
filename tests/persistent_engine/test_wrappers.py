"""Multimodal wrappers (models/wrappers.py) and neutral values (models/neutral_keys.py): the published Llama-4 Scout /
Maverick, Kimi-K2.5 and Qwen3-Coder-480B configs load as their text decoders, the vision tower is named as not
compiled, wrapper keys that would change text decoding are refused by name, and every neutral value is accepted
while the other values are refused by name."""

import json

import pytest
import torch

from cost_model.layout import Layout
from cost_model.ops import layer_ops
from persistent_engine.models.config_keys import FAMILY_KEYS
from persistent_engine.models.decoder import build_model
from persistent_engine.models.neutral_keys import FAMILY_NEUTRAL, NEUTRAL
from persistent_engine.models.spec import CONFIG_DIR, ModelSpec, SpecError
from persistent_engine.models.weights import save_weights, unpack_int4


def _cfg(name: str) -> dict:
    return json.loads((CONFIG_DIR / name).read_text())


@pytest.mark.parametrize("alias, family, total_b, active_b, wrapped", [
    ("llama-4-scout", "llama4", 107.8, 17.2, True),           # the text decoder of the 109B (17B active) release
    ("llama-4-maverick", "llama4", 400.7, 17.2, True),        # 400B (17B active)
    ("kimi-k2.5", "deepseek_v3", 1026.4, 32.9, True),         # 1T (32B active)
    ("qwen3-coder", "qwen3_moe", 480.2, 35.5, False),         # 480B-A35B
])
def test_the_published_configs_load_as_their_text_decoders(alias, family, total_b, active_b, wrapped):
    spec = ModelSpec.from_name(alias)
    assert spec.family == family
    assert spec.total_params() / 1e9 == pytest.approx(total_b, abs=0.1)
    assert spec.active_params() / 1e9 == pytest.approx(active_b, abs=0.1)
    note = spec.extra.get("text_only", "")
    assert ("vision_config" in note and "not compiled; text decode only" in note) == wrapped
    assert len(note.splitlines()) <= 1
    assert ModelSpec.from_name(alias + "+tiny").extra.get("text_only", "") == note


def test_maverick_interleaves_dense_and_128_expert_layers():
    mav, scout = ModelSpec.from_name("llama-4-maverick"), ModelSpec.from_name("llama-4-scout")
    assert mav.layer_kinds() == ["dense", "moe"] * 24 and scout.layer_kinds() == ["moe"] * 48
    assert (mav.num_experts, mav.num_experts_per_tok, mav.intermediate_size, mav.moe_intermediate_size) == \
        (128, 1, 16384, 8192)
    assert not mav.qk_l2_norm and scout.qk_l2_norm                 # use_qk_norm false / true
    assert mav.rope_scaling is None and scout.rope_scaling["factor"] == 16.0
    assert mav.rope_layers == scout.rope_layers == tuple((i + 1) % 4 != 0 for i in range(48))
    tiny = ModelSpec.from_name("llama-4-maverick+tiny")
    assert tiny.layer_kinds() == ["dense", "moe"] and tiny.rope_layers == (True, False)
    # the cost model: a dense layer runs the 16384-wide SwiGLU, an MoE layer the router over 128 experts
    t, h = 4, 5120
    dense = {o.name: o for o in layer_ops(mav, Layout(), "dense", t, 1, 100, 0.0)}
    moe = {o.name: o for o in layer_ops(mav, Layout(), "moe", t, 1, 100, 0.0)}
    assert dense["mlp_gate_up"].flops == 2 * t * h * 2 * 16384 and "router" not in dense
    assert moe["router"].flops == 2 * t * h * 128 and moe["moe_experts"].flops == 2 * t * 3 * h * 8192


def test_kimi_k25_is_deepseek_v3_with_int4_experts():
    spec = ModelSpec.from_name("kimi-k2.5")
    k2 = ModelSpec.from_name("kimi-k2")
    assert spec.quantization == "int4-experts" and k2.quantization == "fp8-block128"
    assert (spec.num_experts, spec.first_k_dense, spec.kv_lora_rank, spec.routed_scaling_factor) == (384, 1, 512, 2.827)
    assert spec.rope_scaling["rope_type"] == "yarn" and spec.rope_scaling["factor"] == 64.0


def _wrapped(change: dict | None = None, text: dict | None = None) -> dict:
    cfg = _cfg("llama-4-maverick.json")
    cfg["text_config"].update(text or {})
    cfg.update(change or {})
    return cfg


@pytest.mark.parametrize("cfg, message", [
    (_wrapped({"vision_lora_rank": 8}), "'vision_lora_rank' is not implemented for the Llama4ForConditionalGeneration"),
    (_wrapped({"tie_word_embeddings": True}, {"tie_word_embeddings": False}), "tie_word_embeddings differs"),
    (_wrapped({"quantization_config": {"quant_method": "fp8", "weight_block_size": [128, 128]}}),
     "quantization_config differs"),
    (_wrapped(text={"add_cross_attention": True}), "'add_cross_attention'"),
    (_wrapped({"text_config": 3}), "without a text_config object"),
    (_wrapped(text={"interleave_moe_layer_step": 3}), None),
])
def test_wrapper_keys_that_change_text_decoding_are_refused_by_name(cfg, message):
    if message is None:                                     # a text key: the text decoder's (every 3rd layer MoE)
        assert ModelSpec.from_config(cfg, name="m").layer_kinds()[:6] == ["dense", "dense", "moe"] * 2
        return
    with pytest.raises(SpecError, match=message):
        ModelSpec.from_config(cfg, name="m")


def test_gemma4_runs_its_text_decoder_with_the_towers_named():
    """Gemma-4-31B's text keys (as public Gemma-4 loaders' fixtures quote them; HF Gemma4TextConfig's fields)."""
    text = {"attention_bias": False, "attention_dropout": 0.0, "attention_k_eq_v": True, "dtype": "bfloat16",
            "enable_moe_block": False, "final_logit_softcapping": 30.0, "global_head_dim": 512, "head_dim": 256,
            "hidden_activation": "gelu_pytorch_tanh", "hidden_size": 5376, "hidden_size_per_layer_input": 0,
            "intermediate_size": 21504, "layer_types": (["sliding_attention"] * 5 + ["full_attention"]) * 10,
            "max_position_embeddings": 262144, "model_type": "gemma4_text", "num_attention_heads": 32,
            "num_global_key_value_heads": 4, "num_hidden_layers": 60, "num_key_value_heads": 16,
            "num_kv_shared_layers": 0, "rms_norm_eps": 1e-6,
            "rope_parameters": {"full_attention": {"partial_rotary_factor": 0.25, "rope_theta": 1e6,
                                                   "rope_type": "proportional"},
                                "sliding_attention": {"rope_theta": 1e4, "rope_type": "default"}},
            "sliding_window": 1024, "tie_word_embeddings": True, "use_double_wide_mlp": False, "vocab_size": 262144,
            "vocab_size_per_layer_input": 262144}
    cfg = {"architectures": ["Gemma4ForConditionalGeneration"], "model_type": "gemma4", "text_config": text,
           "tie_word_embeddings": True, "vision_config": {"model_type": "gemma4_vision"}, "audio_config": None,
           "image_token_id": 258880, "boi_token_id": 255999}
    spec = ModelSpec.from_config(cfg, name="gemma-4-31b")
    assert spec.family == "gemma4" and spec.k_eq_v and spec.global_head_dim == 512 and spec.rope_proportion == 0.25
    assert [spec.layer_kv_heads(i) for i in (0, 5)] == [16, 4]
    assert [spec.layer_head_dim(i) for i in (0, 5)] == [256, 512]
    assert spec.extra["text_only"].startswith("Gemma4ForConditionalGeneration: vision_config and audio_config")
    assert spec == ModelSpec.from_name("gemma-4-31b").replace(name="gemma-4-31b")      # the shipped config
    with pytest.raises(SpecError, match="enable_moe_block needs num_experts, top_k_experts"):
        ModelSpec.from_config({**cfg, "text_config": {**text, "enable_moe_block": True}}, name="gemma-4-26b-a4b")
    moe = ModelSpec.from_config({**cfg, "text_config": {**text, "enable_moe_block": True, "num_experts": 128,
                                                        "top_k_experts": 8, "moe_intermediate_size": 704}}, name="m")
    assert moe.is_moe and moe.num_experts_per_tok == 8 and moe.shared_intermediate_size == 21504
    with pytest.raises(SpecError, match="'audio_soft_tokens' is not implemented for the Gemma4ForConditional"):
        ModelSpec.from_config({**cfg, "audio_soft_tokens": 188}, name="m")


def test_a_wrapped_checkpoint_round_trips_under_language_model(tmp_path):
    spec = ModelSpec.from_name("llama-4-maverick+tiny")
    model = build_model(spec, seed=3)
    path = tmp_path / "model.safetensors"
    save_weights(model, path)
    from safetensors import safe_open
    with safe_open(str(path), "pt") as f:
        names = set(f.keys())
    assert names and all(n.startswith("language_model.") for n in names)
    assert "language_model.model.layers.0.feed_forward.gate_proj.weight" in names           # the dense layer
    assert "language_model.model.layers.1.feed_forward.router.weight" in names               # the MoE layer
    loaded = build_model(spec, weights=path)
    assert all(torch.equal(loaded.params[k], v) for k, v in model.params.items())


def test_int4_experts_unpack_as_compressed_tensors_packs_them():
    """pack-quantized: value + 8 in 4 bits, 8 per int32, the first value in the lowest bits (written here with
    Python integers, independently of the loader's shifts)."""
    g = torch.Generator().manual_seed(0)
    out, inp = 3, 64
    q = torch.randint(-8, 8, (out, inp), generator=g)
    scale = torch.rand(out, inp // 32, generator=g) + 0.5
    packed = torch.zeros(out, inp // 8, dtype=torch.int32)
    for r in range(out):
        for c in range(inp // 8):
            word = sum((int(q[r, 8 * c + j]) + 8) << (4 * j) for j in range(8))
            packed[r, c] = word - (1 << 32) if word >= 1 << 31 else word              # as a signed int32
    want = q.float() * scale.repeat_interleave(32, 1)
    assert torch.equal(unpack_int4(packed, scale.to(torch.bfloat16).float()), q.float() *
                       scale.to(torch.bfloat16).float().repeat_interleave(32, 1))
    torch.testing.assert_close(unpack_int4(packed, scale), want)


# one value the key takes in published configs that leaves the math unchanged, and one that would change it
SAMPLES = {
    "qkv_bias": (False, True), "o_proj_bias": (False, True), "sliding_window": (None, 4096),
    "sliding_window_size": (None, 512), "use_sliding_window": (False, True), "attention_chunk_size": (None, 8192),
    "layer_types": (["full_attention"] * 2, ["full_attention", "sliding_attention"]),
    "attn_logit_softcapping": (None, 50.0), "final_logit_softcapping": (None, 30.0),
    "use_bidirectional_attention": (False, True), "attention_output_gate": (False, True),
    "shared_expert_intermediate_size": (0, 1024), "n_shared_experts": (0, 1), "num_shared_experts": (None, 2),
    "use_qk_norm": (False, True), "embedding_multiplier": (1.0, 12.0), "residual_multiplier": (1.0, 0.22),
    "logits_scaling": (1.0, 8.0), "for_llm_compressor": (False, True),
}


@pytest.mark.parametrize("key", sorted(NEUTRAL))
def test_each_neutral_value_is_accepted_and_the_others_refused_by_name(key):
    base = _cfg("tiny-dense.json")                          # a Llama: implements none of these keys but two
    if key in FAMILY_KEYS["llama"]:
        assert key in ("attention_bias", "mlp_bias")        # implemented: checked by config_keys.VALUES instead
        return
    neutral, other = SAMPLES[key]
    ModelSpec.from_config({**base, key: neutral}, name="t")
    with pytest.raises(SpecError, match=f"config key '{key}' = .* is not implemented for llama .*neutral value") as e:
        ModelSpec.from_config({**base, key: other}, name="t")
    assert len(str(e.value).splitlines()) == 1


def test_neutral_values_depend_on_the_family_where_the_math_does():
    coder = _cfg("qwen3-coder-480b.json")
    assert coder["qkv_bias"] is False and coder["use_qk_norm"] is True
    assert ModelSpec.from_config(coder, name="c").qk_norm == "per_head"     # Qwen3 always normalises q and k
    for change, key in (({"qkv_bias": True}, "qkv_bias"), ({"use_qk_norm": False}, "use_qk_norm"),
                        ({"shared_expert_intermediate_size": 2560}, "shared_expert_intermediate_size")):
        with pytest.raises(SpecError, match=f"'{key}' = .* is not implemented for qwen3_moe"):
            ModelSpec.from_config({**coder, **change}, name="c")
    assert set(FAMILY_NEUTRAL["qwen3_moe"]) == {"use_qk_norm"}


def _tkcc(*args):
    import subprocess
    import sys
    return subprocess.run([sys.executable, "-m", "compiler", *args], capture_output=True, text=True, timeout=120)


def test_the_cli_names_the_vision_tower_in_one_line_and_refuses_an_incomplete_gemma4_moe_with_one(tmp_path):
    cand = tmp_path / "c.py"
    cand.write_text("OVERRIDES = {\n")                        # refused by the static check: no engine starts
    out = _tkcc("candidate", "check", str(cand), "--model", str(CONFIG_DIR / "llama-4-maverick.json"), "--tiny",
                "--device", "cpu")
    assert out.returncode == 1, out.stderr
    notes = [line for line in out.stderr.splitlines() if "not compiled" in line]
    assert notes == ["Llama4ForConditionalGeneration: vision_config (the Llama-4 vision encoder and "
                     "multi_modal_projector) not compiled; text decode only"]
    gemma4 = tmp_path / "config.json"
    cfg = json.loads((CONFIG_DIR / "gemma-4-31b.json").read_text())
    cfg["text_config"]["enable_moe_block"] = True                  # the MoE block without its experts' keys
    gemma4.write_text(json.dumps(cfg))
    out = _tkcc("candidate", "check", str(cand), "--model", str(gemma4), "--tiny")
    assert out.returncode == 2 and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1 and "enable_moe_block needs num_experts" in out.stderr


def test_a_text_key_inside_the_wrapper_is_checked_as_the_text_decoders():
    with pytest.raises(SpecError, match="'for_llm_compressor' = True is not implemented for llama4"):
        ModelSpec.from_config(_wrapped(text={"for_llm_compressor": True}), name="m")
    with pytest.raises(SpecError, match="'attention_bias' = True is not implemented"):
        ModelSpec.from_config(_wrapped(text={"attention_bias": True}), name="m")


def test_hf_serialised_defaults_are_dropped_once_the_ones_that_change_the_model_are_off():
    base = {**_cfg("tiny-dense.json"), "_name_or_path": "org/model", "torchscript": False, "id2label": {"0": "A"}}
    assert ModelSpec.from_config(base, name="t") == ModelSpec.from_config(_cfg("tiny-dense.json"), name="t")
    with pytest.raises(SpecError, match="'is_encoder_decoder' = True is not implemented"):
        ModelSpec.from_config({**base, "is_encoder_decoder": True}, name="t")
