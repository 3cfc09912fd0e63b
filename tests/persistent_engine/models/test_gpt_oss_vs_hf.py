"""gpt-oss (GptOssForCausalLM) against Hugging Face transformers' own modeling_gpt_oss.py: a tiny model with random
weights (biases and sinks included, a window below the prompt, a SwiGLU limit the activations reach), loaded
through tkcc's checkpoint names, gives HF's logits."""

import pytest
import torch

from persistent_engine.models.spec import ModelSpec

hf = pytest.importorskip("transformers.models.gpt_oss.modeling_gpt_oss")
from transformers import GptOssConfig  # noqa: E402


def tiny_config(**kw) -> dict:
    cfg = dict(architectures=["GptOssForCausalLM"], model_type="gpt_oss", vocab_size=96, hidden_size=64,
               intermediate_size=32, head_dim=16, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
               num_local_experts=8, num_experts_per_tok=2, experts_per_token=2, rms_norm_eps=1e-5,
               sliding_window=4, layer_types=["sliding_attention", "full_attention"], attention_bias=True,
               max_position_embeddings=131072, initial_context_length=4096, swiglu_limit=1.0, tie_word_embeddings=False,
               rope_parameters={"rope_type": "yarn", "factor": 32.0, "beta_fast": 32.0, "beta_slow": 1.0,
                                "truncate": False, "original_max_position_embeddings": 4096, "rope_theta": 10000.0})
    cfg.update(kw)
    return cfg


def randomize(model, seed: int):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            fan_in = p.shape[-2] if name.endswith(("gate_up_proj", "down_proj")) else p.shape[-1]
            std = fan_in ** -0.5 if p.dim() > 1 else 0.5
            p.copy_(torch.randn(p.shape, generator=g) * std + (1.0 if "norm" in name else 0.0))
    return model


@pytest.mark.parametrize("window", [4, 64])
def test_gpt_oss_matches_hf(window, tkcc_last_logits):
    cfg = tiny_config(sliding_window=window)
    hf_cfg = GptOssConfig(**cfg)
    hf_cfg._attn_implementation = "eager"
    model = randomize(hf.GptOssForCausalLM(hf_cfg).eval(), seed=1)
    ids = torch.randint(0, 96, (2, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = model(ids).logits[:, -1]
        gate_up = model.model.layers[0].mlp.experts.gate_up_proj
        assert (model.model.layers[0].post_attention_layernorm(model.model.embed_tokens(ids)) @ gate_up[0]).abs().max() > 2
    spec = ModelSpec.from_config(cfg, name="gpt-oss-test")
    assert spec.layer_windows == (window, 0) and spec.rope_theta == 10000.0 and spec.swiglu_limit == 1.0
    got = tkcc_last_logits(spec, dict(model.state_dict()), ids)
    torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)


def test_mxfp4_decode_matches_transformers_on_checkpoint_packs():
    """Random packs in the checkpoint layout ([E, rows, K/32, 16] and [E, rows, K/32], scales around 2^0):
    transformers' convert_moe_packed_tensors gives [E, K, rows] (x @ W); tkcc's decode the [E, rows, K] linear."""
    mx = pytest.importorskip("transformers.integrations.mxfp4")
    from persistent_engine.ops.mxfp4 import decode_mxfp4

    g = torch.Generator().manual_seed(0)
    blocks = torch.randint(0, 256, (3, 10, 4, 16), generator=g, dtype=torch.uint8)
    scales = torch.randint(120, 134, (3, 10, 4), generator=g, dtype=torch.uint8)
    want = mx.convert_moe_packed_tensors(blocks, scales, dtype=torch.float32).cpu()
    assert torch.equal(decode_mxfp4(blocks, scales, torch.float32), want.transpose(1, 2))
