"""Gemma-4 text against Hugging Face transformers' own modeling_gemma4.py (``Gemma4ForCausalLM``): a tiny model with
random weights, loaded through tkcc's checkpoint names, gives HF's logits — sliding layers of one head dim and KV
head count, full layers of another with K = V (or their own V) and proportional rope, the V norm, plain-w norms and
the per-layer scalar; a decode after a prefill gives the longer prefill's logits; the sizes count HF's parameters."""

import pytest
import torch

from persistent_engine.io_struct import WorkloadPoint
from persistent_engine.models.decoder import make_decoder
from persistent_engine.models.spec import ModelSpec, SpecError
from persistent_engine.models.weights import hf_to_internal, internal_to_hf
from persistent_engine.workloads import make_workload

transformers = pytest.importorskip("transformers")
pytest.importorskip("transformers.models.gemma4")

TEXT = dict(vocab_size=96, hidden_size=32, intermediate_size=48, num_hidden_layers=4, num_attention_heads=4,
            num_key_value_heads=2, num_global_key_value_heads=1, head_dim=8, global_head_dim=16, rms_norm_eps=1e-6,
            max_position_embeddings=64, sliding_window=5, attention_k_eq_v=True, final_logit_softcapping=4.0,
            layer_types=["sliding_attention", "full_attention", "sliding_attention", "full_attention"],
            rope_parameters={"full_attention": {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                                "rope_theta": 10000.0},
                             "sliding_attention": {"rope_type": "default", "rope_theta": 100.0}},
            hidden_size_per_layer_input=0, num_kv_shared_layers=0, enable_moe_block=False, tie_word_embeddings=True)


def hf_model(text: dict, seed: int):
    from transformers.models.gemma4 import Gemma4ForCausalLM, Gemma4TextConfig

    model = Gemma4ForCausalLM(Gemma4TextConfig(**text))
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():            # norms scale by w: values around 1
            big = p.dim() > 1
            p.copy_(torch.randn(p.shape, generator=g) * (p.shape[-1] ** -0.5 if big else 0.3) + (0 if big else 1))
        for name, b in model.named_buffers():
            if name.endswith("layer_scalar"):
                b.copy_(0.5 + torch.rand(b.shape, generator=g))
    return model.eval()


def _spec(text: dict) -> ModelSpec:
    return ModelSpec.from_config({**text, "architectures": ["Gemma4ForCausalLM"], "model_type": "gemma4_text"},
                                 name="gemma4-test")


def _decoder(spec: ModelSpec, checkpoint: dict):
    layers = list(range(spec.num_layers))
    return make_decoder(spec, layers, hf_to_internal(spec, layers, checkpoint.__getitem__), "cpu", torch.float32)


@pytest.mark.parametrize("k_eq_v", [True, False], ids=["k_eq_v", "own_v"])
def test_gemma4_matches_hf(k_eq_v, tkcc_last_logits):
    text = dict(TEXT, attention_k_eq_v=k_eq_v)
    model = hf_model(text, seed=1)
    ids = torch.randint(0, 96, (2, 14), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = model(ids).logits[:, -1]
    spec = _spec(text)
    assert [spec.layer_head_dim(i) for i in range(4)] == [8, 16, 8, 16]
    assert [spec.layer_kv_heads(i) for i in range(4)] == ([2, 1, 2, 1] if k_eq_v else [2, 2, 2, 2])
    checkpoint = dict(model.state_dict())
    got = tkcc_last_logits(spec, checkpoint, ids)
    torch.testing.assert_close(got, want, rtol=2e-4, atol=2e-4)
    assert want.abs().max() < text["final_logit_softcapping"]
    # tkcc's checkpoint names are HF's, each tensor equal (the K = V layers have no v_proj)
    back = internal_to_hf(spec, list(range(4)), hf_to_internal(spec, list(range(4)), checkpoint.__getitem__))
    assert back.keys() == {k for k in checkpoint if k != "lm_head.weight"}
    assert all(torch.equal(back[k], checkpoint[k]) for k in back)
    # every parameter counted (HF's layer_scalar, a buffer, is not)
    assert spec.total_params() == sum(p.numel() for p in model.parameters())


def test_gemma4_decode_after_prefill_equals_the_longer_prefill():
    text = TEXT
    model = hf_model(text, seed=3)
    ids = torch.randint(0, 96, (1, 12), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        want = model(ids).logits[:, -1]
    spec = _spec(text)
    dec = _decoder(spec, dict(model.state_dict()))
    cache = dec.alloc_cache(1, 16, fill="zeros")
    assert cache.k[1].shape[-2:] == (1, 16) and cache.k[0].shape[-2:] == (2, 8)   # per layer kind: Hk, Dh
    wl = make_workload(dec, WorkloadPoint("prefill", 1, 0, 11), token_ids=ids[0, :11], cache=cache)
    dec.step(wl)
    wl = make_workload(dec, WorkloadPoint("decode", 1, 11, 1), token_ids=ids[0, 11:], cache=cache)
    torch.testing.assert_close(dec.step(wl), want, rtol=2e-4, atol=2e-4)


@pytest.mark.parametrize("key, value, message", [
    ("num_kv_shared_layers", 2, "KV shared across layers"),
    ("hidden_size_per_layer_input", 16, "per-layer input embeddings"),
    ("enable_moe_block", True, "the MoE block"),
    ("use_bidirectional_attention", "all", "decodes causally"),
    ("rope_theta", 1e4, "per layer type"),
])
def test_what_tkcc_does_not_implement_is_refused_by_name(key, value, message):
    with pytest.raises(SpecError, match=message):
        _spec(dict(TEXT, **{key: value}))
