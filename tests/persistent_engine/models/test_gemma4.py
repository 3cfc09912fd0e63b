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
from persistent_engine.inputs.workloads import make_workload

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

# the MoE size's layout (26B-A4B: the dense MLP beside 128 experts of 704, top 8): 8 experts of 16, top 3
MOE = dict(TEXT, enable_moe_block=True, num_experts=8, top_k_experts=3, moe_intermediate_size=16)


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


@pytest.mark.parametrize("text", [TEXT, dict(TEXT, attention_k_eq_v=False), SMALL, MOE],
                         ids=["k_eq_v", "own_v", "small", "moe"])
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


@pytest.mark.parametrize("text", [TEXT, SMALL, MOE], ids=["k_eq_v", "small", "moe"])
def test_gemma4_decode_after_prefill_equals_the_longer_prefill(text):
    model = hf_model(text, seed=3)
    ids = torch.randint(0, 96, (1, 12), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        want = model(ids).logits[:, -1]
    spec = _spec(text)
    dec = _decoder(spec, dict(model.state_dict()))
    cache = dec.alloc_cache(1, 16, fill="zeros")
    assert cache.k[0].shape[-2:] == (2, 8) and cache.k[1].shape[-2:] == ((2, 16) if text is SMALL else (1, 16))
    assert sorted(cache.k) == [0, 1, 2, 3]                     # the sharing layers keep no cache
    wl = make_workload(dec, WorkloadPoint("prefill", 1, 0, 11), token_ids=ids[0, :11], cache=cache)
    dec.step(wl)
    wl = make_workload(dec, WorkloadPoint("decode", 1, 11, 1), token_ids=ids[0, 11:], cache=cache)
    torch.testing.assert_close(dec.step(wl), want, rtol=2e-4, atol=2e-4)


@pytest.mark.parametrize("change, message", [
    ({"num_kv_shared_layers": 3}, "without an earlier layer of that kind"),
    ({"hidden_size_per_layer_input": 4, "vocab_size_per_layer_input": 50}, "differs from vocab_size 96"),
    ({"enable_moe_block": True, "num_experts": 8, "top_k_experts": 9, "moe_intermediate_size": 16},
     "top_k_experts \\(1..num_experts\\)"),
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


@pytest.mark.parametrize("wrong", ["silu_experts", "no_expert_scale", "no_router_scale"])
def test_a_wrong_expert_or_router_variant_misses_hf(wrong, monkeypatch):
    """The MoE block's details matter: SwiGLU experts, a router without per_expert_scale, or one without its input
    scale each give other logits than HF's. (Leaving the top-k weights unrenormalised does not: it scales a token's
    expert sum by one number, which post_feedforward_layernorm_2 divides out.)"""
    from persistent_engine.models.gemma4 import Gemma4MoE
    from persistent_engine.ops import moe as moe_ops
    from persistent_engine.ops.registry import override

    model = hf_model(MOE, seed=5)
    ids = torch.randint(0, 96, (1, 10), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        want = model(ids).logits[:, -1]
    dec = _decoder(_spec(MOE), dict(model.state_dict()))
    wl = make_workload(dec, WorkloadPoint("prefill", 1, 0, 10), token_ids=ids[0], cache=dec.alloc_cache(1, 16))
    torch.testing.assert_close(dec.step(wl), want, rtol=2e-4, atol=2e-4)
    mapping = {}
    if wrong == "silu_experts":
        mapping["moe_experts_gelu"] = moe_ops.moe_experts
    elif wrong == "no_router_scale":
        for layer in dec.blocks:
            layer.mlp.router_norm = torch.full_like(layer.mlp.router_norm, 32 ** -0.5)
    else:
        right = Gemma4MoE.route
        monkeypatch.setattr(Gemma4MoE, "route", lambda self, r: (lambda w, i: (w / self.expert_scale.float()[i], i))(
            *right(self, r)))
    with override(mapping):
        got = dec.step(wl)
    assert (got - want).abs().max() > 1e-3


def test_the_moe_size_counts_experts_and_keeps_its_block_at_tiny_size():
    spec = _spec(MOE)
    assert spec.is_moe and spec.layer_kinds() == ["moe"] * 4 and spec.shared_intermediate_size == 48
    tiny = spec.scaled_down()
    assert tiny.is_moe and tiny.num_experts == 8 and tiny.num_experts_per_tok == 3
    assert tiny.shared_intermediate_size == tiny.intermediate_size          # the dense MLP beside the experts


def test_gelu_experts_equal_hf_experts_on_every_path():
    """``moe_experts_gelu`` on its gather (T k < E / 3), dense and grouped (T >= 512) paths equals HF's own
    ``Gemma4TextExperts`` loop over the experts hit, on the op's examples."""
    from transformers.models.gemma4 import Gemma4TextConfig
    from transformers.models.gemma4.modeling_gemma4 import Gemma4TextExperts

    from persistent_engine.ops import registry

    op = registry.get("moe_experts_gelu")
    for shape in op.examples:
        x, w13, w2, weights, ids = op.make_inputs(shape, torch.float32, "cpu", 7)
        experts = Gemma4TextExperts(Gemma4TextConfig(**dict(MOE, hidden_size=shape["H"], num_experts=shape["E"],
                                                            moe_intermediate_size=shape["I"])))
        with torch.no_grad():
            experts.gate_up_proj.copy_(w13)
            experts.down_proj.copy_(w2)
            want = experts(x, ids, weights)
        torch.testing.assert_close(registry.call("moe_experts_gelu", x, w13, w2, weights, ids), want,
                                   rtol=1e-4, atol=1e-4)


def test_a_wrapped_26b_a4b_checkpoint_round_trips_with_its_experts(tmp_path):
    from safetensors import safe_open

    from persistent_engine.models.decoder import build_model
    from persistent_engine.models.weights import load_weights, save_weights

    spec = ModelSpec.from_name("gemma-4-26b-a4b+tiny")             # 16 experts, top 4, the dense MLP beside them
    model = build_model(spec, seed=4)
    save_weights(model, tmp_path / "model.safetensors")
    with safe_open(str(tmp_path / "model.safetensors"), "pt") as f:
        names = set(f.keys())
    m = "model.language_model.layers.1."
    assert {m + "experts.gate_up_proj", m + "router.per_expert_scale", m + "mlp.gate_proj.weight",
            m + "pre_feedforward_layernorm_2.weight"} <= names
    loaded = load_weights(spec, list(range(spec.num_layers)), tmp_path / "model.safetensors")
    assert loaded.keys() == model.params.keys() and all(torch.equal(loaded[k], model.params[k]) for k in loaded)
