"""The config of Kimi-Linear / Kimi-K3 (family ``kimi_linear``): which keys tkcc implements, which leave the
math unchanged (with the reason), and the ModelSpec fields they give. Pure data (no torch).

Kimi-K3's config.json is a multimodal wrapper (``KimiK3ForConditionalGeneration``) around a ``text_config``
of ``KimiLinearForCausalLM``; tkcc runs the text decoder (``models/wrappers.py``). Its layers (Moonshot's
``modeling_kimi_linear.py``; vLLM ``kimi_linear.py``; SGLang's Kimi-K3 model):
  linear_attn_config   kda_layers / full_attn_layers (1-based): Kimi delta attention or MLA per layer;
                       num_heads, head_dim, short_conv_kernel_size; gate_lower_bound (the "safe gate");
                       use_full_rank_gate (KDA's output gate from one full projection instead of g_a / g_b)
  mla_use_nope         MLA without rotary (Moonshot's code asserts it); mla_use_output_gate: o * sigmoid(g_proj(h))
  num_experts, num_experts_per_token, num_shared_experts, moe_router_activation_func, moe_renormalize,
  topk_method noaux_tc (correction bias), routed_expert_hidden_size + latent_moe_use_norm (routed experts run
  in a latent: down_proj, experts, rms_norm, up_proj; shared experts at full width on the same input)
  hidden_act situ      SiTU-GLU with activation_situ_beta / activation_situ_linear_beta
  attn_res_block_size  attention residuals: each block's input is a softmax mix of the block summaries
"""

from __future__ import annotations

from typing import Any

from persistent_engine.models.config_keys import SpecError

__all__ = ["kimi_fields", "KIMI_KEYS", "int4_experts_ok", "quantization_kind"]

# keys of Moonshot's KimiLinearConfig (text_config) that tkcc implements
KIMI_KEYS = {
    "hidden_size", "num_hidden_layers", "vocab_size", "num_attention_heads", "num_key_value_heads", "intermediate_size",
    "rms_norm_eps", "max_position_embeddings", "tie_word_embeddings", "hidden_act", "quantization_config",
    "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim", "mla_use_nope",
    "mla_use_output_gate", "num_experts", "num_experts_per_token", "num_shared_experts", "moe_intermediate_size",
    "moe_layer_freq", "first_k_dense_replace", "moe_renormalize", "moe_router_activation_func", "num_expert_group",
    "topk_group", "use_grouped_topk", "topk_method", "routed_scaling_factor", "routed_expert_hidden_size",
    "latent_moe_use_norm", "activation_situ_beta", "activation_situ_linear_beta", "attn_res_block_size",
    "linear_attn_config",
}
_LINEAR_KEYS = {"full_attn_layers", "kda_layers", "head_dim", "num_heads", "short_conv_kernel_size", "gate_lower_bound",
                "use_full_rank_gate"}
_MXFP4_IGNORED = {"re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*",
                  "re:.*lm_head.*", "re:.*vision_tower.*", "re:.*mm_projector.*"}


def mxfp4_experts_ok(v: Any) -> bool:
    """compressed-tensors MXFP4 (e2m1 values x e8m0 scales, groups of 32) on the routed experts only: every such
    weight is exactly representable in bf16, so the engine's bf16 experts compute the same products."""
    if not v:
        return True
    if not isinstance(v, dict) or v.get("quant_method") != "compressed-tensors":
        return False
    groups = list((v.get("config_groups") or {}).values())
    if len(groups) != 1 or v.get("format") != "mxfp4-pack-quantized" or set(v.get("ignore") or ()) != _MXFP4_IGNORED:
        return False
    w, g = groups[0].get("weights") or {}, groups[0]
    return (g.get("input_activations") is None and g.get("output_activations") is None and w.get("num_bits") == 4
            and w.get("type") == "float" and w.get("group_size") == 32 and w.get("strategy") == "group"
            and v.get("kv_cache_scheme") is None)


_INT4_IGNORED = {"lm_head", "re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*"}


def int4_experts_ok(v: Any) -> bool:
    """compressed-tensors W4A16 on the routed experts only (Kimi-K2-Thinking / Kimi-K2.5): symmetric int4 in
    groups of 32 along the input dim, bf16 scales, no zero point; dequantized on load to the engine dtype (a
    rounding-level difference, as for block-fp8 checkpoints)."""
    if not isinstance(v, dict) or v.get("quant_method") != "compressed-tensors":
        return False
    groups = list((v.get("config_groups") or {}).values())
    if len(groups) != 1 or v.get("format") != "pack-quantized" or set(v.get("ignore") or ()) != _INT4_IGNORED:
        return False
    w, g = groups[0].get("weights") or {}, groups[0]
    return (g.get("input_activations") is None and g.get("output_activations") is None and w.get("num_bits") == 4
            and w.get("type") == "int" and w.get("symmetric") is True and w.get("group_size") == 32
            and w.get("strategy") == "group" and not w.get("dynamic") and w.get("actorder") is None
            and v.get("kv_cache_scheme") is None)


def quantization_kind(q: Any) -> str:
    """ModelSpec.quantization of a quantization_config that config_keys accepted."""
    if not q:
        return "none"
    if int4_experts_ok(q):
        return "int4-experts"
    return "mxfp4-experts" if mxfp4_experts_ok(q) else "fp8-block128"


def _layer_flags(la: dict, num_layers: int, name: str) -> tuple[bool, ...]:
    kda = [int(i) for i in la.get("kda_layers") or []]
    full = [int(i) for i in la.get("full_attn_layers") or []]
    if sorted(kda + full) != list(range(1, num_layers + 1)):
        raise SpecError(f"{name}: linear_attn_config kda_layers and full_attn_layers must split the layers "
                        f"1..{num_layers}")
    return tuple(i + 1 in set(kda) for i in range(num_layers))


def kimi_fields(c: dict, name: str, num_layers: int) -> dict[str, Any]:
    """ModelSpec fields of a KimiLinearConfig (already unwrapped), refusing what tkcc does not implement."""
    if c.get("mla_use_nope") is not True:
        raise SpecError(f"{name}: kimi_linear MLA with rotary (mla_use_nope false) is not implemented; Moonshot's "
                        "modeling code asserts mla_use_nope")
    if int(c.get("moe_layer_freq", 1)) != 1:
        raise SpecError(f"{name}: moe_layer_freq {c['moe_layer_freq']} is not implemented (1: every layer from "
                        "first_k_dense_replace on is MoE)")
    la = c.get("linear_attn_config") or {}
    unknown = sorted(set(la) - _LINEAR_KEYS)
    if unknown:
        raise SpecError(f"{name}: linear_attn_config key {unknown[0]!r} is not implemented; refusing the config "
                        "rather than ignoring it")
    kw: dict[str, Any] = dict(mla_nope=True, mla_output_gate=bool(c.get("mla_use_output_gate", False)),
                              quantization="mxfp4-experts" if c.get("quantization_config") else "none")
    if la:
        kw.update(kda_layers=_layer_flags(la, num_layers, name), kda_num_heads=int(la["num_heads"]),
                  kda_head_dim=int(la["head_dim"]), kda_conv_size=int(la["short_conv_kernel_size"]),
                  kda_gate_lower_bound=None if la.get("gate_lower_bound") is None else float(la["gate_lower_bound"]),
                  kda_full_rank_gate=bool(la.get("use_full_rank_gate", False)))
        if int(c["v_head_dim"]) != kw["kda_head_dim"]:
            raise SpecError(f"{name}: KDA value heads of v_head_dim {c['v_head_dim']} != head_dim {la['head_dim']} "
                            "are not implemented")
        if kw["kda_conv_size"] < 2:
            raise SpecError(f"{name}: short_conv_kernel_size must be at least 2")
    if c.get("num_experts"):
        groups = int(c.get("num_expert_group") or 1) if c.get("use_grouped_topk", False) else 1
        shared = int(c.get("num_shared_experts") or 0)
        kw.update(num_experts=int(c["num_experts"]), num_experts_per_tok=int(c["num_experts_per_token"]),
                  moe_intermediate_size=int(c["moe_intermediate_size"]), num_shared_experts=shared,
                  first_k_dense=int(c.get("first_k_dense_replace", 0)),
                  scoring=c.get("moe_router_activation_func", "sigmoid"),
                  routing_bias=c.get("topk_method", "noaux_tc") == "noaux_tc",
                  norm_topk_prob=bool(c.get("moe_renormalize", True)),
                  routed_scaling_factor=float(c.get("routed_scaling_factor", 1.0)),
                  n_group=groups, topk_group=int(c.get("topk_group") or 1) if groups > 1 else 1,
                  latent_moe_size=int(c.get("routed_expert_hidden_size") or 0),
                  latent_moe_norm=bool(c.get("latent_moe_use_norm", False) and c.get("routed_expert_hidden_size")))
    if c.get("hidden_act", "silu") == "situ":
        lb = c.get("activation_situ_linear_beta")
        kw.update(mlp_act="situ", situ_beta=float(c.get("activation_situ_beta") or 1.0),
                  situ_linear_beta=None if lb is None else float(lb))
    bs = c.get("attn_res_block_size")
    if bs is not None:
        if int(bs) < 1:
            raise SpecError(f"{name}: attn_res_block_size must be at least 1")
        kw["attn_res_block_size"] = int(bs)
    return kw


def _register() -> None:
    """kimi_linear's entries in the no-silent-drop tables of ``config_keys`` (kept here, beside the keys)."""
    from persistent_engine.models import config_keys as ck

    ck.FAMILY_KEYS["kimi_linear"] = set(KIMI_KEYS)
    ck.FAMILY_VALUES["deepseek_v3"] = {
        "quantization_config": (lambda v: ck._quant_ok(v) or int4_experts_ok(v),
                                "none, fp8 with 128x128 weight blocks, or compressed-tensors int4 (groups of 32) on "
                                "the routed experts only (dequantized on load)")}
    ck.FAMILY_VALUES["kimi_linear"] = {
        "hidden_act": (ck._one_of("silu", "situ"), "silu or situ"),
        "moe_router_activation_func": (ck._one_of("sigmoid", "softmax"), "sigmoid or softmax"),
        "quantization_config": (mxfp4_experts_ok, "none, or compressed-tensors MXFP4 (groups of 32) on the routed "
                                                  "experts only"),
    }


_register()
