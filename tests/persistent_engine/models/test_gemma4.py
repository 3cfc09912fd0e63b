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
# the small sizes' layout (E2B: K/V shared by the last 20 of 35 layers, per-layer inputs of 256, double-wide MLPs
# there, no K = V): layers 4 and 5 attend layers 2 and 3's K/V
SMALL = dict(TEXT, num_hidden_layers=6, layer_types=["sliding_attention", "full_attention"] * 3,
             attention_k_eq_v=False,
             num_global_key_value_heads=None, num_kv_shared_layers=2, hidden_size_per_layer_input=4,
             vocab_size_per_layer_input=96, use_double_wide_mlp=True)


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


@pytest.mark.parametrize("text", [TEXT, dict(TEXT, attention_k_eq_v=False), SMALL], ids=["k_eq_v", "own_v", "small"])
def test_gemma4_matches_hf(text, tkcc_last_logits):
    model = hf_model(text, seed=1)
    ids = torch.randint(0, 96, (2, 14), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = model(ids).logits[:, -1]
    spec = _spec(text)
    n = spec.num_layers
    assert [spec.layer_head_dim(i) for i in range(n)] == [8, 16] * (n // 2)
    assert [spec.layer_kv_heads(i) for i in range(4)] == ([2, 1, 2, 1] if text["attention_k_eq_v"] else [2, 2, 2, 2])
    assert [spec.kv_source(i) for i in range(n)] == ([0, 1, 2, 3, 2, 3] if text is SMALL else [0, 1, 2, 3])
    checkpoint = dict(model.state_dict())
    got = tkcc_last_logits(spec, checkpoint, ids)
    torch.testing.assert_close(got, want, rtol=2e-4, atol=2e-4)
    assert want.abs().max() < text["final_logit_softcapping"]
    # tkcc's checkpoint names are HF's, each tensor equal (the K = V layers have no v_proj, sharing layers no k/v)
    back = internal_to_hf(spec, list(range(n)), hf_to_internal(spec, list(range(n)), checkpoint.__getitem__))
    assert back.keys() == {k for k in checkpoint if k != "lm_head.weight"}
    assert all(torch.equal(back[k], checkpoint[k]) for k in back)
    # every parameter counted (HF's layer_scalar, a buffer, is not)
    assert spec.total_params() == sum(p.numel() for p in model.parameters())


@pytest.mark.parametrize("text", [TEXT, SMALL], ids=["k_eq_v", "small"])
def test_gemma4_decode_after_prefill_equals_the_longer_prefill(text):
    model = hf_model(text, seed=3)
    ids = torch.randint(0, 96, (1, 12), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        want = model(ids).logits[:, -1]
    spec = _spec(text)
    dec = _decoder(spec, dict(model.state_dict()))
    cache = dec.alloc_cache(1, 16, fill="zeros")
    assert cache.k[0].shape[-2:] == (2, 8) and cache.k[1].shape[-2:] == ((1, 16) if text is TEXT else (2, 16))
    assert sorted(cache.k) == [0, 1, 2, 3]                     # the sharing layers keep no cache
    wl = make_workload(dec, WorkloadPoint("prefill", 1, 0, 11), token_ids=ids[0, :11], cache=cache)
    dec.step(wl)
    wl = make_workload(dec, WorkloadPoint("decode", 1, 11, 1), token_ids=ids[0, 11:], cache=cache)
    torch.testing.assert_close(dec.step(wl), want, rtol=2e-4, atol=2e-4)


@pytest.mark.parametrize("change, message", [
    ({"num_kv_shared_layers": 3}, "without an earlier layer of that kind"),
    ({"hidden_size_per_layer_input": 4, "vocab_size_per_layer_input": 50}, "differs from vocab_size 96"),
    ({"enable_moe_block": True}, "the MoE block"),
    ({"use_bidirectional_attention": "all"}, "decodes causally"),
    ({"rope_theta": 1e4}, "per layer type"),
])
def test_what_tkcc_does_not_implement_is_refused_by_name(change, message):
    with pytest.raises(SpecError, match=message):
        _spec(dict(TEXT, **change))


def test_a_slice_holds_the_layers_whose_kv_it_reads():
    spec = _spec(SMALL)
    assert spec.covering_layers() == [0, 1, 2, 3, 4, 5]       # sharing layers 4, 5 read layers 2, 3's caches
    with pytest.raises(SpecError, match="layer 5 attends layer 3's K/V"):
        spec.check_slice([0, 5])
    tiny = spec.scaled_down()                                  # --tiny keeps both sharing layers and the inputs
    assert tiny.kv_shared_layers == 2 and [tiny.kv_source(i) for i in range(4)] == [0, 1, 0, 1]
    assert tiny.per_layer_input == 8 and tiny.double_wide_mlp


def test_a_wrapped_gemma4_checkpoint_round_trips_under_model_language_model(tmp_path):
    from safetensors import safe_open

    from persistent_engine.models.decoder import build_model
    from persistent_engine.models.weights import load_weights, save_weights

    spec = ModelSpec.from_name("gemma-4-e2b+tiny")                 # wrapped: K/V sharing, per-layer inputs
    model = build_model(spec, seed=3)
    save_weights(model, tmp_path / "model.safetensors")
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    assert "model.language_model.embed_tokens_per_layer.weight" in names
    assert "model.language_model.layers.3.self_attn.k_proj.weight" not in names       # layer 3 reads layer 1's K/V
    assert "model.language_model.layers.1.self_attn.v_proj.weight" in names
    loaded = load_weights(spec, list(range(spec.num_layers)), tmp_path / "model.safetensors")
    assert loaded.keys() == model.params.keys() and all(torch.equal(loaded[k], model.params[k]) for k in loaded)
