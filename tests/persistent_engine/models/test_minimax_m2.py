"""MiniMax-M2.x (MiniMaxM2ForCausalLM; MiniMax-M2.5 and M2.7) against Hugging Face transformers' own
modeling_minimax_m2.py: a tiny model with random weights, in the published M2.7 config's key set (``attn_type_list``
included), loaded through tkcc's checkpoint names (block_sparse_moe.experts.{j}.w1/w3/w2, the correction bias), gives
HF's logits. ``attn_type_list``: kind 1 (full softmax attention) on every layer is M2.x's attention; kind 0
(MiniMax-Text-01's lightning attention) and malformed lists are refused with one line naming the layer."""

import json
import subprocess
import sys

import pytest
import torch

from persistent_engine.models.spec import CONFIG_DIR, ModelSpec, SpecError

hf = pytest.importorskip("transformers.models.minimax_m2.modeling_minimax_m2")
from transformers import MiniMaxM2Config  # noqa: E402

# the published MiniMaxAI/MiniMax-M2.7 config.json's keys (SOURCES.md), in its order
M27_KEYS = ["architectures", "attn_type_list", "auto_map", "dtype", "head_dim", "hidden_act", "hidden_size",
            "intermediate_size", "max_position_embeddings", "model_type", "mtp_transformer_layers",
            "num_attention_heads", "num_experts_per_tok", "num_hidden_layers", "num_key_value_heads",
            "num_local_experts", "num_mtp_modules", "qk_norm_type", "quantization_config", "rms_norm_eps",
            "rope_theta", "rotary_dim", "scoring_func", "shared_intermediate_size", "tie_word_embeddings",
            "transformers_version", "use_cache", "use_mtp", "use_qk_norm", "use_routing_bias", "vocab_size"]


def m27() -> dict:
    return json.loads((CONFIG_DIR / "minimax-m2.7.json").read_text())


def tiny_config(layers: int = 2) -> dict:
    """M2.7's config at toy size: every key kept (the fp8 quantization_config aside: HF builds bf16/fp32 here)."""
    cfg = {k: v for k, v in m27().items() if k != "quantization_config"}
    cfg.update(vocab_size=96, hidden_size=32, intermediate_size=24, num_hidden_layers=layers, num_attention_heads=4,
               num_key_value_heads=2, head_dim=16, rotary_dim=8, num_local_experts=6, num_experts_per_tok=2,
               max_position_embeddings=64, attn_type_list=[1] * layers)
    return cfg


def checkpoint_names(state: dict[str, torch.Tensor], inter: int) -> dict[str, torch.Tensor]:
    """HF v5's in-memory layout (mlp.experts.gate_up_proj [E, 2I, H], mlp.gate, mlp.e_score_correction_bias) back
    to the published checkpoint's block_sparse_moe.{gate, e_score_correction_bias, experts.{j}.w1 / w3 / w2}."""
    out = {}
    for k, v in state.items():
        base = k.replace(".mlp.experts.gate_up_proj", ".block_sparse_moe.experts.").replace(
            ".mlp.experts.down_proj", ".block_sparse_moe.experts.")
        if k.endswith("gate_up_proj"):
            for j in range(v.shape[0]):
                out[f"{base}{j}.w1.weight"], out[f"{base}{j}.w3.weight"] = v[j, :inter], v[j, inter:]
        elif k.endswith("down_proj"):
            for j in range(v.shape[0]):
                out[f"{base}{j}.w2.weight"] = v[j]
        else:
            out[k.replace(".mlp.", ".block_sparse_moe.")] = v
    return out


def test_the_shipped_config_is_the_hubs_key_set_with_full_attention_on_every_layer():
    cfg = m27()
    assert list(cfg) == M27_KEYS
    assert cfg["attn_type_list"] == [1] * cfg["num_hidden_layers"] == [1] * 62
    spec, m25 = ModelSpec.from_name("minimax-m2.7"), ModelSpec.from_name("minimax-m2.5")
    # the same architecture as M2.5 (tkcc's copy), with M2.7's 204800 positions
    assert spec.replace(name=m25.name, max_position_embeddings=m25.max_position_embeddings) == m25
    assert (spec.family, spec.num_layers, spec.rotary_dim, spec.qk_norm, spec.max_position_embeddings) == \
        ("minimax_m2", 62, 64, "per_layer", 204800)


def test_minimax_m2_7_matches_hf(tkcc_last_logits):
    cfg = tiny_config()
    model = hf.MiniMaxM2ForCausalLM(MiniMaxM2Config(**cfg)).eval()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * (p.shape[-1] ** -0.5 if p.dim() > 1 else 0.2) + (p.dim() == 1))
        for layer in model.model.layers:               # a correction bias that changes which experts are picked
            layer.mlp.e_score_correction_bias.copy_(torch.randn(6, generator=g) * 0.5)
    ids = torch.randint(0, 96, (2, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = model(ids).logits[:, -1]
    spec = ModelSpec.from_config(cfg, name="m27-test")
    assert spec.family == "minimax_m2" and spec.rotary_dim == 8 and spec.routing_bias
    got = tkcc_last_logits(spec, checkpoint_names(model.state_dict(), cfg["intermediate_size"]), ids)
    torch.testing.assert_close(got, want, rtol=2e-4, atol=2e-4)


@pytest.mark.parametrize("kinds, message", [
    ([1, 1, 1, 1, 1, 0] + [1] * 56, r"attn_type_list\[5\] = 0 asks for lightning \(linear\) attention"),
    ([1] * 61, "attention kind for each of the 62 layers"),
    ([1] * 61 + [2], r"attn_type_list\[61\] = 2 is not an attention kind"),
    ("1" * 62, "attention kind for each of the 62 layers"),
])
def test_attention_kinds_other_than_full_softmax_are_refused_by_name(kinds, message):
    with pytest.raises(SpecError, match=message):
        ModelSpec.from_config({**m27(), "attn_type_list": kinds}, name="m27")


def test_the_cli_refuses_a_lightning_layer_in_one_line(tmp_path):
    cfg = m27()
    cfg["attn_type_list"][7] = 0
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    cand = tmp_path / "c.py"
    cand.write_text("OVERRIDES = {}\n")
    out = subprocess.run([sys.executable, "-m", "compiler", "candidate", "check", str(cand), "--model",
                          str(tmp_path / "config.json"), "--tiny"], capture_output=True, text=True, timeout=120)
    assert out.returncode == 2, out.stderr
    assert "Traceback" not in out.stderr and "attn_type_list[7] = 0" in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_the_alias_list_names_minimax_m2_7_and_minimax_stays_m3():
    """``minimax`` names the newest release, MiniMax-M3 (after M2.7); M2.7 has its versioned alias, listed with its
    release where ``tkcc doctor`` and ``--help`` list the aliases (``alias_help``)."""
    from persistent_engine.models.aliases import ALIASES, alias_help

    assert ALIASES["minimax-m2.7"] == "minimax-m2.7.json" and ALIASES["minimax"] == "minimax-m3.json"
    assert "minimax (MiniMax-M3)" in alias_help() and "minimax-m2.7 (MiniMax-M2.7)" in alias_help()
