"""Llama-4 text (Llama4ForCausalLM) against Hugging Face transformers' own modeling_llama4.py: a tiny model with
random weights, loaded through tkcc's checkpoint names (interleaved rope rows permuted to halves, transposed
experts), gives HF's logits — rope layers with L2 qk-norm and chunked attention, a NoPE layer with the query
temperature, dense and MoE layers (top-1 sigmoid router, input-scaled experts, shared expert); the chunked
attention op equals full attention restricted to each chunk."""

import pytest
import torch

from persistent_engine.models.spec import ModelSpec
from persistent_engine.models.weights import hf_to_internal, internal_to_hf
from persistent_engine.ops.attention import attention_prefill
from persistent_engine.ops.llama4 import attention_decode_chunked, attention_prefill_chunked

hf = pytest.importorskip("transformers.models.llama4.modeling_llama4")
from transformers import Llama4TextConfig  # noqa: E402

CFG = dict(architectures=["Llama4ForCausalLM"], model_type="llama4_text", vocab_size=96, hidden_size=32,
           intermediate_size=16, intermediate_size_mlp=40, num_hidden_layers=4, num_attention_heads=4,
           num_key_value_heads=2, head_dim=8, num_local_experts=4, num_experts_per_tok=1, interleave_moe_layer_step=2,
           rms_norm_eps=1e-5, rope_theta=10000.0, max_position_embeddings=64, attention_chunk_size=5,
           no_rope_layer_interval=2, use_qk_norm=True, attn_temperature_tuning=True, floor_scale=4, attn_scale=0.5,
           tie_word_embeddings=False)


def hf_model(cfg: dict, seed: int):
    model = hf.Llama4ForCausalLM(Llama4TextConfig(**{k: v for k, v in cfg.items() if k not in ("architectures",
                                                                                               "model_type")}))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            fan_in = p.shape[-2] if p.dim() == 3 else p.shape[-1]                    # experts store [E, in, out]
            p.copy_(torch.randn(p.shape, generator=g) * (fan_in ** -0.5 if p.dim() > 1 else 0.2) + (p.dim() == 1))
    return model.eval()




def test_llama4_matches_hf(tkcc_last_logits):
    model = hf_model(CFG, seed=1)
    ids = torch.randint(0, 96, (2, 13), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = model(ids).logits[:, -1]
    spec = ModelSpec.from_config(CFG, name="llama4-test")
    assert spec.rope_layers == (True, False, True, False) and spec.layer_kinds() == ["dense", "moe", "dense", "moe"]
    state = dict(model.state_dict())
    got = tkcc_last_logits(spec, state, ids)
    torch.testing.assert_close(got, want, rtol=2e-4, atol=2e-4)
    layers = list(range(4))                                 # the checkpoint names round-trip
    back = internal_to_hf(spec, layers, hf_to_internal(spec, layers, state.__getitem__))
    assert set(back) == set(state) and all(torch.equal(back[k], state[k]) for k in state)


def test_maverick_style_wrapper_runs_hf_text_decoder(tkcc_last_logits):
    """A Llama4ForConditionalGeneration config (Maverick's text keys: no qk-norm, dense and MoE layers interleaved)
    runs its text_config's decoder: HF's Llama4ForCausalLM logits, which the wrapper's language_model computes."""
    text = {**{k: v for k, v in CFG.items() if k != "architectures"}, "use_qk_norm": False, "num_local_experts": 8}
    model = hf_model(text, seed=4)
    ids = torch.randint(0, 96, (2, 11), generator=torch.Generator().manual_seed(5))
    with torch.no_grad():
        want = model(ids).logits[:, -1]
    wrapper = {"architectures": ["Llama4ForConditionalGeneration"], "model_type": "llama4", "image_token_index": 95,
               "text_config": {**text, "model_type": "llama4_text"}, "vision_config": {"model_type": "llama4_vision_model"}}
    spec = ModelSpec.from_config(wrapper, name="maverick-test")
    assert not spec.qk_l2_norm and spec.layer_kinds() == ["dense", "moe", "dense", "moe"] and spec.num_experts == 8
    torch.testing.assert_close(tkcc_last_logits(spec, dict(model.state_dict()), ids), want, rtol=2e-4, atol=2e-4)


@pytest.mark.parametrize("chunk", [4, 7])
def test_chunked_attention_is_full_attention_within_each_chunk(chunk):
    """Each query's output equals plain causal attention over the sequence cut at its chunk's start."""
    g = torch.Generator().manual_seed(3)
    hq, hk, d, bs, n = 4, 2, 8, 4, 13
    k, v, q = torch.randn(n, hk, d, generator=g), torch.randn(n, hk, d, generator=g), torch.randn(n, hq, d, generator=g)
    blocks = torch.tensor([[3, 0, 2, 1]], dtype=torch.int32)
    kc, vc = torch.zeros(4, bs, hk, d), torch.zeros(4, bs, hk, d)
    for j in range(n):
        kc[blocks[0, j // bs], j % bs], vc[blocks[0, j // bs], j % bs] = k[j], v[j]
    got = attention_prefill_chunked(q, kc, vc, blocks, torch.tensor([0, n], dtype=torch.int32),
                                    torch.tensor([n], dtype=torch.int32), 0.35, chunk)
    for p in range(n):
        start = p // chunk * chunk                          # this chunk's tokens as a sequence of their own
        sub_k, sub_v = torch.zeros(4, bs, hk, d), torch.zeros(4, bs, hk, d)
        for j in range(start, p + 1):
            sub_k[blocks[0, (j - start) // bs], (j - start) % bs] = k[j]
            sub_v[blocks[0, (j - start) // bs], (j - start) % bs] = v[j]
        want = attention_prefill(q[p:p + 1], sub_k, sub_v, blocks, torch.tensor([0, 1], dtype=torch.int32),
                                 torch.tensor([p - start + 1], dtype=torch.int32), 0.35)
        torch.testing.assert_close(got[p:p + 1], want, rtol=1e-5, atol=1e-5)
    dec = attention_decode_chunked(q[-1:], kc, vc, blocks, torch.tensor([n], dtype=torch.int32), 0.35, chunk)
    torch.testing.assert_close(dec, got[-1:], rtol=1e-5, atol=1e-5)
