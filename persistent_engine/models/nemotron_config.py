"""The config of Nemotron-H (family ``nemotron_h``: NVIDIA Nemotron-3 Nano and Super): which keys tkcc implements,
which leave the math unchanged (with the reason), the ModelSpec fields they give (``NemotronFields``, mixed into
ModelSpec) and their size arithmetic. Pure data (no torch).

Sources: HF transformers ``configuration_nemotron_h.py`` / ``modeling_nemotron_h.py`` and vLLM ``nemotron_h.py``
(both Apache-2.0). ``hybrid_override_pattern`` gives one block per layer, each ``x + mixer(rms_norm(x))``:
  M  Mamba-2 mixer (``models/mamba.py``, ops in ``ops/mamba.py``): a recurrent state per sequence, no KV cache
  *  attention: GQA without rotary (neither HF's NemotronHAttention nor vLLM's applies one; rope_theta and
     partial_rotary_factor are written to the config but never read)
  -  dense MLP: down(relu(up(x))^2), not gated (mlp_hidden_act relu2)
  E  MoE: sigmoid router with e_score_correction_bias, grouped top-k (DeepSeek-V3's), renormalised, times
     routed_scaling_factor; relu2 experts, in a latent of moe_latent_size (fc1_latent_proj / fc2_latent_proj)
     when set; plus the relu2 shared expert on the block input
Newer HF writes ``layers_block_type`` (mamba / attention / mlp / moe, or linear_attention / full_attention)
instead of the pattern; both are read.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from persistent_engine.models.config_keys import SpecError

__all__ = ["NemotronFields", "nemotron_fields", "nemotron_tiny", "NEMOTRON_KEYS", "NEMOTRON_NO_MATH"]

BLOCKS = {"M": "mamba", "*": "attention", "-": "mlp", "E": "moe"}
_LIST_NAMES = {"mamba": "M", "linear_attention": "M", "attention": "*", "full_attention": "*", "mlp": "-",
               "moe": "E"}

NEMOTRON_KEYS = {
    "hidden_size", "num_hidden_layers", "vocab_size", "num_attention_heads", "num_key_value_heads", "head_dim",
    "intermediate_size", "tie_word_embeddings", "max_position_embeddings", "attention_bias", "quantization_config",
    "hybrid_override_pattern", "layers_block_type", "layer_norm_epsilon", "norm_eps", "mlp_hidden_act", "mlp_bias",
    "use_bias", "mamba_num_heads", "mamba_head_dim", "ssm_state_size", "n_groups", "conv_kernel", "use_conv_bias",
    "mamba_hidden_act", "mamba_proj_bias", "mamba_ssm_cache_dtype", "time_step_limit", "residual_in_fp32",
    "n_routed_experts", "num_experts_per_tok", "moe_intermediate_size", "n_shared_experts",
    "moe_shared_expert_intermediate_size", "moe_latent_size", "norm_topk_prob", "routed_scaling_factor", "n_group",
    "topk_group", "sliding_window",
}
NEMOTRON_NO_MATH = {
    "rope_theta": "Nemotron-H attention has no rotary (HF NemotronHAttention, vLLM nemotron_h.py apply none)",
    "partial_rotary_factor": "Nemotron-H attention has no rotary (HF NemotronHAttention, vLLM nemotron_h.py)",
    "expand": "HF and vLLM size the Mamba mixer by mamba_num_heads x mamba_head_dim, never by expand",
    "chunk_size": "the SSD scan's chunk length: the scan's result does not depend on it",
    "time_step_min": "dt_bias initialisation (HF's slow torch_forward also clamps dt at it; its kernel path and "
                     "vLLM's, which tkcc follows, do not)",
    "time_step_max": "dt_bias initialisation", "time_step_floor": "dt_bias initialisation",
    "use_mamba_kernels": "HF's choice of kernels for the same math", "num_logits_to_keep": "HF generation setting",
    "rescale_prenorm_residual": "training-time initialisation",
    "moe_shared_expert_overlap": "Megatron's overlap of the shared expert with the routed dispatch (scheduling)",
    "mtp_hybrid_override_pattern": "multi-token-prediction layers: speculative decoding only",
    "mtp_layers_block_type": "multi-token-prediction layers: speculative decoding only",
}


def _is(*allowed):
    return lambda v: v in allowed


def _dt_limit_ok(v: Any) -> bool:
    return isinstance(v, (list, tuple)) and len(v) == 2 and float(v[0]) <= 0.0 and float(v[1]) >= 1e30


@dataclass(frozen=True, kw_only=True)
class NemotronFields:
    """Nemotron-H's fields of ModelSpec (keyword-only, after ModelSpec's own) and their structure and sizes."""
    hybrid_pattern: str = ""            # one letter per layer (BLOCKS); "" for every other family
    mamba_num_heads: int = 0
    mamba_head_dim: int = 0
    ssm_state_size: int = 0
    mamba_n_groups: int = 1
    mamba_conv_kernel: int = 0

    def layer_block(self, i: int) -> str:
        """Layer i's one block: 'mamba', 'attention', 'mlp' or 'moe' (Nemotron-H), '' for other families."""
        return BLOCKS[self.hybrid_pattern[i]] if self.hybrid_pattern else ""

    def is_mamba(self, i: int) -> bool:
        return bool(self.hybrid_pattern) and self.hybrid_pattern[i] == "M"

    @property
    def mamba_inner(self) -> int:
        """I = Hm P: the mixer's SSM width (x, z and the gated norm)."""
        return self.mamba_num_heads * self.mamba_head_dim

    @property
    def mamba_conv_dim(self) -> int:
        """Channels of the short conv: x (I) then B and C (G N each)."""
        return self.mamba_inner + 2 * self.mamba_n_groups * self.ssm_state_size

    @property
    def mamba_in_proj_dim(self) -> int:
        """Rows of in_proj: z (I) | xBC (conv channels) | dt (Hm)."""
        return self.mamba_inner + self.mamba_conv_dim + self.mamba_num_heads

    def nemotron_layer_params(self, i: int) -> tuple[int, int]:
        """(total, active per token) parameters of Nemotron-H layer i, its norm included."""
        h, block = self.hidden_size, self.layer_block(i)
        if block == "mamba":
            c, hm = self.mamba_conv_dim, self.mamba_num_heads
            n = h * self.mamba_in_proj_dim + c * (self.mamba_conv_kernel + 1) + 3 * hm + self.mamba_inner * (h + 1)
            return n + h, n + h
        if block == "attention":
            n = h * (self.num_heads + 2 * self.num_kv_heads) * self.head_dim + self.num_heads * self.head_dim * h
            return n + h, n + h
        if block == "mlp":
            return 2 * h * self.intermediate_size + h, 2 * h * self.intermediate_size + h
        lat, e = self.latent_moe_size or h, self.num_experts
        base = h * e + e + 2 * h * self.shared_intermediate_size * self.num_shared_experts + h
        base += 2 * h * lat if self.latent_moe_size else 0
        expert = 2 * lat * self.moe_intermediate_size
        return base + e * expert, base + self.num_experts_per_tok * expert

    def nemotron_kv_elems(self, layer: int | None) -> float:
        """KV elements per token of layer ``layer`` (None: the mean layer): K and V on attention layers only."""
        blocks = [self.layer_block(layer)] if layer is not None else [BLOCKS[ch] for ch in self.hybrid_pattern]
        return 2.0 * self.num_kv_heads * self.head_dim * blocks.count("attention") / len(blocks)

    def nemotron_state_bytes(self, dtype_bytes: float) -> float:
        """A Mamba layer's per-sequence state: SSM [Hm, P, N] fp32 + conv inputs [C, K - 1] in the model dtype."""
        return (4.0 * self.mamba_num_heads * self.mamba_head_dim * self.ssm_state_size
                + self.mamba_conv_dim * (self.mamba_conv_kernel - 1) * dtype_bytes)


def _pattern(c: dict, name: str) -> str:
    if c.get("hybrid_override_pattern"):
        pattern = str(c["hybrid_override_pattern"])
    elif isinstance(c.get("layers_block_type"), list):
        bad = [t for t in c["layers_block_type"] if t not in _LIST_NAMES]
        if bad:
            raise SpecError(f"{name}: layers_block_type entry {bad[0]!r} is not a Nemotron-H block")
        pattern = "".join(_LIST_NAMES[t] for t in c["layers_block_type"])
    else:
        raise SpecError(f"{name}: a Nemotron-H config needs hybrid_override_pattern or layers_block_type")
    bad = sorted(set(pattern) - set(BLOCKS))
    if bad:
        raise SpecError(f"{name}: hybrid_override_pattern letter {bad[0]!r} is not implemented (M, *, -, E)")
    if c.get("num_hidden_layers") is not None and int(c["num_hidden_layers"]) != len(pattern):
        raise SpecError(f"{name}: num_hidden_layers {c['num_hidden_layers']} != the {len(pattern)} layers of "
                        "hybrid_override_pattern")
    return pattern


def nemotron_fields(c: dict, name: str) -> dict[str, Any]:
    """ModelSpec fields of a NemotronHConfig, refusing what tkcc does not implement."""
    pattern = _pattern(c, name)
    eps = float(c.get("layer_norm_epsilon", c.get("norm_eps", 1e-5)))
    if "norm_eps" in c and float(c["norm_eps"]) != eps:
        raise SpecError(f"{name}: norm_eps {c['norm_eps']} != layer_norm_epsilon {eps} (HF reads layer_norm_epsilon)")
    heads, groups = int(c.get("mamba_num_heads", 128)), int(c.get("n_groups", 8))
    if "M" in pattern and heads % groups:
        raise SpecError(f"{name}: mamba_num_heads {heads} is not a multiple of n_groups {groups}")
    kw: dict[str, Any] = dict(
        num_layers=len(pattern), hybrid_pattern=pattern, rms_norm_eps=eps, mlp_act="relu2",
        rope_layers=(False,) * len(pattern), mlp_layer_types=tuple("moe" if ch == "E" else "dense" for ch in pattern),
        mamba_num_heads=heads, mamba_head_dim=int(c.get("mamba_head_dim", 64)),
        ssm_state_size=int(c.get("ssm_state_size", 128)), mamba_n_groups=groups,
        mamba_conv_kernel=int(c.get("conv_kernel", 4)))
    if kw["mamba_conv_kernel"] < 2:
        raise SpecError(f"{name}: conv_kernel must be at least 2")
    if "E" in pattern:
        kw.update(num_experts=int(c.get("n_routed_experts", 8)),
                  num_experts_per_tok=int(c.get("num_experts_per_tok", 2)),
                  moe_intermediate_size=int(c.get("moe_intermediate_size", 7688)),
                  num_shared_experts=int(c.get("n_shared_experts") or 0),
                  shared_intermediate_size=int(c.get("moe_shared_expert_intermediate_size", 7688)),
                  scoring="sigmoid", routing_bias=True, norm_topk_prob=bool(c.get("norm_topk_prob", True)),
                  routed_scaling_factor=float(c.get("routed_scaling_factor", 1.0)),
                  n_group=int(c.get("n_group") or 1), topk_group=int(c.get("topk_group") or 1),
                  latent_moe_size=int(c.get("moe_latent_size") or 0))
    return kw


def nemotron_tiny(spec, kw: dict) -> dict[str, Any]:
    """Nemotron-H at toy size: one layer of each block letter the model has, in the order they first appear
    (Nano and Super: "ME*"), 8 Mamba heads of 16 (groups kept when the model has several), state 16, 16 experts
    of 32 (top 4), a latent half the hidden size when the model has one; {} for other families."""
    if not spec.hybrid_pattern:
        return {}
    pattern = "".join(dict.fromkeys(spec.hybrid_pattern))
    hidden = kw["hidden_size"]
    out = dict(num_layers=len(pattern), hybrid_pattern=pattern, rope_layers=(False,) * len(pattern),
               mlp_layer_types=tuple("moe" if ch == "E" else "dense" for ch in pattern), mamba_num_heads=8,
               mamba_head_dim=16, ssm_state_size=16, mamba_n_groups=2 if spec.mamba_n_groups > 1 else 1)
    if spec.is_moe:
        out.update(n_group=1, topk_group=1, latent_moe_size=hidden // 2 if spec.latent_moe_size else 0)
    return out


def _register() -> None:
    """nemotron_h's entries in the no-silent-drop tables of ``config_keys`` (kept here, beside the keys)."""
    from persistent_engine.models import config_keys as ck

    ck.FAMILY_KEYS["nemotron_h"] = NEMOTRON_KEYS | set(NEMOTRON_NO_MATH)
    ck.FAMILY_VALUES["nemotron_h"] = {
        "mlp_hidden_act": (_is("relu2"), "relu2"), "mamba_hidden_act": (_is("silu", "swish"), "silu"),
        "mlp_bias": (ck._falsy, "false"), "use_bias": (ck._falsy, "false"), "mamba_proj_bias": (ck._falsy, "false"),
        "attention_bias": (ck._falsy, "false"), "use_conv_bias": (_is(True), "true"),
        "residual_in_fp32": (ck._falsy, "false (the residual stream in the model dtype)"),
        "mamba_ssm_cache_dtype": (_is("float32", None), "float32 (the SSM state is kept in fp32)"),
        "time_step_limit": (_dt_limit_ok, "[0.0, inf] (no dt clamp)"),
        "sliding_window": (lambda v: v is None, "null (full attention)"),
        "moe_latent_size": (lambda v: v is None or int(v) > 0, "null or a positive width"),
    }


_register()
