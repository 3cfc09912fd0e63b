"""The config sections of the families beyond the plain decoder: MLA, DeepSeek sparse attention (DSA),
GLM-5.x's indexer schedule and MLP layer types, MiniMax-M3's block-sparse attention and MLPs, Qwen3's
sliding windows, Mixtral's MoE, Gemma-2/3's and Llama-4's layers, MiMo-V2-Flash's hybrid window layers, Qwen3.5's hybrid linear / full attention layers. Each turns its keys of an HF ``config.json`` into ``ModelSpec`` fields, refusing values it
does not implement (``SpecError``, one line). Pure data (no torch).
"""

from __future__ import annotations

from typing import Any

from persistent_engine.models.config_keys import SpecError

__all__ = ["qwen3_5_fields", "mla_fields", "dsa_fields", "indexer_pattern", "minimax_m3_fields",
           "minimax_m2_attn_types", "qwen_windows",
           "parse_mlp_layer_types", "deepseek_v4_fields", "mixtral_fields", "gemma_fields", "llama4_fields",
           "mimo_fields"]


def mla_fields(c: dict, name: str, heads: int) -> dict[str, Any]:
    nope, rope, v = int(c["qk_nope_head_dim"]), int(c["qk_rope_head_dim"]), int(c["v_head_dim"])
    if c.get("qk_head_dim") not in (None, nope + rope):
        raise SpecError(f"{name}: qk_head_dim {c['qk_head_dim']} is not qk_nope_head_dim + qk_rope_head_dim "
                        f"({nope} + {rope})")
    return dict(q_lora_rank=int(c.get("q_lora_rank") or 0), kv_lora_rank=int(c["kv_lora_rank"]),
                qk_nope_head_dim=nope, qk_rope_head_dim=rope, v_head_dim=v, num_kv_heads=heads,
                head_dim=nope + rope, rotary_dim=rope, rope_interleave=bool(c.get("rope_interleave", True)))


def indexer_pattern(num_layers: int, freq: int = 1, offset: int = 2) -> list[str]:
    """GLM-5.x's schedule: layer i runs the indexer ("full") when max(i - offset + 1, 0) % freq == 0, else it
    reuses the previous full layer's selection ("shared") (HF GlmMoeDsaConfig)."""
    freq = max(int(freq), 1)
    return ["full" if max(i - int(offset) + 1, 0) % freq == 0 else "shared" for i in range(num_layers)]


def dsa_fields(c: dict, name: str, family: str, num_layers: int) -> dict[str, Any]:
    if not c.get("q_lora_rank"):
        raise SpecError(f"{name}: sparse attention needs q_lora_rank (the indexer's queries project the q latent)")
    topk, hi, di = int(c["index_topk"]), int(c["index_n_heads"]), int(c["index_head_dim"])
    if topk < 1 or hi < 1 or di < int(c["qk_rope_head_dim"]):
        raise SpecError(f"{name}: bad indexer (index_topk {topk}, index_n_heads {hi}, index_head_dim {di} must be "
                        f">= qk_rope_head_dim)")
    pattern = c.get("index_topk_pattern")
    if c.get("indexer_types"):
        types = list(c["indexer_types"])
    elif pattern:
        types = [{"F": "full", "S": "shared"}.get(ch, ch) for ch in pattern]
    elif family == "glm_moe_dsa":
        types = indexer_pattern(num_layers, c.get("index_topk_freq", 1), c.get("index_skip_topk_offset", 2))
    else:
        types = ["full"] * num_layers
    if len(types) != num_layers or set(types) - {"full", "shared"} or types[0] != "full":
        raise SpecError(f"{name}: indexer_types must give 'full' or 'shared' for each of the {num_layers} layers, "
                        "the first 'full'")
    if family == "glm_moe_dsa" and c.get("indexer_types") and ("index_topk_freq" in c or pattern):
        derived = ([{"F": "full", "S": "shared"}.get(ch, ch) for ch in pattern] if pattern
                   else indexer_pattern(num_layers, c.get("index_topk_freq", 1), c.get("index_skip_topk_offset", 2)))
        if derived != types:
            raise SpecError(f"{name}: indexer_types disagrees with index_topk_freq/index_skip_topk_offset")
    return dict(index_topk=topk, index_n_heads=hi, index_head_dim=di,
                indexer_types=tuple(types) if "shared" in types else (),
                indexer_rope_interleave=bool(c.get("indexer_rope_interleave", False)))


MSA_KEYS = {"use_sparse_attention", "sparse_attention_freq", "sparse_block_size", "sparse_disable_index_value",
            "sparse_index_dim", "sparse_init_block", "sparse_local_block", "sparse_num_index_heads",
            "sparse_score_type", "sparse_topk_blocks"}


def qwen_windows(c: dict, num_layers: int, name: str) -> tuple[int, ...]:
    """HF Qwen3Config: with use_sliding_window, layers from max_window_layers on (or those layer_types marks
    "sliding_attention") attend a window of sliding_window tokens."""
    window = int(c.get("sliding_window") or 0) if c.get("use_sliding_window") else 0
    types = c.get("layer_types") or ["sliding_attention" if window and i >= int(c.get("max_window_layers", num_layers))
                                     else "full_attention" for i in range(num_layers)]
    if len(types) != num_layers or set(types) - {"sliding_attention", "full_attention"}:
        raise SpecError(f"{name}: layer_types must give full_attention or sliding_attention for each of the "
                        f"{num_layers} layers")
    if "sliding_attention" in types and not window:
        raise SpecError(f"{name}: layer_types has sliding_attention layers but no sliding_window is in effect")
    return tuple(window if t == "sliding_attention" else 0 for t in types) if window else ()


def mixtral_fields(c: dict, num_layers: int) -> dict[str, Any]:
    """HF MixtralConfig: every layer MoE (num_local_experts, num_experts_per_tok) with experts of intermediate_size;
    MixtralTopKRouter: softmax over all experts in fp32, top-k, the k weights renormalised to sum 1 (moe_route's
    softmax + norm_topk_prob); with sliding_window set every layer attends that many tokens (HF masks
    kv_idx > q_idx - sliding_window, ops/window.py's window)."""
    window = int(c.get("sliding_window") or 0)
    return dict(num_experts=int(c["num_local_experts"]), num_experts_per_tok=int(c["num_experts_per_tok"]),
                moe_intermediate_size=int(c["intermediate_size"]), scoring="softmax", norm_topk_prob=True,
                layer_windows=(window,) * num_layers if window else ())


def gemma_fields(c: dict, name: str, family: str, num_layers: int) -> dict[str, Any]:
    """HF Gemma2Config / Gemma3TextConfig with their defaults (a key a config leaves out means HF's default):
    GeGLU (gelu_pytorch_tanh), (1 + w) RMSNorms before and after attention and the MLP, embeddings times
    sqrt(hidden), scores times query_pre_attn_scalar^-0.5, layer_types (default: Gemma-2 alternates sliding and
    full from layer 0, Gemma-3 has every sliding_window_pattern-th layer full) with sliding layers attending
    sliding_window tokens, tanh soft-caps of scores (Gemma-2 only: Gemma3Attention never passes its softcap) and
    of the final logits; Gemma-3: per-head (1 + w) QK-norm, rope_theta and rope_scaling on full layers,
    rope_local_base_freq (default rope) on sliding ones."""
    g3 = family == "gemma3"
    window = int(c.get("sliding_window", 4096) or 0)
    if c.get("sliding_window_size") not in (None, window):
        raise SpecError(f"{name}: sliding_window_size {c['sliding_window_size']} differs from sliding_window {window}")
    pattern = int(c.get("sliding_window_pattern", 6)) if g3 else 2
    types = c.get("layer_types") or ["sliding_attention" if (i + 1) % pattern else "full_attention"
                                     for i in range(num_layers)]
    if len(types) != num_layers or set(types) - {"sliding_attention", "full_attention"}:
        raise SpecError(f"{name}: layer_types must give full_attention or sliding_attention for each of the "
                        f"{num_layers} layers")
    if "sliding_attention" in types and not window:
        raise SpecError(f"{name}: layer_types has sliding_attention layers but sliding_window is {window}")
    head_dim = int(c.get("head_dim", 256))
    kw: dict[str, Any] = dict(
        head_dim=head_dim, rotary_dim=head_dim, mlp_act="gelu_tanh", gemma_norm=True, embed_scale=True,
        sandwich_norms=True, tie_word_embeddings=bool(c.get("tie_word_embeddings", True)),
        query_pre_attn_scalar=float(c.get("query_pre_attn_scalar", 256)),
        layer_windows=tuple(window if t == "sliding_attention" else 0 for t in types),
        final_softcap=float(c.get("final_logit_softcapping", None if g3 else 30.0) or 0.0),
        attn_softcap=0.0 if g3 else float(c.get("attn_logit_softcapping", 50.0) or 0.0),
        max_position_embeddings=int(c.get("max_position_embeddings", 131072 if g3 else 8192)))
    if g3:
        full, local = _gemma3_rope(c)
        kw.update(qk_norm="per_head", rope_theta=float(full.get("rope_theta", 1e6)),
                  rope_scaling=full if (full.get("rope_type") or "default") != "default" else None,
                  rope_local_theta=float(local.get("rope_theta", 1e4)))
    return kw


def _gemma3_rope(c: dict) -> tuple[dict, dict]:
    """(full layers', sliding layers') rope parameters: HF v5's rope_parameters by layer type, or the published
    configs' rope_theta / rope_scaling (full layers) and rope_local_base_freq (sliding layers)."""
    rp = c.get("rope_parameters") or {}
    if "full_attention" in rp or "sliding_attention" in rp:
        return dict(rp.get("full_attention") or {}), dict(rp.get("sliding_attention") or {})
    full = dict(c.get("rope_scaling") or {})
    if "rope_theta" in c:
        full["rope_theta"] = c["rope_theta"]
    local = {"rope_theta": c["rope_local_base_freq"]} if "rope_local_base_freq" in c else {}
    return full, local


def llama4_fields(c: dict, name: str, num_layers: int) -> dict[str, Any]:
    """HF Llama4TextConfig with its defaults: no_rope_layers (1: the layer uses rope; default every
    no_rope_layer_interval-th layer NoPE), rope layers chunked (layer_types "chunked_attention" when
    attention_chunk_size is set) with L2-normed q/k (use_qk_norm), NoPE layers' query temperature
    (attn_temperature_tuning, floor_scale, attn_scale); MoE layers (moe_layers, default every
    interleave_moe_layer_step-th) of num_local_experts at intermediate_size with a shared expert of the same width,
    Llama4Router: top-k of the raw logits, weight sigmoid(logit), no renormalisation, applied to the expert's input;
    dense layers at intermediate_size_mlp."""
    interval = int(c.get("no_rope_layer_interval", 4))
    rope = c.get("no_rope_layers") or [int((i + 1) % interval != 0) for i in range(num_layers)]
    if not isinstance(rope, list) or len(rope) != num_layers:
        raise SpecError(f"{name}: 'no_rope_layers' must give 0 or 1 for each of the {num_layers} layers")
    chunk = int(c.get("attention_chunk_size", 8192) or 0)
    types = c.get("layer_types") or ["chunked_attention" if r and chunk else "full_attention" for r in rope]
    want = ["chunked_attention" if r and chunk else "full_attention" for r in rope]
    if list(types) != want:
        raise SpecError(f"{name}: 'layer_types' must be chunked_attention exactly on the rope layers (no_rope_layers) "
                        "when attention_chunk_size is set, else full_attention")
    step = int(c.get("interleave_moe_layer_step", 1))
    moe = c.get("moe_layers")
    moe = set(range(step - 1, num_layers, step) if moe is None else moe)
    experts = int(c.get("num_local_experts", 16))
    tuning = c.get("attn_temperature_tuning", True)
    return dict(rope_layers=tuple(bool(r) for r in rope), qk_l2_norm=bool(c.get("use_qk_norm", True)),
                attention_chunk_size=chunk, attn_temperature_floor=int(c.get("floor_scale", 8192)) if tuning else 0,
                attn_temperature_scale=float(c.get("attn_scale", 0.1)), moe_input_scaled=True,
                num_experts=experts, num_experts_per_tok=int(c.get("num_experts_per_tok", 1)),
                moe_intermediate_size=int(c["intermediate_size"]), intermediate_size=int(c["intermediate_size_mlp"]),
                num_shared_experts=1, shared_intermediate_size=int(c["intermediate_size"]), scoring="sigmoid",
                norm_topk_prob=False, rope_theta=float(c.get("rope_theta", 500000.0)),
                mlp_layer_types=tuple("moe" if i in moe else "dense" for i in range(num_layers)))


def _per_layer_flags(v, num_layers: int, what: str, name: str) -> tuple[bool, ...]:
    if not isinstance(v, list) or len(v) != num_layers:
        raise SpecError(f"{name}: {what} must list one flag for each of the {num_layers} layers")
    return tuple(bool(x) for x in v)


def minimax_m3_fields(c: dict, name: str, num_layers: int, head_dim: int) -> dict[str, Any]:
    if c.get("use_qk_norm", True) is not True or c.get("qk_norm_type", "per_head") != "per_head":
        raise SpecError(f"{name}: minimax_m3 is implemented with per-head QK-norm only (use_qk_norm, qk_norm_type)")
    moe = _per_layer_flags(c["moe_layer_freq"], num_layers, "moe_layer_freq", name)
    shared = int(c.get("n_shared_experts") or 0)
    kw: dict[str, Any] = dict(
        qk_norm="per_head", num_experts=int(c["num_local_experts"]), num_experts_per_tok=int(c["num_experts_per_tok"]),
        moe_intermediate_size=int(c["moe_intermediate_size"]),
        intermediate_size=int(c.get("dense_intermediate_size") or c["intermediate_size"]),
        num_shared_experts=shared, shared_intermediate_size=int(c.get("shared_intermediate_size") or 0) if shared else 0,
        first_k_dense=int(c.get("first_k_dense_replace", 0)), mlp_layer_types=tuple("moe" if m else "dense" for m in moe),
        scoring=c.get("scoring_func", "sigmoid"), routing_bias=bool(c.get("use_routing_bias", True)),
        norm_topk_prob=True, routed_scaling_factor=float(c.get("routed_scaling_factor", 1.0)),
        mlp_act="swigluoai", swiglu_alpha=float(c.get("swiglu_alpha", 1.702)),
        swiglu_limit=float(c.get("swiglu_limit", 7.0)), gemma_norm=bool(c.get("use_gemma_norm", False)))
    sc = c.get("sparse_attention_config") or {}
    if not sc.get("use_sparse_attention"):
        if set(sc) - {"use_sparse_attention"}:
            raise SpecError(f"{name}: sparse_attention_config is set but use_sparse_attention is not")
        return kw
    unknown = sorted(set(sc) - MSA_KEYS)
    if unknown:
        raise SpecError(f"{name}: sparse_attention_config key {unknown[0]!r} is not implemented; refusing the config "
                        "rather than ignoring it")
    layers = _per_layer_flags(sc["sparse_attention_freq"], num_layers, "sparse_attention_freq", name)
    no_value = _per_layer_flags(sc.get("sparse_disable_index_value", list(layers)), num_layers,
                                "sparse_disable_index_value", name)
    if any(s and not nv for s, nv in zip(layers, no_value)):
        raise SpecError(f"{name}: the index value/output branch (sparse_disable_index_value 0 on a sparse layer) "
                        "is not implemented")
    if sc.get("sparse_score_type", "max") != "max":
        raise SpecError(f"{name}: sparse_score_type {sc['sparse_score_type']!r} is not implemented (max)")
    if int(sc["sparse_num_index_heads"]) != int(c["num_key_value_heads"]):
        raise SpecError(f"{name}: sparse_num_index_heads must equal num_key_value_heads (one index head per KV head)")
    if int(sc.get("sparse_local_block", 1)) < 1:
        raise SpecError(f"{name}: sparse_local_block must be at least 1 (the query's own block)")
    kw.update(msa_layers=layers, msa_block_size=int(sc["sparse_block_size"]), msa_topk_blocks=int(sc["sparse_topk_blocks"]),
              msa_index_dim=int(sc.get("sparse_index_dim", head_dim)), msa_init_blocks=int(sc.get("sparse_init_block", 0)),
              msa_local_blocks=int(sc.get("sparse_local_block", 1)))
    return kw


# MiniMax's attn_type_list: 0 = lightning (linear) attention, 1 = full softmax attention (MiniMax-Text-01 / M1:
# vLLM minimax_text_01.py, HF modeling_minimax.py layer_types "linear_attention" / "full_attention")
MINIMAX_ATTN_KINDS = {0: "lightning (linear) attention", 1: "full softmax attention"}


def minimax_m2_attn_types(c: dict, name: str, num_layers: int) -> None:
    """Check MiniMax-M2.x's ``attn_type_list``: one kind per layer, every one 1 (full softmax attention, the
    attention MiniMaxM2ForCausalLM runs on every layer in vLLM's minimax_m2.py and HF's modeling_minimax_m2.py; the
    published MiniMax-M2 and M2.7 configs list 1 for each of their 62 layers). Kind 0, MiniMax-Text-01's lightning
    attention, has no weights in an M2 checkpoint and no published M2.x config uses it: refused by name."""
    kinds = c.get("attn_type_list")
    if kinds is None:
        return
    if not isinstance(kinds, list) or len(kinds) != num_layers:
        raise SpecError(f"{name}: attn_type_list must give an attention kind for each of the {num_layers} layers")
    for i, k in enumerate(kinds):
        if k == 1:
            continue
        what = MINIMAX_ATTN_KINDS.get(k) if isinstance(k, int) else None
        if what is None:
            raise SpecError(f"{name}: attn_type_list[{i}] = {k!r} is not an attention kind "
                            "(0 lightning, 1 full softmax)")
        raise SpecError(f"{name}: attn_type_list[{i}] = {k} asks for {what} (MiniMax-Text-01 / M1's layer kind), "
                        "which MiniMaxM2ForCausalLM does not have (its published configs list 1 on every layer); "
                        "tkcc implements kind 1 (full softmax attention) for this family")


def parse_mlp_layer_types(types: list, num_layers: int, name: str) -> tuple[str, ...]:
    kinds = {"dense": "dense", "sparse": "moe", "moe": "moe"}
    if len(types) != num_layers or any(t not in kinds for t in types):
        raise SpecError(f"{name}: mlp_layer_types must give 'dense' or 'sparse' for each of the {num_layers} layers")
    return tuple(kinds[t] for t in types)


def qwen3_5_fields(c: dict, name: str, num_layers: int) -> dict[str, Any]:
    """HF Qwen3_5(Moe)TextConfig: ``layer_types`` (or every ``full_attention_interval``-th layer full, the rest
    Gated DeltaNet), the linear layers' heads and conv kernel, the output gate of full attention, Gemma-style
    (1 + w) norms, per-head QK-norm; MoE: softmax top-k (renormalised) + a sigmoid-gated shared expert. The
    rope's ``mrope_section``/``mrope_interleaved`` split the rotary dims among (t, h, w) position ids, which
    are equal for text, so the rotation is plain rope."""
    interval = int(c.get("full_attention_interval") or 4)
    derived = ["full_attention" if (i + 1) % interval == 0 else "linear_attention" for i in range(num_layers)]
    types = list(c.get("layer_types") or derived)
    if len(types) != num_layers or set(types) - {"linear_attention", "full_attention"}:
        raise SpecError(f"{name}: layer_types must give linear_attention or full_attention for each of the "
                        f"{num_layers} layers")
    if c.get("layer_types") and "full_attention_interval" in c and types != derived:
        raise SpecError(f"{name}: layer_types disagrees with full_attention_interval {interval}")
    hk, hv = int(c["linear_num_key_heads"]), int(c["linear_num_value_heads"])
    if hv % hk:
        raise SpecError(f"{name}: linear_num_value_heads {hv} is not a multiple of linear_num_key_heads {hk}")
    kw: dict[str, Any] = dict(
        linear_layers=tuple(t == "linear_attention" for t in types), linear_num_k_heads=hk, linear_num_v_heads=hv,
        linear_k_dim=int(c["linear_key_head_dim"]), linear_v_dim=int(c["linear_value_head_dim"]),
        linear_conv_kernel=int(c.get("linear_conv_kernel_dim", 4)), attn_output_gate=bool(c.get("attn_output_gate", True)),
        qk_norm="per_head", gemma_norm=True)
    if "num_experts" in c:
        kw.update(num_experts=int(c["num_experts"]), num_experts_per_tok=int(c["num_experts_per_tok"]),
                  moe_intermediate_size=int(c["moe_intermediate_size"]), scoring="softmax", norm_topk_prob=True)
        if int(c.get("shared_expert_intermediate_size") or 0):
            kw.update(num_shared_experts=1, shared_intermediate_size=int(c["shared_expert_intermediate_size"]),
                      shared_expert_gate=True)
    return kw
V4_LAYER_TYPES = {"sliding_attention": 0, "compressed_sparse_attention": "csa", "heavily_compressed_attention": "hca"}


def deepseek_v4_fields(c: dict, name: str, num_layers: int) -> dict[str, Any]:
    """DeepSeek-V4's sections: hyper-connections, per-layer compress ratios (``compress_ratios``, or HF's
    ``layer_types`` with ``compress_rates``), the sliding window, the grouped output projection, hash layers."""
    rates = c.get("compress_rates") or {"compressed_sparse_attention": 4, "heavily_compressed_attention": 128}
    csa = int(rates["compressed_sparse_attention"])
    if c.get("compress_ratios") is not None:
        ratios = tuple(int(r) for r in c["compress_ratios"][:num_layers])
    elif c.get("layer_types") is not None:
        ratios = tuple(0 if t == "sliding_attention" else int(rates[t]) for t in c["layer_types"][:num_layers])
    else:
        raise SpecError(f"{name}: DeepSeek-V4 needs compress_ratios or layer_types (each layer's attention kind)")
    if len(ratios) != num_layers or any(r < 0 for r in ratios):
        raise SpecError(f"{name}: {len(ratios)} compress ratios for {num_layers} layers (need one >= 0 per layer)")
    hq, d, groups = int(c["num_attention_heads"]), int(c["head_dim"]), int(c["o_groups"])
    if int(c.get("num_key_value_heads") or 1) != 1:
        raise SpecError(f"{name}: DeepSeek-V4 attention has one shared K = V head; num_key_value_heads "
                        f"{c['num_key_value_heads']} is not implemented")
    if hq % groups:
        raise SpecError(f"{name}: o_groups {groups} does not divide num_attention_heads {hq}")
    window = int(c["sliding_window"])
    if window < 1:
        raise SpecError(f"{name}: sliding_window {window}: DeepSeek-V4 layers need a window >= 1")
    rope = int(c.get("qk_rope_head_dim") or d * float(c.get("partial_rotary_factor", 1.0)))
    return dict(num_kv_heads=1, q_lora_rank=int(c["q_lora_rank"]), qk_rope_head_dim=rope, rotary_dim=rope,
                hc_mult=int(c["hc_mult"]), hc_sinkhorn_iters=int(c["hc_sinkhorn_iters"]), hc_eps=float(c["hc_eps"]),
                compress_ratios=ratios, csa_ratio=csa, compress_rope_theta=float(c.get("compress_rope_theta", 160000)),
                sliding_window=window, o_groups=groups, o_lora_rank=int(c["o_lora_rank"]),
                num_hash_layers=int(c.get("num_hash_layers", 0)), index_n_heads=int(c["index_n_heads"]),
                index_head_dim=int(c["index_head_dim"]), index_topk=int(c["index_topk"]),
                swiglu_limit=float(c.get("swiglu_limit", 0.0)), expert_dtype=str(c.get("expert_dtype") or "bf16"),
                scoring=c.get("scoring_func", "sqrtsoftplus"))


def mimo_fields(c: dict, name: str, num_layers: int, head_dim: int) -> dict[str, Any]:
    """MiMo-V2-Flash's Hub config (HF transformers' ``convert_mimo_v2_flash_weights_to_hf.convert_config`` reads the
    same keys): ``hybrid_layer_pattern`` per layer (1: sliding window of ``sliding_window`` tokens, 0: full), the
    sliding layers' KV heads ``swa_num_key_value_heads`` and rope base ``swa_rope_theta``, V heads of ``v_head_dim``
    (Dv != Dh), per-head sinks on sliding (``add_swa_attention_sink_bias``) and/or full layers, V scaled by
    ``attention_value_scale`` before the cache write; ``moe_layer_freq`` per layer (0: dense), routed experts only,
    sigmoid + correction bias (noaux_tc), grouped top-k. Per-kind query heads and head dims must agree (the Hub
    config's swa_num_attention_heads / swa_head_dim / swa_v_head_dim), else the config is refused."""
    pattern = c.get("hybrid_layer_pattern") or [0] * num_layers
    if not isinstance(pattern, list) or len(pattern) != num_layers or set(pattern) - {0, 1}:
        raise SpecError(f"{name}: hybrid_layer_pattern must give 0 (full) or 1 (sliding) for each of the "
                        f"{num_layers} layers")
    window = int(c.get("sliding_window") or c.get("sliding_window_size") or 0)
    for key in ("sliding_window_size", "attention_chunk_size"):       # Hub keys carrying the window again
        if c.get(key) not in (None, window):
            raise SpecError(f"{name}: {key} {c[key]} differs from sliding_window {window}")
    if 1 in pattern and not window:
        raise SpecError(f"{name}: hybrid_layer_pattern has sliding layers but sliding_window is not set")
    v_dim = int(c.get("v_head_dim") or head_dim)
    for key, full in (("swa_num_attention_heads", int(c["num_attention_heads"])), ("swa_head_dim", head_dim),
                      ("swa_qk_head_dim", head_dim), ("swa_v_head_dim", v_dim)):
        if c.get(key) not in (None, full):
            raise SpecError(f"{name}: {key} {c[key]} differs from the full layers' {full} (sliding and full layers "
                            "with different query heads or head dims are not implemented)")
    full_sinks, swa_sinks = bool(c.get("add_full_attention_sink_bias")), bool(c.get("add_swa_attention_sink_bias"))
    if full_sinks and not swa_sinks:
        raise SpecError(f"{name}: attention sinks on full layers only (add_full_attention_sink_bias without "
                        "add_swa_attention_sink_bias) are not implemented")
    if c.get("n_shared_experts"):
        raise SpecError(f"{name}: n_shared_experts {c['n_shared_experts']} is not implemented for mimo_v2_flash "
                        "(HF's MiMoV2FlashSparseMoeBlock has no shared experts)")
    freq = c.get("moe_layer_freq") or [1] * num_layers
    if not isinstance(freq, list) or len(freq) != num_layers or set(freq) - {0, 1}:
        raise SpecError(f"{name}: moe_layer_freq must give 0 (dense) or 1 (MoE) for each of the {num_layers} layers")
    first_dense = next((i for i, f in enumerate(freq) if f), num_layers)
    scale = c.get("routed_scaling_factor")
    return dict(
        v_head_dim=v_dim, layer_windows=tuple(window if p else 0 for p in pattern) if 1 in pattern else (),
        window_kv_heads=int(c.get("swa_num_key_value_heads") or c.get("num_key_value_heads")) if 1 in pattern else 0,
        attention_sinks=full_sinks, window_sinks=swa_sinks and not full_sinks,
        rope_local_theta=float(c.get("swa_rope_theta", 10000.0)) if 1 in pattern else 0.0,
        value_scale=float(c.get("attention_value_scale") or 1.0), rms_norm_eps=float(c.get("layernorm_epsilon", 1e-5)),
        num_experts=int(c["n_routed_experts"]), num_experts_per_tok=int(c["num_experts_per_tok"]),
        moe_intermediate_size=int(c["moe_intermediate_size"]), first_k_dense=first_dense,
        mlp_layer_types=tuple("moe" if f else "dense" for f in freq),
        scoring=c.get("scoring_func", "sigmoid"), routing_bias=c.get("topk_method", "noaux_tc") == "noaux_tc",
        norm_topk_prob=bool(c.get("norm_topk_prob", True)),
        routed_scaling_factor=1.0 if scale is None else float(scale),
        n_group=int(c.get("n_group") or 1), topk_group=int(c.get("topk_group") or 1))


def v4_tiny(spec, kw: dict) -> dict:
    """DeepSeek-V4 at toy size: 4 layers [window + hash, CSA + hash, HCA, CSA] (every attention kind, both
    routings), CSA ratio 4 with top-2 entries, HCA ratio 8, window 8, 2 o-groups, 4 streams."""
    ratios = tuple(r for r in (0, spec.csa_ratio, 8, spec.csa_ratio))
    return dict(num_layers=4, compress_ratios=ratios, num_hash_layers=min(spec.num_hash_layers, 2), sliding_window=8,
                head_dim=32, qk_rope_head_dim=8, rotary_dim=8, q_lora_rank=32, o_groups=2, o_lora_rank=16,
                index_n_heads=2, index_head_dim=16, index_topk=2, num_kv_heads=1, num_shared_experts=1,
                shared_intermediate_size=32, num_experts=8, num_experts_per_tok=2, moe_intermediate_size=32,
                hc_sinkhorn_iters=min(spec.hc_sinkhorn_iters, 20), n_group=1, topk_group=1, first_k_dense=0)



def hybrid_tiny(spec, kw: dict, heads: int, head_dim: int, hidden: int) -> dict:
    """``ModelSpec.scaled_down``'s fields of the hybrid families (``kw``: the toy fields so far; {} for others)."""
    out: dict[str, Any] = {}
    n = kw["num_layers"]
    if spec.msa_layers:
        # MiniMax-M3: blocks of 4 tokens, 2 per query (so contexts past 8 tokens are sparse); the first layer dense
        # when the original's first layer is
        out.update(msa_block_size=4, msa_topk_blocks=2, msa_index_dim=head_dim,
                   msa_init_blocks=min(spec.msa_init_blocks, 1), msa_local_blocks=1,
                   msa_layers=tuple(spec.msa_layers[0] if j == 0 else True for j in range(n)))
    if spec.linear_layers:
        # Qwen3.5: 2 key heads, the value/key head ratio kept, 16-wide heads; linear and full layers both kept
        ratio = spec.linear_num_v_heads // spec.linear_num_k_heads
        both = any(spec.linear_layers) and not all(spec.linear_layers)
        out.update(linear_num_k_heads=2, linear_num_v_heads=2 * min(ratio, 2), linear_k_dim=16, linear_v_dim=16,
                   linear_layers=tuple((j < n - 1) if both else spec.linear_layers[0] for j in range(n)))
    if spec.kda_layers:
        # Kimi: KDA on all but the last layer (dense + MoE KDA layers, an MoE MLA layer), two layers per
        # attention-residual block (so blocks close inside the slice), a latent half the hidden size
        out.update(kda_layers=tuple(j < n - 1 for j in range(n)), kda_num_heads=heads, kda_head_dim=16,
                   latent_moe_size=hidden // 2 if spec.latent_moe_size else 0,
                   attn_res_block_size=2 if spec.attn_res_block_size else 0)
    return out
