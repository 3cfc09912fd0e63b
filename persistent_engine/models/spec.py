"""ModelSpec: the architecture of a decoder-only LLM, parsed from an HF ``config.json``.

Pure data: importing this module must not import torch (the cost model reads specs on machines
without it). Every figure here is arithmetic on the config: which layer indices are dense or MoE,
and (``SpecSizes``, models/spec_sizes.py) parameter counts, weight bytes and KV bytes per layer.

Supported families (``ModelSpec.family``):
  llama       LlamaForCausalLM                      GQA, RoPE (llama3 scaling), dense SwiGLU
  qwen3       Qwen3ForCausalLM                      + per-head QK-norm
  qwen3_moe   Qwen3MoeForCausalLM                   + MoE, softmax top-k routing
  minimax_m2  MiniMaxM2ForCausalLM                  QK-norm over all heads, partial rotary, sigmoid
                                                    routing with correction bias, all layers MoE;
                                                    attn_type_list: every layer kind 1 (full softmax)
  glm4_moe    Glm4MoeForCausalLM                    partial rotary, qkv bias, QK-norm, shared expert,
                                                    first k layers dense, sigmoid + correction bias
  deepseek_v3 DeepseekV3ForCausalLM (DeepSeek-V3,   MLA (absorbed decode), grouped sigmoid top-k with
              Kimi-K2)                              correction bias, shared expert, first k dense
  deepseek_v32 DeepseekV32ForCausalLM               + DeepSeek sparse attention (DSA): a lightning indexer
                                                    picks index_topk cached tokens per query
  glm_moe_dsa GlmMoeDsaForCausalLM (GLM-5.x)        DeepSeek-V3.2's layer (MLA + DSA) with per-layer indexer
                                                    types: "full" layers run the indexer, "shared" layers
                                                    reuse the previous full layer's selection
  qwen3_5     Qwen3_5ForCausalLM (and the           hybrid: Gated DeltaNet linear attention layers (gated delta
  qwen3_5_moe wrappers), Qwen3_5MoeForCausalLM       rule + short causal conv, per-sequence recurrent state)
                                                    interleaved with gated full attention (sigmoid output gate,
                                                    per-head QK-norm, partial rotary), Gemma (1 + w) norms; MoE:
                                                    softmax top-k + sigmoid-gated shared expert
  minimax_m3  MiniMaxM3ForCausalLM                  GQA with per-head QK-norm, Gemma (1 + w) norms, partial
                                                    rotary, block-sparse attention (an indexer picks 128-token
                                                    blocks per KV head), swigluoai MLPs (alpha, limit), sigmoid
                                                    routing + bias, shared expert, first layers dense
  kimi_linear KimiLinearForCausalLM (in the          hybrid: Kimi delta attention layers (per-channel decay delta
              KimiK3ForConditionalGeneration)       rule + short conv, per-sequence recurrent state) interleaved
                                                    with gated NoPE MLA; latent MoE, SiTU-GLU, attention residuals
                                                    (models/kimi_config.py, models/kimi.py)
  mixtral     MixtralForCausalLM                    Llama attention (optional window), softmax top-k MoE renormalised
  gemma2      Gemma2ForCausalLM                     GeGLU, (1 + w) norms around attention and MLP, sqrt(H) embeddings,
  gemma3      Gemma3ForCausalLM                     sliding/full interleave, soft-capped scores (2) and logits; 3: QK-
                                                    norm, sliding layers' own rope base (config_sections.gemma_fields)
  gemma4      Gemma4ForCausalLM                     Gemma-3 + per-kind head dims / KV heads, K = V (gemma4_config)
  llama4      Llama4ForCausalLM                     NoPE layers (query temperature) between chunked rope layers (L2
                                                    qk-norm); top-1 sigmoid router on the experts' input + shared
  mimo_v2_flash MiMoV2FlashForCausalLM             hybrid sliding-window (sinks) / full GQA layers, each kind with its
                                                    own KV heads and rope base, V heads narrower than Q/K, V scaled
                                                    before the cache; layer 0 dense, sigmoid + bias routed-only MoE
                                                    (config_sections.mimo_fields)
  gpt_oss     GptOssForCausalLM                     biased GQA + sinks, sliding/full; biased MoE, MXFP4 (gpt_oss.py)
  deepseek_v4 DeepseekV4ForCausalLM                 hc_mult hyper-connection residual streams, one shared K = V
                                                    head over a sliding window plus compressed entries (CSA:
                                                    indexer top-k; HCA: all), grouped low-rank o-proj, hash-
                                                    routed first layers, sqrtsoftplus routing, swiglu_limit
                                                    (models/deepseek_v4.py, models/deepseek_v4_decoder.py)
  nemotron_h  NemotronHForCausalLM (Nemotron-3)     a block per layer: Mamba-2, NoPE GQA, relu2 MLP / MoE (nemotron*.py)

Multimodal ``*ForConditionalGeneration`` configs (Llama-4, Kimi-K2.5, Kimi-K3, Qwen3.5, Gemma-4) run
their ``text_config``'s decoder, text decode only (``models/wrappers.py``). Every key of a config is implemented,
listed as leaving the math unchanged, at its neutral value (``models/neutral_keys.py``), or the config is refused
(``config_keys.check_config``). ``NAME+tiny`` (``--tiny`` on the CLI) is NAME's architecture at toy size
(``ModelSpec.scaled_down``).
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from persistent_engine.models.config_keys import SpecError, check_config
from persistent_engine.models.config_sections import (deepseek_v4_fields, dsa_fields, gemma_fields, llama4_fields,
                                                      mimo_fields, minimax_m2_attn_types, minimax_m3_fields,
                                                      mixtral_fields, mla_fields, parse_mlp_layer_types,
                                                      qwen3_5_fields, qwen_windows, v4_tiny,
                                                      hybrid_tiny)
from persistent_engine.models.aliases import (ALIASES, CONFIG_DIR, RELEASES, TINY_SUFFIX, alias_help,  # noqa: F401
                                              config_of_path, known_models, tiny_name)
from persistent_engine.models.gemma4_config import (gemma4_fields, gemma4_tiny, kv_shared,  # noqa: F401
                                                    layer_intermediate, layer_kind_specs)
from persistent_engine.models.gpt_oss_config import gpt_oss_fields
from persistent_engine.models.kimi_config import kimi_fields, quantization_kind
from persistent_engine.models.wrappers import WRAPPERS, unwrap
from persistent_engine.models.nemotron_config import NemotronFields, nemotron_fields, nemotron_tiny
from persistent_engine.models.spec_layers import SpecLayers
from persistent_engine.models.spec_sizes import DTYPE_BYTES, SpecSizes  # noqa: F401 - DTYPE_BYTES re-exported

__all__ = ["ALIASES", "CONFIG_DIR", "DTYPE_BYTES", "RELEASES", "ModelSpec", "SpecError", "alias_help",
           "known_models", "kv_shared", "layer_intermediate", "layer_kind_specs", "tiny_name"]

# HF "architectures" entry -> family
ARCHITECTURES = {
    "LlamaForCausalLM": "llama",
    "Qwen3ForCausalLM": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3_moe",
    "MiniMaxM2ForCausalLM": "minimax_m2",
    "Glm4MoeForCausalLM": "glm4_moe",
    "DeepseekV3ForCausalLM": "deepseek_v3",
    "DeepseekV32ForCausalLM": "deepseek_v32",
    "GlmMoeDsaForCausalLM": "glm_moe_dsa",
    "MiniMaxM3ForCausalLM": "minimax_m3",
    "KimiLinearForCausalLM": "kimi_linear",
    "Qwen3_5ForCausalLM": "qwen3_5",
    "Qwen3_5MoeForCausalLM": "qwen3_5_moe",
    "DeepseekV4ForCausalLM": "deepseek_v4",
    "MixtralForCausalLM": "mixtral",
    "Gemma2ForCausalLM": "gemma2",
    "Gemma3ForCausalLM": "gemma3",
    "Gemma4ForCausalLM": "gemma4",
    "Llama4ForCausalLM": "llama4",
    "MiMoV2FlashForCausalLM": "mimo_v2_flash",
    "GptOssForCausalLM": "gpt_oss",
    "NemotronHForCausalLM": "nemotron_h",
}
GEMMA_FAMILIES = ("gemma2", "gemma3")
MLA_FAMILIES = ("deepseek_v3", "deepseek_v32", "glm_moe_dsa")
DSA_FAMILIES = ("deepseek_v32", "glm_moe_dsa")
QWEN3_5_FAMILIES = ("qwen3_5", "qwen3_5_moe")


@dataclass(frozen=True)
class ModelSpec(SpecSizes, SpecLayers, NemotronFields):
    name: str
    family: str
    hidden_size: int
    num_layers: int
    vocab_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int          # dense FFN width (dense layers)
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: dict | None = None
    rotary_dim: int = 0             # dims of each head that are rotated (partial rotary); 0 -> head_dim
    qk_norm: str = "none"           # "none" | "per_head" | "per_layer" (MiniMax: over all heads)
    qkv_bias: bool = False
    tie_word_embeddings: bool = False
    max_position_embeddings: int = 4096
    # MLA (DeepSeek-V3 / Kimi-K2); attention == "mla" when kv_lora_rank > 0
    q_lora_rank: int = 0            # 0 -> plain q projection
    kv_lora_rank: int = 0
    qk_nope_head_dim: int = 0
    qk_rope_head_dim: int = 0
    v_head_dim: int = 0
    # MoE; num_experts == 0 -> dense model
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    num_shared_experts: int = 0
    shared_intermediate_size: int = 0   # per shared expert; defaults to moe_intermediate_size
    first_k_dense: int = 0
    moe_layer_freq: int = 1
    scoring: str = "softmax"        # "softmax" | "sigmoid"
    routing_bias: bool = False      # sigmoid routing with e_score_correction_bias
    norm_topk_prob: bool = True
    routed_scaling_factor: float = 1.0
    n_group: int = 1
    topk_group: int = 1
    # per layer "dense" | "moe" when the config lists them (GLM-5.x mlp_layer_types); () -> first_k_dense etc.
    mlp_layer_types: tuple[str, ...] = ()
    # MLA checkpoints store the rope rows interleaved (the loader permutes them to the halves the op rotates)
    rope_interleave: bool = True
    # DeepSeek sparse attention (DSA, GLM-5.x / DeepSeek-V3.2); index_topk == 0 -> dense attention
    index_n_heads: int = 0
    index_head_dim: int = 0
    index_topk: int = 0
    indexer_types: tuple[str, ...] = ()     # per layer "full" (runs the indexer) | "shared"; () -> all full
    indexer_rope_interleave: bool = False   # checkpoint layout of the indexer's rope rows
    # checkpoint weights: "none" | "fp8-block128" | "int4-experts" | "mxfp4-experts" (dequantized on load)
    quantization: str = "none"
    # MLP activation: "silu" (SwiGLU) | "swigluoai" (gpt-oss / MiniMax-M3: clamped, alpha-sigmoid gate, up + 1)
    mlp_act: str = "silu"
    swiglu_alpha: float = 1.702
    swiglu_limit: float = 7.0
    gemma_norm: bool = False                # checkpoint norms store w of (1 + w): the loader adds the 1
    # sliding-window attention: per layer window (0: full); sinks: a learned softmax-denominator logit per head
    layer_windows: tuple[int, ...] = ()
    attention_sinks: bool = False
    # MiniMax-M3 block-sparse attention (msa_block_size > 0 on the layers msa_layers marks)
    msa_layers: tuple[bool, ...] = ()
    msa_block_size: int = 0
    msa_topk_blocks: int = 0
    msa_index_dim: int = 0
    msa_init_blocks: int = 0
    msa_local_blocks: int = 0
    # Qwen3.5 Gated DeltaNet: per layer True for linear attention (its state: per sequence, not per token)
    linear_layers: tuple[bool, ...] = ()
    linear_num_k_heads: int = 0
    linear_num_v_heads: int = 0
    linear_k_dim: int = 0
    linear_v_dim: int = 0
    linear_conv_kernel: int = 0
    attn_output_gate: bool = False          # full attention output * sigmoid(gate rows of the q projection)
    shared_expert_gate: bool = False        # shared expert output * sigmoid(linear(h) [T, 1])
    # Kimi-Linear / Kimi-K3 (kimi_linear, models/kimi_config.py): per layer Kimi delta attention (True) or MLA
    kda_layers: tuple[bool, ...] = ()
    kda_num_heads: int = 0
    kda_head_dim: int = 0                   # key and value head dim
    kda_conv_size: int = 0                  # short convolution width on q, k, v
    kda_gate_lower_bound: float | None = None   # the "safe gate" lb * sigmoid(...); None: -exp(A) softplus(...)
    kda_full_rank_gate: bool = False        # KDA output gate from one [H Dv, H] projection (else g_a, g_b)
    mla_nope: bool = False                  # MLA without rotary
    mla_output_gate: bool = False           # MLA output * sigmoid(g_proj(h)) before o_proj
    latent_moe_size: int = 0                # routed experts run in this latent width (0: the hidden size)
    latent_moe_norm: bool = False           # rms_norm of the routed latent before its up projection
    situ_beta: float = 1.0                  # mlp_act "situ": SiTU-GLU parameters
    situ_linear_beta: float | None = None
    attn_res_block_size: int = 0            # attention residuals over blocks of this many layers (0: plain residual)
    # DeepSeek-V4 (deepseek_v4): hc_mult residual streams (1: a plain residual); per layer compress ratio
    # (0 window only, csa_ratio: CSA with the indexer, else HCA); every layer attends its last sliding_window
    # tokens; o_groups x o_lora_rank grouped output projection; the first num_hash_layers MoE layers hash-routed
    hc_mult: int = 1
    hc_sinkhorn_iters: int = 20
    hc_eps: float = 1e-6
    compress_ratios: tuple[int, ...] = ()
    csa_ratio: int = 4
    compress_rope_theta: float = 160000.0
    sliding_window: int = 0
    o_groups: int = 0
    o_lora_rank: int = 0
    num_hash_layers: int = 0
    expert_dtype: str = "bf16"             # checkpoint experts: "bf16" | "fp4" (dequantized on load)
    # Gemma-2 / Gemma-3 (config_sections.gemma_fields): embeddings times sqrt(hidden), (1 + w) norms on the attention
    # and MLP outputs too (sandwich), scores scaled by query_pre_attn_scalar^-0.5, tanh soft-caps (0: none), the
    # sliding layers' own rope base (0: every layer rope_theta and rope_scaling; else those are the full layers')
    embed_scale: bool = False
    sandwich_norms: bool = False
    query_pre_attn_scalar: float = 0.0
    attn_softcap: float = 0.0
    final_softcap: float = 0.0
    rope_local_theta: float = 0.0
    # Llama-4 (config_sections.llama4_fields): per layer rope (False: NoPE); rope layers L2-normed q/k (weightless RMS
    # after the rotary) and chunked attention (chunks of attention_chunk_size, 0: full); NoPE layers' query temperature
    # (attn_temperature_floor 0: none); routed experts take the router weight on their input
    rope_layers: tuple[bool, ...] = ()
    qk_l2_norm: bool = False
    attention_chunk_size: int = 0
    attn_temperature_floor: int = 0
    attn_temperature_scale: float = 0.1
    moe_input_scaled: bool = False
    # MiMo-V2-Flash (config_sections.mimo_fields): GQA V heads of v_head_dim (0: head_dim), the windowed layers' KV
    # heads (0: num_kv_heads), sinks on the windowed layers only (attention_sinks: on every layer), V times
    # value_scale before the cache write
    window_kv_heads: int = 0
    window_sinks: bool = False
    value_scale: float = 1.0
    o_bias: bool = False                    # gpt-oss: o projection bias; router + expert biases (moe_bias)
    moe_bias: bool = False
    # Gemma-4 (gemma4_config.py): full layers' head dim (0: head_dim), K = V, share of rope pairs turning (0: none)
    global_head_dim: int = 0
    k_eq_v: bool = False
    rope_proportion: float = 0.0
    kv_shared_layers: int = 0               # the last n layers attend an earlier layer's K/V (gemma4_config.kv_source)
    per_layer_input: int = 0                # per-layer input embeddings of this width (0: none)
    double_wide_mlp: bool = False           # the K/V-sharing layers' MLPs twice intermediate_size
    dtype: str = "bf16"
    extra: dict = field(default_factory=dict, compare=False, hash=False, repr=False)

    # ---------------------------------------------------------------- construction
    @classmethod
    def from_name(cls, name: str, config: dict[str, Any] | None = None) -> "ModelSpec":
        """An alias of DESIGN.md (``llama-1b``, ``glm``, ``tiny-moe``...) or a path to a config.json;
        either with ``+tiny``: the same architecture at toy size (``scaled_down``). ``config``: the
        path's content as ``config_of_path`` read it elsewhere (an executor need not see the file)."""
        if name.endswith(TINY_SUFFIX) and len(name) > len(TINY_SUFFIX):
            return cls.from_name(name[: -len(TINY_SUFFIX)], config).scaled_down().replace(name=name)
        if name in ALIASES:
            return cls.from_config_file(CONFIG_DIR / ALIASES[name], name=name)
        if config is not None:
            return cls.from_config(config, name=Path(name).stem)
        path = Path(name)
        if path.is_dir():
            path = path / "config.json"
        if path.suffix == ".json" or path.exists():
            if not path.exists():
                raise SpecError(f"model config not found: {name}")
            return cls.from_config_file(path)
        raise SpecError(f"unknown model {name!r}; known aliases: {', '.join(ALIASES)}, "
                        "or a path to an HF config.json")

    @classmethod
    def from_config_file(cls, path: str | os.PathLike, name: str | None = None) -> "ModelSpec":
        try:
            cfg = json.loads(Path(path).read_text())
        except (OSError, json.JSONDecodeError) as e:
            raise SpecError(f"cannot read model config {path}: {e}") from None
        except UnicodeDecodeError:
            raise SpecError(f"model config {path} is not a text file (a binary file?)") from None
        if not isinstance(cfg, dict):
            raise SpecError(f"model config {path} is not a JSON object")
        return cls.from_config(cfg, name=name or Path(path).stem)

    @classmethod
    def from_config(cls, cfg: dict[str, Any], name: str = "model") -> "ModelSpec":
        cfg, text_only = unwrap(cfg, name)          # a multimodal wrapper: its text decoder (models/wrappers.py)
        archs = cfg.get("architectures") or []
        family = next((ARCHITECTURES[a] for a in archs if a in ARCHITECTURES), None)
        if family is None:
            raise SpecError(f"unsupported architecture {archs or cfg.get('model_type')!r} in {name}; "
                            f"supported: {', '.join([*ARCHITECTURES, *WRAPPERS])}")
        check_config(cfg, family, name, SpecError)
        try:
            spec = cls._parse(cfg, name, family)
            return spec.replace(extra={**spec.extra, "text_only": text_only}) if text_only else spec
        except SpecError:
            raise
        except (KeyError, TypeError, ValueError) as e:
            raise SpecError(f"bad config for {name}: missing or invalid field {e}") from None

    @classmethod
    def _parse(cls, c: dict, name: str, family: str) -> "ModelSpec":
        kw = _base_fields(c, name, family)
        kw.update(_moe_fields(c, name, family, kw["num_layers"]))
        kw.update(_family_fields(c, name, family, kw["num_layers"], kw["head_dim"], kw["num_heads"]))
        if kw.get("num_experts"):
            if kw.get("num_shared_experts") and not kw.get("shared_intermediate_size"):
                kw["shared_intermediate_size"] = kw["moe_intermediate_size"]
        return cls(**kw)

    def replace(self, **changes) -> "ModelSpec":
        return dataclasses.replace(self, **changes)

    def with_layers(self, n: int) -> "ModelSpec":
        return self.replace(num_layers=n)

    def scaled_down(self, hidden: int = 64, vocab: int = 256) -> "ModelSpec":
        """The same architecture at tiny dimensions, keeping every code path: GQA ratio (or MHA/MQA),
        partial rotary fraction, QK-norm kind, qkv bias, MLA with/without q LoRA, expert groups,
        shared experts, first dense layers (at most one), routing and rope scaling."""
        heads = 4
        kv = heads if self.num_kv_heads == self.num_heads else (1 if self.num_kv_heads == 1 else 2)
        head_dim = 16
        rot = self.rotary_dim or self.head_dim
        kw: dict[str, Any] = dict(
            name=f"{self.name}-tiny", hidden_size=hidden, vocab_size=vocab, num_heads=heads, num_kv_heads=kv,
            head_dim=head_dim, rotary_dim=max(2, 2 * round(head_dim * rot / self.head_dim / 2)),
            intermediate_size=2 * hidden, max_position_embeddings=min(self.max_position_embeddings, 4096))
        if self.attention == "gqa" and self.v_head_dim and self.v_head_dim != self.head_dim:
            kw["v_head_dim"] = head_dim // 2            # MiMo-V2-Flash: V heads narrower than Q/K's
        if self.window_kv_heads:                        # MiMo-V2-Flash: windowed layers' own KV heads (GQA both)
            kw.update(num_kv_heads=1, window_kv_heads=1 if self.window_kv_heads == self.num_kv_heads else 2)
        if self.attention == "mla":
            kw.update(q_lora_rank=48 if self.q_lora_rank else 0, kv_lora_rank=32, qk_nope_head_dim=16,
                      qk_rope_head_dim=8, v_head_dim=16, head_dim=24, rotary_dim=8, num_kv_heads=heads)
        first_dense = min(self.first_k_dense, 1)
        kw["num_layers"] = first_dense + 2 if self.is_moe else 2
        if self.is_moe:
            groups = min(self.n_group, 4)
            experts = max(16, 4 * groups) if self.num_experts > 16 else self.num_experts
            topk_group = max(1, min(groups - 1, round(self.topk_group * groups / self.n_group))) if groups > 1 else 1
            kw.update(num_experts=experts, n_group=groups, topk_group=topk_group, first_k_dense=first_dense,
                      num_experts_per_tok=min(self.num_experts_per_tok, 4, topk_group * experts // groups),
                      moe_intermediate_size=32, shared_intermediate_size=32 if self.num_shared_experts else 0)
        if self.mlp_layer_types:
            kw["mlp_layer_types"] = tuple("dense" if j < first_dense else "moe" for j in range(kw["num_layers"]))
            rest = self.mlp_layer_types[self.first_k_dense:]
            if "dense" in rest and "moe" in rest:       # interleaved (Llama-4 Maverick): both kinds, in their order
                kw["mlp_layer_types"] = ("dense",) * first_dense + (rest[0], "moe" if rest[0] == "dense" else "dense")
        if any(self.layer_windows):
            # a window of 8 (below the tiny contexts); full and windowed layers both kept when both exist
            n, kinds = kw["num_layers"], [self.layer_window(i) > 0 for i in range(self.num_layers)]
            kw["layer_windows"] = tuple(8 if (all(kinds) or (any(kinds) and j == n - 1)) else 0 for j in range(n))
        kw.update(hybrid_tiny(self, kw, heads, head_dim, hidden))    # MiniMax-M3, Qwen3.5, Kimi (config_sections)
        if self.rope_layers:                    # Llama-4: a rope layer (chunked) then a NoPE one, chunks of 8 tokens
            kw.update(rope_layers=tuple(j < kw["num_layers"] - 1 for j in range(kw["num_layers"])),
                      attention_chunk_size=8 if self.attention_chunk_size else 0,
                      attn_temperature_floor=4 if self.attn_temperature_floor else 0)
        if self.query_pre_attn_scalar:          # the same score scale relative to the head dim
            kw["query_pre_attn_scalar"] = self.query_pre_attn_scalar * head_dim / self.head_dim
        kw.update(nemotron_tiny(self, kw))       # Nemotron-H: one layer per block letter ({} for other families)
        if self.family == "gemma4":
            kw.update(gemma4_tiny(self, kw))
        if self.family == "deepseek_v4":
            kw.update(v4_tiny(self, kw))
        elif self.sparse_attention:
            # a top-k below the tiny contexts (so the selection matters), and a shared layer when the
            # original has any: [dense/full, moe/full, moe/shared]
            n = kw["num_layers"]
            shared = "shared" in self.indexer_types
            kw.update(index_n_heads=4, index_head_dim=16, index_topk=8,
                      indexer_types=tuple("shared" if shared and j == n - 1 else "full" for j in range(n))
                      if shared else ())
        return self.replace(**kw)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d.pop("extra")
        return d


def _base_fields(c: dict, name: str, family: str) -> dict[str, Any]:
    """The fields every family reads: sizes, norms, RoPE, quantization, the rotary width and the QK-norm kind."""
    hidden, heads = int(c["hidden_size"]), int(c["num_attention_heads"])
    head_dim = int(c.get("head_dim") or hidden // heads)
    rope_params = c.get("rope_parameters") or {}
    rope_scaling = c.get("rope_scaling")
    if not rope_scaling and (rope_params.get("rope_type") or "default") != "default":
        rope_scaling = rope_params
    quant = c.get("quantization_config")
    kw: dict[str, Any] = dict(
        name=name, family=family, hidden_size=hidden, num_layers=int(c["num_hidden_layers"]),
        vocab_size=int(c["vocab_size"]), num_heads=heads,
        num_kv_heads=int(c.get("num_key_value_heads") or heads), head_dim=head_dim,
        intermediate_size=int(c.get("intermediate_size", 4 * hidden)),
        rms_norm_eps=float(c.get("rms_norm_eps", 1e-6)),
        rope_theta=float(c.get("rope_theta", rope_params.get("rope_theta", 1e4))),
        rope_scaling=rope_scaling,
        tie_word_embeddings=bool(c.get("tie_word_embeddings", False)),
        max_position_embeddings=int(c.get("max_position_embeddings", 4096)),
        qkv_bias=bool(c.get("attention_bias", False)),
        quantization=quantization_kind(quant),
    )
    partial = float(c.get("partial_rotary_factor", rope_params.get("partial_rotary_factor", 1.0)))
    kw["rotary_dim"] = int(c.get("rotary_dim") or head_dim * partial)
    if family == "qwen3" or family == "qwen3_moe":
        kw["qk_norm"] = "per_head"
    elif family == "minimax_m2":
        kw["qk_norm"] = c.get("qk_norm_type", "per_layer") if c.get("use_qk_norm", True) else "none"
    elif family == "glm4_moe":
        kw["qk_norm"] = "per_head" if c.get("use_qk_norm", False) else "none"
    return kw


def _moe_fields(c: dict, name: str, family: str, num_layers: int) -> dict[str, Any]:
    """The MoE fields of the families whose experts are configured in the common keys (none for dense ones)."""
    kw: dict[str, Any] = {}
    if family == "qwen3_moe":
        kw.update(num_experts=int(c["num_experts"]), num_experts_per_tok=int(c["num_experts_per_tok"]),
                  moe_intermediate_size=int(c["moe_intermediate_size"]),
                  moe_layer_freq=int(c.get("decoder_sparse_step", 1)),
                  norm_topk_prob=bool(c.get("norm_topk_prob", True)), scoring="softmax")
        if c.get("mlp_only_layers"):
            kw["extra"] = {"mlp_only_layers": list(c["mlp_only_layers"])}
    elif family == "mixtral":
        kw.update(mixtral_fields(c, num_layers))
    elif family == "minimax_m2":
        shared = int(c.get("shared_intermediate_size", 0))
        kw.update(num_experts=int(c["num_local_experts"]), num_experts_per_tok=int(c["num_experts_per_tok"]),
                  moe_intermediate_size=int(c["intermediate_size"]), scoring=c.get("scoring_func", "sigmoid"),
                  routing_bias=bool(c.get("use_routing_bias", True)), norm_topk_prob=True,
                  num_shared_experts=1 if shared else 0, shared_intermediate_size=shared)
        minimax_m2_attn_types(c, name, num_layers)
    elif family in ("glm4_moe", "deepseek_v4") or family in MLA_FAMILIES:
        kw.update(num_experts=int(c["n_routed_experts"]), num_experts_per_tok=int(c["num_experts_per_tok"]),
                  moe_intermediate_size=int(c["moe_intermediate_size"]),
                  num_shared_experts=int(c.get("n_shared_experts") or 0),
                  first_k_dense=int(c.get("first_k_dense_replace", 0)),
                  moe_layer_freq=int(c.get("moe_layer_freq", 1)),
                  scoring=c.get("scoring_func", "sigmoid"),
                  routing_bias=c.get("topk_method", "noaux_tc") == "noaux_tc",
                  norm_topk_prob=bool(c.get("norm_topk_prob", True)),
                  routed_scaling_factor=float(c.get("routed_scaling_factor", 1.0)),
                  n_group=int(c.get("n_group") or 1), topk_group=int(c.get("topk_group") or 1))
    return kw


def _family_fields(c: dict, name: str, family: str, num_layers: int, head_dim: int, heads: int) -> dict[str, Any]:
    """The fields each family's own parser adds (MLA, DSA, hybrid layers, windows, per-layer MLP kinds), in order."""
    kw: dict[str, Any] = {}
    if family in MLA_FAMILIES:
        kw.update(mla_fields(c, name, heads))
    if family in DSA_FAMILIES:
        kw.update(dsa_fields(c, name, family, num_layers))
    if family == "minimax_m3":
        kw.update(minimax_m3_fields(c, name, num_layers, head_dim))
    if family in QWEN3_5_FAMILIES:
        kw.update(qwen3_5_fields(c, name, num_layers))
    if family == "kimi_linear":
        kw.update(mla_fields(c, name, heads))
        kw.update(kimi_fields(c, name, num_layers))
    if family == "deepseek_v4":
        kw.update(deepseek_v4_fields(c, name, num_layers))
    if family in GEMMA_FAMILIES:
        kw.update(gemma_fields(c, name, family, num_layers))
    if family == "llama4":
        kw.update(llama4_fields(c, name, num_layers))
    if family == "mimo_v2_flash":
        kw.update(mimo_fields(c, name, num_layers, head_dim))
    if family == "gpt_oss":
        kw.update(gpt_oss_fields(c, name, num_layers))
    kw.update(nemotron_fields(c, name) if family == "nemotron_h" else {})
    if family == "gemma4":
        kw.update(gemma4_fields(c, name, num_layers))
    if family in ("qwen3", "qwen3_moe"):
        kw["layer_windows"] = qwen_windows(c, num_layers, name)
    if c.get("mlp_layer_types"):
        kw["mlp_layer_types"] = parse_mlp_layer_types(c["mlp_layer_types"], num_layers, name)
    return kw
