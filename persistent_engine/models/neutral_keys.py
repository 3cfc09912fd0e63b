"""Neutral values: a config key a family does not implement is still accepted when its value is the one that
leaves the math unchanged (``qkv_bias: false`` in Qwen3-Coder-480B's config: no q/k/v bias, which is what tkcc
runs). Any other value is refused by name (``config_keys.check_config``). Pure data (no torch).

``NEUTRAL[key] = (predicate on the value, the neutral value and why it is neutral)``; ``FAMILY_NEUTRAL[family]``
overrides it where the neutral value depends on the family (``use_qk_norm: true`` is neutral for Qwen3, whose
attention always normalises q and k, and not for Llama). A key the family implements is never looked up here.
"""

from __future__ import annotations

from typing import Any, Callable

__all__ = ["NEUTRAL", "FAMILY_NEUTRAL", "neutral_rule"]

Rule = tuple[Callable[[Any], bool], str]


def _off(v: Any) -> bool:
    """false, null, 0, [] or {}: the feature is absent."""
    return not v


def _is(*values: Any) -> Callable[[Any], bool]:
    return lambda v: any(v is x or (type(v) is type(x) and v == x) for x in values)


def _all_full(v: Any) -> bool:
    return v is None or (isinstance(v, list) and set(v) <= {"full_attention"})


NEUTRAL: dict[str, Rule] = {
    "qkv_bias": (_off, "false (no q/k/v projection bias)"),
    "attention_bias": (_off, "false (no q/k/v/o projection bias)"),
    "mlp_bias": (_off, "false (no MLP bias)"),
    "o_proj_bias": (_off, "false (no output projection bias)"),
    "sliding_window": (_is(None, 0), "null (no sliding window: every layer attends every cached token)"),
    "sliding_window_size": (_is(None, 0), "null (no sliding window)"),
    "use_sliding_window": (_is(False, None), "false (no sliding window)"),
    "attention_chunk_size": (_is(None, 0), "null (no chunked attention)"),
    "layer_types": (_all_full, "every layer full_attention"),
    "attn_logit_softcapping": (_is(None, 0, 0.0), "null (no soft-cap of the attention scores)"),
    "final_logit_softcapping": (_is(None, 0, 0.0), "null (no soft-cap of the logits)"),
    "use_bidirectional_attention": (_off, "false (causal attention)"),
    "attention_output_gate": (_off, "false (no output gate)"),
    "shared_expert_intermediate_size": (_is(0, None), "0 (no shared expert)"),
    "n_shared_experts": (_is(0, None), "0 (no shared expert)"),
    "num_shared_experts": (_is(0, None), "0 (no shared expert)"),
    "use_qk_norm": (_is(False, None), "false (no QK-norm)"),
    "embedding_multiplier": (_is(1, 1.0, None), "1.0 (embeddings unscaled)"),
    "residual_multiplier": (_is(1, 1.0, None), "1.0 (residual branches unscaled)"),
    "logits_scaling": (_is(1, 1.0, None), "1.0 (logits unscaled)"),
    "for_llm_compressor": (_off, "false (HF's fused expert modules; true only changes their module layout for "
                                 "llm-compressor)"),
}

FAMILY_NEUTRAL: dict[str, dict[str, Rule]] = {
    # HF Qwen3(Moe)Attention always applies q_norm / k_norm (per head)
    "qwen3": {"use_qk_norm": (_is(True, None), "true (Qwen3 attention always normalises q and k per head)")},
    "qwen3_moe": {"use_qk_norm": (_is(True, None), "true (Qwen3 attention always normalises q and k per head)")},
}


# families whose own keys lay out per-layer windows (MiMo-V2-Flash's hybrid_layer_pattern): an all-full
# ``layer_types`` would contradict them, so it has no neutral value there
NOT_NEUTRAL: dict[str, frozenset[str]] = {"mimo_v2_flash": frozenset({"layer_types"})}


def neutral_rule(family: str, key: str) -> Rule | None:
    """The neutral-value rule for a key ``family`` does not implement (None: the key has no neutral value)."""
    if key in NOT_NEUTRAL.get(family, ()):
        return None
    return FAMILY_NEUTRAL.get(family, {}).get(key) or NEUTRAL.get(key)
