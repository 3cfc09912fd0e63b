"""No silent drops: which keys of an HF ``config.json`` tkcc implements, which do not change the math
(and why), and the values an implemented key may take. Pure data (no torch).

``check_config(cfg, family, name)`` raises ``SpecError`` naming the first key that is neither
implemented for the family nor listed in ``NO_MATH`` (nor an MLA/GQA-irrelevant key, nor at its neutral value:
``neutral_keys``), or a key whose
value asks for something tkcc does not implement (e.g. ``hidden_act: gelu``, ``mlp_bias: true``,
``use_sliding_window: true`` on a family without windows). So a model tkcc would silently change is
refused, with one line, instead of being optimized as a different model.
"""

from __future__ import annotations

from typing import Any, Callable

from persistent_engine.models.neutral_keys import neutral_rule


class SpecError(ValueError):
    """A model name or config that tkcc cannot use. The CLI prints it as one line, exit 2."""

    user_error = True

# Keys that do not change the forward pass tkcc runs, each with the reason.
NO_MATH: dict[str, str] = {
    "architectures": "selects the family",
    "model_type": "selects the family",
    "auto_map": "names the HF remote-code classes",
    "transformers_version": "provenance",
    "torch_dtype": "the checkpoint's storage dtype; the engine runs its own (bf16 by default)",
    "dtype": "the checkpoint's storage dtype; the engine runs its own (bf16 by default)",
    "bos_token_id": "tokenizer ids", "eos_token_id": "tokenizer ids", "pad_token_id": "tokenizer ids",
    "use_cache": "HF generation switch (tkcc always keeps a paged KV cache)",
    "initializer_range": "training-time initialisation",
    "attention_dropout": "dropout is inactive at inference",
    "hidden_dropout": "dropout is inactive at inference",
    "aux_loss_alpha": "training loss", "seq_aux": "training loss", "router_aux_loss_coef": "training loss",
    "output_router_logits": "training output",
    "cache_implementation": "HF generation's KV-cache class (tkcc keeps its own paged cache)",
    "router_jitter_noise": "router input noise HF applies in training only (MixtralSparseMoeBlock: self.training)",
    "ep_size": "a parallelism hint (tkcc's cost model searches the layout)",
    "pretraining_tp": "HF's tensor-parallel emulation of training; the same linear maps",
    "num_nextn_predict_layers": "multi-token-prediction heads: speculative decoding only, not the main forward",
    "use_mtp": "multi-token-prediction heads: speculative decoding only",
    "mtp_transformer_layers": "multi-token-prediction heads: speculative decoding only",
    "num_mtp_modules": "multi-token-prediction heads: speculative decoding only",
    "index_share_for_mtp_iteration": "multi-token-prediction heads: speculative decoding only",
    "mtp_num_hidden_layers": "multi-token-prediction heads: speculative decoding only",
    "mtp_use_dedicated_embeddings": "multi-token-prediction heads: speculative decoding only",
    # Qwen3.5 checkpoints are vision-language: tkcc serves text, whose forward never runs the vision tower
    "vision_config": "the vision tower (text requests never run it)",
    "image_token_id": "a vision placeholder token id", "video_token_id": "a vision placeholder token id",
    "vision_start_token_id": "a vision placeholder token id", "vision_end_token_id": "a vision placeholder token id",
    "text_config": "its keys are the text model's config (checked as the config itself)",
    "moe_router_dtype": "moe_route takes fp32 logits; the gate projection runs in the model dtype for every "
                        "family (a rounding-level difference)",
}

GENERIC = {"hidden_size", "num_hidden_layers", "vocab_size", "num_attention_heads", "num_key_value_heads",
           "head_dim", "intermediate_size", "rms_norm_eps", "rope_theta", "rope_scaling", "rope_parameters",
           "tie_word_embeddings", "max_position_embeddings", "attention_bias", "partial_rotary_factor",
           "rotary_dim", "hidden_act", "mlp_bias", "quantization_config"}
WINDOW = {"use_sliding_window", "sliding_window", "max_window_layers", "layer_types"}
DEEPSEEK_MOE = {"n_routed_experts", "num_experts_per_tok", "moe_intermediate_size", "n_shared_experts",
                "first_k_dense_replace", "moe_layer_freq", "scoring_func", "topk_method", "norm_topk_prob",
                "routed_scaling_factor", "n_group", "topk_group"}
MLA = {"q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "rope_interleave",
       "qk_head_dim"}
GEMMA = {"hidden_activation", "query_pre_attn_scalar", "sliding_window", "sliding_window_size", "layer_types",
         "final_logit_softcapping", "attn_logit_softcapping", "use_bidirectional_attention"}
# Gemma-4 text (HF gemma4_text; models/gemma4_config.py checks the values that change the math)
GEMMA4 = {"global_head_dim", "num_global_key_value_heads", "attention_k_eq_v", "num_kv_shared_layers",
          "hidden_size_per_layer_input", "vocab_size_per_layer_input", "enable_moe_block", "use_double_wide_mlp",
          "num_experts", "top_k_experts", "moe_intermediate_size"}
DSA = {"index_n_heads", "index_head_dim", "index_topk", "indexer_rope_interleave"}

# Qwen3.5 (HF qwen3_5 / qwen3_5_moe): Gated DeltaNet layers (linear_*) interleaved with gated full attention
QWEN3_5 = {"layer_types", "full_attention_interval", "linear_num_key_heads", "linear_num_value_heads",
           "linear_key_head_dim", "linear_value_head_dim", "linear_conv_kernel_dim", "attn_output_gate",
           "mamba_ssm_dtype", "output_gate_type"}
QWEN3_5_MOE = QWEN3_5 | {"num_experts", "num_experts_per_tok", "moe_intermediate_size", "shared_expert_intermediate_size",
                         "norm_topk_prob", "decoder_sparse_step", "mlp_only_layers"}

FAMILY_KEYS: dict[str, set[str]] = {
    "qwen3_5": GENERIC | QWEN3_5,
    "qwen3_5_moe": GENERIC | QWEN3_5_MOE,
    "llama": GENERIC,
    "qwen3": GENERIC | WINDOW,
    "qwen3_moe": GENERIC | WINDOW | {"num_experts", "num_experts_per_tok", "moe_intermediate_size",
                                     "decoder_sparse_step", "norm_topk_prob", "mlp_only_layers"},
    "minimax_m2": GENERIC | {"num_local_experts", "num_experts_per_tok", "scoring_func", "use_routing_bias",
                             "shared_intermediate_size", "use_qk_norm", "qk_norm_type",
                             "attn_type_list"},     # per-layer attention kinds (config_sections.minimax_m2_attn_types)
    "glm4_moe": GENERIC | DEEPSEEK_MOE | {"use_qk_norm"},
    # Gemma-2 / Gemma-3 text (HF gemma2, gemma3 / gemma3_text; config_sections.gemma_fields)
    "gemma2": GENERIC | GEMMA,
    "gemma3": GENERIC | GEMMA | {"rope_local_base_freq", "sliding_window_pattern"},
    "gemma4": GENERIC | GEMMA | GEMMA4,
    # Llama-4 text (HF llama4_text; config_sections.llama4_fields)
    "llama4": GENERIC | {"intermediate_size_mlp", "num_local_experts", "num_experts_per_tok", "moe_layers",
                         "interleave_moe_layer_step", "use_qk_norm", "no_rope_layers", "no_rope_layer_interval",
                         "attention_chunk_size", "layer_types", "attn_temperature_tuning", "floor_scale",
                         "attn_scale"},
    # Mixtral (HF mixtral): Llama attention, every layer windowed when sliding_window is set, softmax top-k MoE
    "mixtral": GENERIC | {"num_local_experts", "num_experts_per_tok", "sliding_window"},
    # MiMo-V2-Flash (Hub spelling; config_sections.mimo_fields): hybrid window/full layers, routed-only MoE
    "mimo_v2_flash": GENERIC | (DEEPSEEK_MOE - {"first_k_dense_replace"}) | {"v_head_dim", "hybrid_layer_pattern", "sliding_window",
                                               "sliding_window_size", "attention_chunk_size", "swa_num_attention_heads",
                                               "swa_num_key_value_heads", "swa_head_dim", "swa_qk_head_dim",
                                               "swa_v_head_dim", "swa_rope_theta", "add_full_attention_sink_bias",
                                               "add_swa_attention_sink_bias", "attention_value_scale",
                                               "layernorm_epsilon"},
    "deepseek_v3": GENERIC | DEEPSEEK_MOE | MLA,
    "deepseek_v32": GENERIC | DEEPSEEK_MOE | MLA | DSA,
    "glm_moe_dsa": GENERIC | DEEPSEEK_MOE | MLA | DSA | {"indexer_types", "index_topk_freq", "index_skip_topk_offset",
                                                         "index_topk_pattern", "mlp_layer_types", "layer_types"},
    "minimax_m3": GENERIC | {"num_local_experts", "num_experts_per_tok", "moe_intermediate_size", "n_shared_experts",
                             "shared_intermediate_size", "dense_intermediate_size", "first_k_dense_replace",
                             "moe_layer_freq", "scoring_func", "use_routing_bias", "routed_scaling_factor",
                             "use_qk_norm", "qk_norm_type", "use_gemma_norm", "swiglu_alpha", "swiglu_limit",
                             "attention_output_gate", "sparse_attention_config", "swiglu_beta"},
    "deepseek_v4": GENERIC | DEEPSEEK_MOE | {"q_lora_rank", "qk_rope_head_dim", "index_n_heads", "index_head_dim",
                                             "index_topk", "hc_mult", "hc_sinkhorn_iters", "hc_eps", "o_groups",
                                             "o_lora_rank", "num_hash_layers", "swiglu_limit", "sliding_window",
                                             "compress_ratios", "compress_rates", "compress_rope_theta",
                                             "layer_types", "expert_dtype"},
}

# MLA models take their head dims from qk_nope/qk_rope/v_head_dim and are multi-head over the latent.
MLA_IRRELEVANT = {"head_dim": "MLA head dims come from qk_nope_head_dim + qk_rope_head_dim and v_head_dim",
                  "num_key_value_heads": "MLA attends every head over one shared latent (HF ignores it too)",
                  "partial_rotary_factor": "MLA rotates exactly qk_rope_head_dim dims"}


def _one_of(*allowed: Any) -> Callable[[Any], bool]:
    return lambda v: v in allowed


def _falsy(v: Any) -> bool:
    return not v


def _quant_ok(v: Any) -> bool:
    """Block-fp8 checkpoints (DeepSeek/MiniMax/Kimi style): the loader dequantizes them to the engine dtype."""
    if not v:
        return True
    return (isinstance(v, dict) and v.get("quant_method") == "fp8"
            and list(v.get("weight_block_size") or [128, 128]) == [128, 128])


def _rope_ok(v: Any) -> bool:
    if not v:
        return True
    if not isinstance(v, dict):
        return False
    return (v.get("rope_type") or v.get("type") or "default") in ("default", "linear", "llama3", "yarn")


def _gemma3_rope_ok(v: Any) -> bool:
    """Gemma-3: default or linear rope (flat: the full layers'), or HF v5's per layer type form with default rope
    on sliding layers."""
    if not isinstance(v, dict) or not ({"full_attention", "sliding_attention"} & set(v)):
        return not v or (isinstance(v, dict) and (v.get("rope_type") or v.get("type") or "default") in ("default", "linear"))
    full, local = v.get("full_attention") or {}, v.get("sliding_attention") or {}
    return (full.get("rope_type") or "default") in ("default", "linear") and (local.get("rope_type") or "default") == "default"


_GELU = {"hidden_activation": (lambda v: v in ("gelu_pytorch_tanh", None), "gelu_pytorch_tanh"),
         "hidden_act": (lambda v: v in ("gelu_pytorch_tanh", None), "gelu_pytorch_tanh (HF Gemma reads hidden_activation)"),
         "attention_bias": (_falsy, "false"),
         "use_bidirectional_attention": (_falsy, "false (causal attention)"),
         "layer_types": (lambda v: v is None or set(v) <= {"full_attention", "sliding_attention"},
                         "full_attention / sliding_attention")}


# key -> (predicate on the value, what tkcc implements); a key absent from the config is never checked
VALUES: dict[str, tuple[Callable[[Any], bool], str]] = {
    "hidden_act": (_one_of("silu", "swiglu"), "silu (SwiGLU)"),
    "mlp_bias": (_falsy, "false"),
    "quantization_config": (_quant_ok, "none, or fp8 with 128x128 weight blocks (dequantized on load)"),
    "rope_scaling": (_rope_ok, "default, linear, llama3 or yarn rope"),
    "rope_parameters": (_rope_ok, "default, linear, llama3 or yarn rope"),
    "scoring_func": (_one_of("softmax", "sigmoid"), "softmax or sigmoid"),
    "topk_method": (_one_of("noaux_tc", "greedy", "group_limited_greedy"), "noaux_tc, greedy or group_limited_greedy"),
    "qk_norm_type": (_one_of("per_layer", "per_head"), "per_layer or per_head"),
    "use_sliding_window": (_falsy, "false (this family has no sliding-window attention in tkcc)"),
    "attention_output_gate": (_falsy, "false"),
    "moe_router_dtype": (_one_of("float32", "fp32", None), "float32"),
    "layer_types": (lambda v: v is None or set(v) <= {"full_attention"}, "every layer full_attention"),
    "mamba_ssm_dtype": (_one_of("float32", None), "float32 (the recurrent state is kept in fp32)"),
    "output_gate_type": (_one_of("swish", None), "swish (the gated RMSNorm's silu)"),
}

# per family, value checks that replace the generic ones
FAMILY_VALUES: dict[str, dict[str, tuple[Callable[[Any], bool], str]]] = {
    "minimax_m3": {"hidden_act": (_one_of("swigluoai"), "swigluoai"),
                   "swiglu_beta": (_one_of(1, 1.0), "1.0 (up + 1)")},
    "qwen3": {"use_sliding_window": (lambda v: True, "true or false"),
              "layer_types": (lambda v: v is None or set(v) <= {"full_attention", "sliding_attention"},
                              "full_attention / sliding_attention")},
    "qwen3_moe": {"use_sliding_window": (lambda v: True, "true or false"),
                  "layer_types": (lambda v: v is None or set(v) <= {"full_attention", "sliding_attention"},
                                  "full_attention / sliding_attention")},
    "qwen3_5": {"layer_types": (lambda v: v is None or set(v) <= {"linear_attention", "full_attention"},
                                "linear_attention / full_attention")},
    "qwen3_5_moe": {"layer_types": (lambda v: v is None or set(v) <= {"linear_attention", "full_attention"},
                                    "linear_attention / full_attention"),
                    "norm_topk_prob": (lambda v: v is None or bool(v), "true (HF's Qwen3.5 router always renormalises)"),
                    "decoder_sparse_step": (_one_of(1, None), "1 (every layer MoE)"),
                    "mlp_only_layers": (_falsy, "none (every layer MoE)")},
    "deepseek_v4": {"scoring_func": (_one_of("sqrtsoftplus", "sigmoid", "softmax"), "sqrtsoftplus, sigmoid or softmax"),
                    "layer_types": (lambda v: v is None or set(v) <= {"sliding_attention", "compressed_sparse_attention",
                                                                      "heavily_compressed_attention"},
                                    "sliding / compressed_sparse / heavily_compressed attention"),
                    "expert_dtype": (_one_of("fp4", "bf16", None), "fp4 (dequantized on load) or bf16"),
                    "hidden_act": (_one_of("silu"), "silu (clamped by swiglu_limit)")},
    "llama4": {"layer_types": (lambda v: v is None or set(v) <= {"full_attention", "chunked_attention"},
                               "full_attention / chunked_attention"),
               "attention_bias": (_falsy, "false")},
    "mimo_v2_flash": {"rope_parameters": (_falsy, "the Hub spelling: rope_theta and swa_rope_theta, default rope"),
                      "rope_scaling": (_falsy, "none (default rope on both layer kinds)"),
                      "hidden_act": (_one_of("silu"), "silu (SwiGLU)")},
    "gemma2": _GELU,
    "gemma3": {**_GELU, "rope_scaling": (_gemma3_rope_ok, "default or linear rope on full layers"),
               "rope_parameters": (_gemma3_rope_ok, "default or linear rope on full layers, default on sliding ones"),
               "attn_logit_softcapping": (lambda v: v is None, "null (HF's Gemma3Attention never soft-caps scores)")},
    "gemma4": {**_GELU, "rope_parameters": (lambda v: True, "per layer type (models/gemma4_config.py)"),
               "use_bidirectional_attention": (_one_of(None, "vision"), "null or vision (text decodes causally)"),
               "attn_logit_softcapping": (lambda v: v is None, "null (HF's Gemma-4 attention never soft-caps scores)"),
               **{k: (lambda v: v is None, "null (Gemma-4 gives its rope per layer type in rope_parameters)")
                  for k in ("rope_theta", "rope_scaling", "rotary_dim", "partial_rotary_factor")}},
    "glm_moe_dsa": {"layer_types": (lambda v: v is None or set(v) <= {"deepseek_sparse_attention"},
                                    "every layer deepseek_sparse_attention")},
}


def check_config(cfg: dict, family: str, name: str, error: type[Exception]) -> None:
    """Raise ``error`` (one line) for the first key of ``cfg`` tkcc would otherwise ignore or misread."""
    known = FAMILY_KEYS[family]
    mla = bool(known & MLA)
    for key in cfg:
        if key in known or key in NO_MATH or (mla and key in MLA_IRRELEVANT):
            continue
        neutral = neutral_rule(family, key)             # models/neutral_keys.py
        if neutral is not None:
            if neutral[0](cfg[key]):
                continue
            raise error(f"{name}: config key {key!r} = {cfg[key]!r} is not implemented for {family} (tkcc accepts "
                        f"only its neutral value {neutral[1]})")
        raise error(f"{name}: config key {key!r} is not implemented for {family} and not known to leave the math "
                    "unchanged; refusing the config rather than ignoring it")
    checks = {**VALUES, **FAMILY_VALUES.get(family, {})}
    for key, (ok, wanted) in checks.items():
        if key in cfg and key in known | set(NO_MATH) and not ok(cfg[key]):
            raise error(f"{name}: config key {key!r} = {cfg[key]!r} is not implemented (tkcc implements {wanted})")
