"""MiMo-V2-Flash (``MiMoV2FlashForCausalLM``): the bundled config's figures, the configs tkcc refuses (one line each),
and a tiny model's prefill + decode through the engine against a full-sequence forward written here from HF
transformers' modeling_mimo_v2_flash.py (eager attention with an explicit sliding-window mask and the sink column,
V scaled by attention_value_scale, partial rotate-half rotary per layer kind, sigmoid + bias grouped top-k routing)."""

import copy

import pytest
import torch

from persistent_engine.io_struct import WorkloadPoint
from persistent_engine.models.decoder import build_model, make_decoder
from persistent_engine.models.spec import ModelSpec, SpecError
from persistent_engine.models.weights import hf_to_internal, internal_to_hf, param_specs, save_weights
from persistent_engine.ops import registry
from persistent_engine.parallel import ParallelConfig, ParallelError, check_supported
from persistent_engine.inputs.workloads import make_workload

# the Hub spelling at toy size: layers [full dense, window MoE, window MoE, full MoE], 2 expert groups
TINY = {"architectures": ["MiMoV2FlashForCausalLM"], "model_type": "mimo_v2_flash", "vocab_size": 80,
        "hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 4, "num_attention_heads": 4,
        "num_key_value_heads": 1, "head_dim": 16, "v_head_dim": 8, "swa_num_attention_heads": 4,
        "swa_num_key_value_heads": 2, "swa_head_dim": 16, "swa_v_head_dim": 8, "partial_rotary_factor": 0.5,
        "rope_theta": 5000000, "swa_rope_theta": 100.0, "sliding_window": 5, "sliding_window_size": 5,
        "attention_chunk_size": 5, "hybrid_layer_pattern": [0, 1, 1, 0], "moe_layer_freq": [0, 1, 1, 1],
        "add_swa_attention_sink_bias": True, "add_full_attention_sink_bias": False, "n_routed_experts": 8,
        "num_experts_per_tok": 2, "moe_intermediate_size": 16, "n_shared_experts": None, "n_group": 2,
        "topk_group": 1, "scoring_func": "sigmoid", "topk_method": "noaux_tc", "norm_topk_prob": True,
        "routed_scaling_factor": None, "layernorm_epsilon": 1e-5, "attention_value_scale": 0.707,
        "max_position_embeddings": 64, "tie_word_embeddings": False, "num_nextn_predict_layers": 1}


def test_the_bundled_config_parses_to_the_published_architecture():
    spec = ModelSpec.from_name("mimo")
    assert ModelSpec.from_name("mimo-v2-flash") == spec.replace(name="mimo-v2-flash")
    assert (spec.family, spec.num_layers, spec.hidden_size, spec.vocab_size) == ("mimo_v2_flash", 48, 4096, 152576)
    full = [i for i in range(48) if spec.layer_window(i) == 0]
    assert full == [0, 5, 11, 17, 23, 29, 35, 41, 47]                    # layer 0 and every 6th: 9 full, 39 windowed
    assert {spec.layer_window(i) for i in range(48)} - {0} == {128}
    assert {(spec.layer_kv_heads(i), spec.layer_sinks(i)) for i in full} == {(4, False)}
    assert {(spec.layer_kv_heads(i), spec.layer_sinks(i)) for i in range(48) if i not in full} == {(8, True)}
    assert (spec.num_heads, spec.head_dim, spec.gqa_v_head_dim, spec.rotary_dim) == (64, 192, 128, 64)
    assert (spec.rope_theta, spec.rope_local_theta, spec.value_scale) == (5e6, 1e4, 0.707)
    assert spec.layer_kinds() == ["dense"] + ["moe"] * 47
    assert (spec.num_experts, spec.num_experts_per_tok, spec.moe_intermediate_size, spec.num_shared_experts) == \
        (256, 8, 2048, 0)
    assert (spec.scoring, spec.routing_bias, spec.norm_topk_prob, spec.routed_scaling_factor) == \
        ("sigmoid", True, True, 1.0)
    assert spec.quantization == "fp8-block128" and spec.max_position_embeddings == 262144
    # the model card: 309B total, 15B active (embeddings and lm_head included; the MTP heads are not)
    assert spec.total_params() == pytest.approx(309e9, rel=0.01)
    assert spec.active_params() == pytest.approx(15e9, rel=0.05)
    # K (192) and V (128) per KV head: 4 heads on full layers, 8 on windowed ones
    assert (spec.kv_bytes_per_token_layer(layer=0), spec.kv_bytes_per_token_layer(layer=1)) == (4 * 320 * 2, 8 * 320 * 2)
    assert spec.covering_layers() == [0, 1]                    # dense + full, MoE + window


def test_tiny_keeps_every_layer_kind():
    spec = ModelSpec.from_name("mimo+tiny")
    kinds = [(spec.layer_kind(i), spec.layer_window(i), spec.layer_kv_heads(i), spec.layer_sinks(i)) for i in range(3)]
    assert kinds == [("dense", 0, 1, False), ("moe", 0, 1, False), ("moe", 8, 2, True)]
    assert spec.gqa_v_head_dim < spec.head_dim and spec.value_scale == 0.707 and spec.rope_local_theta == 1e4
    window_shapes = registry.get("attention_decode_window").shapes(spec, WorkloadPoint("decode", 2, 30))
    assert [(s["Hk"], s["Dv"], s["window"], s["sinks"]) for s in window_shapes] == [(2, 8, 8, True)]
    full_shapes = registry.get("attention_decode").shapes(spec, WorkloadPoint("decode", 2, 30))
    assert {(s["Hk"], s["Dv"]) for s in full_shapes} == {(1, 8), (2, 8)}
    model = build_model(spec, device="cpu", dtype=torch.float32)
    logits = model.step(make_workload(model, WorkloadPoint("decode", 3, 20)))
    assert logits.shape == (3, 256) and bool(torch.isfinite(logits).all())


@pytest.mark.parametrize("change, words", [
    ({"add_full_attention_sink_bias": True, "add_swa_attention_sink_bias": False}, "sinks on full layers only"),
    ({"swa_num_attention_heads": 8}, "swa_num_attention_heads 8 differs"),
    ({"swa_v_head_dim": 16}, "swa_v_head_dim 16 differs"),
    ({"sliding_window_size": 7}, "sliding_window_size 7 differs"),
    ({"n_shared_experts": 1}, "n_shared_experts 1 is not implemented"),
    ({"layer_types": ["full_attention"] * 4}, "'layer_types' is not implemented for mimo_v2_flash"),
    ({"first_k_dense_replace": 1}, "'first_k_dense_replace' is not implemented"),
    ({"hybrid_layer_pattern": [0, 1]}, "hybrid_layer_pattern must give 0 (full) or 1 (sliding) for each"),
    ({"rope_parameters": {"full_attention": {"rope_theta": 1e6}}}, "'rope_parameters'"),
])
def test_what_tkcc_does_not_implement_is_refused_with_one_line(change, words):
    with pytest.raises(SpecError) as e:
        ModelSpec.from_config({**TINY, **change}, name="mimo-test")
    assert words in str(e.value) and "\n" not in str(e.value)


def test_a_checkpoint_round_trips_under_the_hub_names(tmp_path):
    spec = ModelSpec.from_name("mimo+tiny")
    model = build_model(spec, device="cpu", dtype=torch.float32, seed=3)
    names = internal_to_hf(spec, model.layers, model.params)
    assert "model.layers.2.self_attn.attention_sink_bias" in names and not any("layers.1.self_attn.attention_sink"
                                                                                  in n for n in names)
    assert names["model.layers.2.self_attn.v_proj.weight"].shape == (2 * 8, 64)        # 2 KV heads of Dv 8
    save_weights(model, tmp_path / "w.safetensors")
    loaded = build_model(spec, device="cpu", dtype=torch.float32, weights=tmp_path / "w.safetensors")
    assert loaded.params.keys() == model.params.keys()
    assert all(torch.equal(loaded.params[k], v) for k, v in model.params.items())


def test_tensor_parallelism_is_refused_with_one_line():
    with pytest.raises(ParallelError) as e:
        check_supported(ModelSpec.from_name("mimo+tiny"), ParallelConfig(tp=2, ep=1))
    assert "per-layer KV head counts and V heads narrower than Q/K (MiMo-V2-Flash) are not sharded yet" in str(e.value)


# ----------------------------------------------------------------------------- the reference
def hf_weights(cfg: dict, seed: int) -> dict[str, torch.Tensor]:
    """Random weights under the Hub checkpoint's names (q/k/v_proj, attention_sink_bias, per-expert MLPs)."""
    g = torch.Generator().manual_seed(seed)
    h, hq, dh, dv = cfg["hidden_size"], cfg["num_attention_heads"], cfg["head_dim"], cfg["v_head_dim"]

    def rnd(*shape, std=None):
        return torch.randn(shape, generator=g) * (shape[-1] ** -0.5 if std is None else std)

    w = {"model.embed_tokens.weight": rnd(cfg["vocab_size"], h, std=1.0), "model.norm.weight": 1 + rnd(h, std=0.1),
         "lm_head.weight": rnd(cfg["vocab_size"], h)}
    for i, swa in enumerate(cfg["hybrid_layer_pattern"]):
        a, m = f"model.layers.{i}.self_attn.", f"model.layers.{i}.mlp."
        hk = cfg["swa_num_key_value_heads" if swa else "num_key_value_heads"]
        w.update({a + "q_proj.weight": rnd(hq * dh, h), a + "k_proj.weight": rnd(hk * dh, h),
                  a + "v_proj.weight": rnd(hk * dv, h), a + "o_proj.weight": rnd(h, hq * dv),
                  f"model.layers.{i}.input_layernorm.weight": 1 + rnd(h, std=0.1),
                  f"model.layers.{i}.post_attention_layernorm.weight": 1 + rnd(h, std=0.1)})
        if swa:
            w[a + "attention_sink_bias"] = rnd(hq, std=1.0)
        inter = cfg["moe_intermediate_size"] if cfg["moe_layer_freq"][i] else cfg["intermediate_size"]
        experts = [f"{m}experts.{j}." for j in range(cfg["n_routed_experts"])] if cfg["moe_layer_freq"][i] else [m]
        for e in experts:
            w.update({e + "gate_proj.weight": rnd(inter, h), e + "up_proj.weight": rnd(inter, h),
                      e + "down_proj.weight": rnd(h, inter)})
        if cfg["moe_layer_freq"][i]:
            w[m + "gate.weight"] = rnd(cfg["n_routed_experts"], h, std=1.0)
            w[m + "gate.e_score_correction_bias"] = rnd(cfg["n_routed_experts"], std=0.3)
    return w


def _rms(x, weight, eps):
    return weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps))


def _rotate_half(x):
    x1, x2 = x[..., : x.shape[-1] // 2], x[..., x.shape[-1] // 2:]
    return torch.cat((-x2, x1), dim=-1)


def _mlp(w, p, x):
    return (torch.nn.functional.silu(x @ w[p + "gate_proj.weight"].T) * (x @ w[p + "up_proj.weight"].T)) \
        @ w[p + "down_proj.weight"].T


def _moe(cfg, w, m, x):
    """MiMoV2FlashSparseMoeBlock.route_tokens_to_experts + the experts, token by token."""
    e, groups = cfg["n_routed_experts"], cfg["n_group"]
    scores = torch.sigmoid(x @ w[m + "gate.weight"].T)
    choice = scores + w[m + "gate.e_score_correction_bias"]
    group_scores = choice.view(-1, groups, e // groups).topk(2, dim=-1)[0].sum(-1)
    keep = torch.zeros_like(group_scores).scatter_(1, group_scores.topk(cfg["topk_group"], dim=-1)[1], 1)
    keep = keep.unsqueeze(-1).expand(-1, groups, e // groups).reshape(-1, e).bool()
    idx = choice.masked_fill(~keep, float("-inf")).topk(cfg["num_experts_per_tok"], dim=-1)[1]
    weights = scores.gather(1, idx)
    weights = weights / (weights.sum(-1, keepdim=True) + 1e-20)
    out = torch.zeros_like(x)
    for t in range(x.shape[0]):
        for j, wt in zip(idx[t].tolist(), weights[t]):
            out[t] += wt * _mlp(w, f"{m}experts.{j}.", x[t])
    return out


def reference_logits(cfg: dict, w: dict, ids: torch.Tensor) -> torch.Tensor:
    """fp32 logits [S, V] of every position of one sequence: the whole sequence at once, the sliding window and the
    causal order as one explicit mask, the sinks as an extra softmax column dropped afterwards."""
    s, eps = ids.shape[0], cfg["layernorm_epsilon"]
    hq, dh, dv = cfg["num_attention_heads"], cfg["head_dim"], cfg["v_head_dim"]
    rot = int(dh * cfg["partial_rotary_factor"])
    pos = torch.arange(s, dtype=torch.float32)
    qi, ki = torch.arange(s)[:, None], torch.arange(s)[None, :]
    x = w["model.embed_tokens.weight"][ids]
    for i, swa in enumerate(cfg["hybrid_layer_pattern"]):
        a = f"model.layers.{i}.self_attn."
        hk = cfg["swa_num_key_value_heads" if swa else "num_key_value_heads"]
        h = _rms(x, w[f"model.layers.{i}.input_layernorm.weight"], eps)
        q = (h @ w[a + "q_proj.weight"].T).view(s, hq, dh)
        k = (h @ w[a + "k_proj.weight"].T).view(s, hk, dh)
        v = (h @ w[a + "v_proj.weight"].T).view(s, hk, dv) * cfg["attention_value_scale"]
        base = cfg["swa_rope_theta" if swa else "rope_theta"]
        inv = 1.0 / base ** (torch.arange(0, rot, 2, dtype=torch.float32) / rot)
        emb = torch.cat([pos[:, None] * inv, pos[:, None] * inv], dim=-1)[:, None, :]
        cos, sin = emb.cos(), emb.sin()
        q = torch.cat([q[..., :rot] * cos + _rotate_half(q[..., :rot]) * sin, q[..., rot:]], dim=-1)
        k = torch.cat([k[..., :rot] * cos + _rotate_half(k[..., :rot]) * sin, k[..., rot:]], dim=-1)
        k, v = k.repeat_interleave(hq // hk, dim=1), v.repeat_interleave(hq // hk, dim=1)
        scores = torch.einsum("qhd,khd->hqk", q, k) * dh ** -0.5
        allowed = (ki <= qi) & ((ki > qi - cfg["sliding_window"]) if swa else True)
        scores = scores.masked_fill(~allowed, float("-inf"))
        if swa:
            sink = w[a + "attention_sink_bias"].view(hq, 1, 1).expand(hq, s, 1)
            probs = torch.softmax(torch.cat([scores, sink], dim=-1), dim=-1)[..., :-1]
        else:
            probs = torch.softmax(scores, dim=-1)
        x = x + torch.einsum("hqk,khd->qhd", probs, v).reshape(s, hq * dv) @ w[a + "o_proj.weight"].T
        h = _rms(x, w[f"model.layers.{i}.post_attention_layernorm.weight"], eps)
        m = f"model.layers.{i}.mlp."
        x = x + (_moe(cfg, w, m, h) if cfg["moe_layer_freq"][i] else _mlp(w, m, h))
    return _rms(x, w["model.norm.weight"], eps) @ w["lm_head.weight"].T


def test_prefill_then_decode_equal_the_full_sequence_reference():
    cfg, s = copy.deepcopy(TINY), 13                       # 13 tokens: well past the window of 5
    w = hf_weights(cfg, seed=4)
    ids = torch.randint(0, cfg["vocab_size"], (2, s), generator=torch.Generator().manual_seed(5))
    want = torch.stack([reference_logits(cfg, w, ids[b]) for b in range(2)])           # [B, S, V]
    spec = ModelSpec.from_config(cfg, name="mimo-test")
    layers = list(range(spec.num_layers))
    params = hf_to_internal(spec, layers, w.__getitem__)
    assert {k: tuple(t.shape) for k, t in params.items()} == {k: v for k, (v, _) in param_specs(spec, layers).items()}
    model = make_decoder(spec, layers, params, "cpu", torch.float32)
    pre = make_workload(model, WorkloadPoint("prefill", 2, 0, s - 1), token_ids=ids[:, :-1].flatten(), fill="zeros",
                        capacity=s)
    torch.testing.assert_close(model.step(pre), want[:, s - 2], rtol=1e-4, atol=1e-4)
    dec = make_workload(model, WorkloadPoint("decode", 2, s - 1), cache=pre.cache, token_ids=ids[:, -1])
    got = model.step(dec)
    torch.testing.assert_close(got, want[:, s - 1], rtol=1e-4, atol=1e-4)
    # the window, the sinks and the value scale each change the answer (the comparison can fail)
    for change in ({"sliding_window": 50}, {"attention_value_scale": 1.0}):
        assert (reference_logits({**cfg, **change}, w, ids[0])[-1] - want[0, -1]).abs().max() > 1e-2
    no_sinks = {k: (v * 0 - 30 if k.endswith("attention_sink_bias") else v) for k, v in w.items()}
    assert (reference_logits(cfg, no_sinks, ids[0])[-1] - want[0, -1]).abs().max() > 1e-2
