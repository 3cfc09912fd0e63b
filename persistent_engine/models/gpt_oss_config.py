"""gpt-oss's config section (``GptOssForCausalLM``; the model: models/gpt_oss.py): its keys of an HF config.json as
``ModelSpec`` fields, refusing values tkcc does not implement (``SpecError``, one line). Pure data (no torch).

Source: HF transformers ``models/gpt_oss/configuration_gpt_oss.py`` (Apache-2.0): defaults 128 experts top-4,
``layer_types`` alternating sliding_attention (even layers) / full_attention, window 128, YaRN rope, rms eps 1e-5,
``attention_bias`` true (q, k, v and o), swiglu_alpha 1.702 / swiglu_limit 7. The Hub config also carries the
original implementation's spellings ``experts_per_token`` (= num_experts_per_tok) and ``initial_context_length``
(= the rope's original_max_position_embeddings), which must agree with those.
"""

from __future__ import annotations

from typing import Any

from persistent_engine.models.config_keys import SpecError

__all__ = ["GPT_OSS_KEYS", "gpt_oss_fields", "mxfp4_ok"]

GPT_OSS_KEYS = {"layer_types", "sliding_window", "num_local_experts", "num_experts_per_tok", "experts_per_token",
                "swiglu_alpha", "swiglu_limit", "initial_context_length"}
LAYER_TYPES = {"sliding_attention", "full_attention"}
NOT_CONVERTED = ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens", "lm_head"]


def mxfp4_ok(v: Any) -> bool:
    """No quantization, or the Hub's MXFP4 on the routed experts only (every other module in
    ``modules_to_not_convert``, the published list)."""
    if not v:
        return True
    return (isinstance(v, dict) and v.get("quant_method") == "mxfp4" and set(v) <= {"quant_method",
            "modules_to_not_convert"} and sorted(v.get("modules_to_not_convert") or []) == sorted(NOT_CONVERTED))


def gpt_oss_fields(c: dict, name: str, num_layers: int) -> dict[str, Any]:
    """ModelSpec fields of a GptOssConfig (HF defaults where a key is absent), refusing what is not implemented."""
    types = list(c.get("layer_types") or ["sliding_attention" if i % 2 == 0 else "full_attention"
                                          for i in range(num_layers)])
    if len(types) != num_layers or set(types) - LAYER_TYPES:
        raise SpecError(f"{name}: layer_types must give sliding_attention or full_attention for each of the "
                        f"{num_layers} layers")
    window = int(c.get("sliding_window") or 0)
    if "sliding_attention" in types and window < 1:
        raise SpecError(f"{name}: layer_types has sliding_attention layers but sliding_window is not set")
    k = int(c.get("num_experts_per_tok", 4))
    if int(c.get("experts_per_token", k)) != k:
        raise SpecError(f"{name}: experts_per_token {c['experts_per_token']} differs from num_experts_per_tok {k}")
    rope = c.get("rope_scaling") or c.get("rope_parameters") or {}
    ctx = c.get("initial_context_length")
    if ctx is not None and int(ctx) != int(rope.get("original_max_position_embeddings", ctx)):
        raise SpecError(f"{name}: initial_context_length {ctx} differs from the rope's original_max_position_embeddings "
                        f"{rope['original_max_position_embeddings']}")
    if not c.get("attention_bias", True):
        raise SpecError(f"{name}: gpt_oss without attention biases (attention_bias false) is not implemented")
    return dict(
        layer_windows=tuple(window if t == "sliding_attention" else 0 for t in types), attention_sinks=True,
        qkv_bias=True, o_bias=True, moe_bias=True, num_experts=int(c.get("num_local_experts", 128)),
        num_experts_per_tok=k, moe_intermediate_size=int(c.get("intermediate_size", 2880)), scoring="softmax",
        norm_topk_prob=True, mlp_act="swigluoai", swiglu_alpha=float(c.get("swiglu_alpha", 1.702)),
        swiglu_limit=float(c.get("swiglu_limit", 7.0)), rms_norm_eps=float(c.get("rms_norm_eps", 1e-5)),
        rope_theta=float(c.get("rope_theta", rope.get("rope_theta", 150000.0))),
        quantization="mxfp4-experts" if c.get("quantization_config") else "none",
        expert_dtype="mxfp4" if c.get("quantization_config") else "bf16")


def _register() -> None:
    """gpt_oss's entries in the no-silent-drop tables of ``config_keys`` (kept here, beside the keys)."""
    from persistent_engine.models import config_keys as ck

    ck.FAMILY_KEYS["gpt_oss"] = ck.GENERIC | GPT_OSS_KEYS
    ck.FAMILY_VALUES["gpt_oss"] = {
        # HF's GptOssExperts always applies the clamped SwiGLU; hidden_act is not read, silu is the Hub's value
        "hidden_act": (ck._one_of("silu"), "silu (the experts' clamped SwiGLU, alpha and limit)"),
        "layer_types": (lambda v: v is None or set(v) <= LAYER_TYPES, "sliding_attention / full_attention"),
        "quantization_config": (mxfp4_ok, "none, or mxfp4 on the routed experts only (modules_to_not_convert: "
                                          + ", ".join(NOT_CONVERTED) + ")"),
        "attention_bias": (lambda v: v is None or bool(v), "true (q, k, v and o biases)"),
        "mlp_bias": (ck._falsy, "false (the experts' biases are always on)"),
    }


_register()
