"""Model weights: their internal layout, seeded random initialisation, and HF checkpoint names.

Internal layout (what the decoder reads; fused where the ops want it):
  embed [V, H], final_norm [H], lm_head [V, H] (absent when tied)
  layers.{i}.input_norm / post_norm [H]
  GQA  qkv_w [(Hq + 2 Hk) Dh, H] (Gemma-4: the layer's Dh and Hk; K = V layers no V rows), qkv_b, q_norm [Dh] (per_head) | [Hq Dh] (per_layer), k_norm, o_w [H, Hq Dh],
       sinks [Hq] fp32 (layers with sinks); MiMo-V2-Flash: qkv_w [(Hq + Hk) Dh + Hk Dv, H], o_w [H, Hq Dv] with
       Hk the layer's (spec.layer_kv_heads)
  MLA  q_a_w [Lq, H], q_a_norm [Lq], q_b_w [Hq (Dn + R), Lq] (or q_w [Hq (Dn + R), H]), kv_a_w [L + R, H],
       kv_a_norm [L], w_uk [Hq, Dn, L], w_uv [Hq, Dv, L], o_w [H, Hq Dv]
  Qwen3.5 linear layers (models/gated_delta.py): lin_in_w [C + Hv Dv + 2 Hv, H] (rows: conv channels q | k | v,
       then z, b, a), conv_w [C, K], A_log [Hv] fp32, dt_bias [Hv] fp32, lin_norm [Dv], o_w [H, Hv Dv];
       gated full attention: qkv_w rows [q | k | v | gate (Hq Dh)]; MoE shared_gate_w [1, H]
  dense gate_up_w [2I, H], down_w [H, I]
  MoE  router_w [E, H], router_bias [E] fp32, w13 [E, 2Im, H], w2 [E, H, Im], shared_gate_up_w, shared_down_w
       (Gemma-4 26B-A4B: the dense MLP as the shared expert; router_scale [H], expert_scale [E], mlp_out_norm_1,
       moe_out_norm, moe_in_norm [H])
  gpt-oss (models/gpt_oss.py) o_b [H], router_b [E], w13_b [E, 2Im] fp32, w2_b [E, H] fp32; MXFP4 checkpoints also
       w13_blocks / w13_scales, w2_blocks / w2_scales (uint8 packs of w13, w2)
  M3   block-sparse layers: qkv_w rows [q | k | v | index_q (Hk Di) | index_k (Di)], idx_q_norm / idx_k_norm [Di]
  DSA  (layers that run the indexer) idx_wq_b [Hi Di, Lq], idx_wk [Di, H], idx_k_norm / idx_k_norm_b [Di],
       idx_weights [Hi, H]
Every tensor is drawn from its own generator seeded by (seed, name), so layer i of a slice equals
layer i of the full model. Scales: projections N(0, 1/fan_in) (unit-variance outputs), embeddings
N(0, 1/H), norms 1 + N(0, 0.05^2): activations stay O(1) through all layers in bf16.

MLA rope rows: HF DeepSeek checkpoints store q_pe / k_pe interleaved; the rotary op is neox style, so
loading permutes those rows (and saving permutes back); so for the DSA indexer's rope rows (the first
R of each head's Di, and of k_norm) when the config says ``indexer_rope_interleave`` (GLM-5.x).
"""

from __future__ import annotations

import zlib

import torch

from persistent_engine.models import gpt_oss
from persistent_engine.models.gemma4_config import layer_intermediate
from persistent_engine.models.safetensors_io import SafetensorsDir, WeightsError, save_file


def param_specs(spec, layers: list[int]) -> dict[str, tuple[tuple[int, ...], str]]:
    """Internal name -> (shape, init kind) for the model restricted to ``layers``."""
    if spec.family == "kimi_linear":
        from persistent_engine.models.kimi import kimi_param_specs

        return kimi_param_specs(spec, layers)
    if spec.family == "nemotron_h":
        from persistent_engine.models.nemotron import nemotron_param_specs

        return nemotron_param_specs(spec, layers)
    h, v = spec.hidden_size, spec.vocab_size
    out: dict[str, tuple[tuple[int, ...], str]] = {"embed": ((v, h), "embed"), "final_norm": ((h,), "norm")}
    if not spec.tie_word_embeddings:
        out["lm_head"] = ((v, h), "linear")
    if spec.per_layer_input:                    # Gemma-4 per-layer inputs: every layer's columns, sliced or not
        lp = spec.num_layers * spec.per_layer_input
        out.update(ple_embed=((v, lp), "embed"), ple_proj=((lp, h), "linear"),
                   ple_norm=((spec.per_layer_input,), "norm"))
    for i in layers:
        p = f"layers.{i}."
        out[p + "input_norm"] = ((h,), "norm")
        out[p + "post_norm"] = ((h,), "norm")
        if spec.sandwich_norms:                 # Gemma: norms on the attention and MLP outputs too
            out[p + "attn_out_norm"], out[p + "mlp_out_norm"] = ((h,), "norm"), ((h,), "norm")
        if spec.is_linear(i):
            out.update(_linear_specs(spec, p))
        elif spec.attention == "mla":
            out.update(_mla_specs(spec, i, p))
        else:
            hq, hk, dh, dv = spec.num_heads, spec.layer_kv_heads(i), spec.layer_head_dim(i), spec.layer_v_head_dim(i)
            v_rows = 0 if spec.layer_k_eq_v(i) else hk * dv                                # Gemma-4: V = K's rows
            if spec.kv_source(i) != i:                          # Gemma-4 K/V-sharing layers: q rows only
                hk = v_rows = 0
            index_rows = (hk + 1) * spec.msa_index_dim if spec.block_sparse(i) else 0     # M3: [.. | index_q | index_k]
            gate_rows = hq * dh if spec.attn_output_gate else 0                           # Qwen3.5: [.. | gate]
            out[p + "qkv_w"] = (((hq + hk) * dh + v_rows + index_rows + gate_rows, h), "linear")
            if index_rows:
                out[p + "idx_q_norm"], out[p + "idx_k_norm"] = ((spec.msa_index_dim,), "norm"), ((spec.msa_index_dim,), "norm")
            if spec.qkv_bias:
                out[p + "qkv_b"] = (((hq + hk) * dh + hk * dv,), "bias")
            if spec.qk_norm == "per_head":
                out[p + "q_norm"], out[p + "k_norm"] = ((dh,), "norm"), ((dh,), "norm")
                if not hk:
                    del out[p + "k_norm"]
            elif spec.qk_norm == "per_layer":
                out[p + "q_norm"], out[p + "k_norm"] = ((hq * dh,), "norm"), ((hk * dh,), "norm")
            out[p + "o_w"] = ((h, hq * dv), "linear")
            if spec.layer_sinks(i):
                out[p + "sinks"] = ((hq,), "router_bias")            # fp32, one logit per head (gpt-oss ``sinks``)
            if spec.family == "gemma4":
                out.update(gemma4_layer_specs(spec, i))
        out.update(_ffn_specs(spec, i, p))
        if spec.family == "gpt_oss":
            out.update(gpt_oss.extra_param_specs(spec, i))
    return out


def _mla_specs(spec, i: int, p: str) -> dict[str, tuple[tuple[int, ...], str]]:
    """Layer ``i``'s MLA attention (prefix ``p``): low-rank or full q, the latent K/V, its DSA indexer."""
    h = spec.hidden_size
    out: dict[str, tuple[tuple[int, ...], str]] = {}
    hq, dn, r, lat, dv = (spec.num_heads, spec.qk_nope_head_dim, spec.qk_rope_head_dim, spec.kv_lora_rank,
                          spec.v_head_dim)
    if spec.q_lora_rank:
        out[p + "q_a_w"] = ((spec.q_lora_rank, h), "linear")
        out[p + "q_a_norm"] = ((spec.q_lora_rank,), "norm")
        out[p + "q_b_w"] = ((hq * (dn + r), spec.q_lora_rank), "linear")
    else:
        out[p + "q_w"] = ((hq * (dn + r), h), "linear")
    out[p + "kv_a_w"] = ((lat + r, h), "linear")
    out[p + "kv_a_norm"] = ((lat,), "norm")
    out[p + "w_uk"] = ((hq, dn, lat), "linear")
    out[p + "w_uv"] = ((hq, dv, lat), "linear")
    out[p + "o_w"] = ((h, hq * dv), "linear")
    out.update(_indexer_specs(spec, i))
    return out


def _ffn_specs(spec, i: int, p: str) -> dict[str, tuple[tuple[int, ...], str]]:
    """Layer ``i``'s MLP (prefix ``p``): a dense gated MLP, or the router, experts and shared experts of a MoE."""
    h = spec.hidden_size
    out: dict[str, tuple[tuple[int, ...], str]] = {}
    if spec.layer_kind(i) == "dense":
        inter = layer_intermediate(spec, i)                 # Gemma-4: double-wide on K/V-sharing layers
        out[p + "gate_up_w"] = ((2 * inter, h), "linear")
        out[p + "down_w"] = ((h, inter), "linear")
    else:
        e, im = spec.num_experts, spec.moe_intermediate_size
        out[p + "router_w"] = ((e, h), "linear")
        if spec.routing_bias:
            out[p + "router_bias"] = ((e,), "router_bias")
        out[p + "w13"] = ((e, 2 * im, h), "linear")
        out[p + "w2"] = ((e, h, im), "linear")
        if spec.num_shared_experts:
            si = spec.shared_intermediate_size * spec.num_shared_experts
            out[p + "shared_gate_up_w"] = ((2 * si, h), "linear")
            out[p + "shared_down_w"] = ((h, si), "linear")
            if spec.shared_expert_gate:
                out[p + "shared_gate_w"] = ((1, h), "linear")
    return out


def gemma4_layer_specs(spec, i: int) -> dict[str, tuple[tuple[int, ...], str]]:
    """Gemma-4's own tensors of layer i: the output scalar, the per-layer input's gate, projection and norm, the MoE
    block's router scales and norms."""
    p, h, pl = f"layers.{i}.", spec.hidden_size, spec.per_layer_input
    out = {p + "layer_scalar": ((1,), "norm")}
    if pl:
        out.update({p + "ple_gate": ((pl, h), "linear"), p + "ple_out": ((h, pl), "linear"),
                    p + "ple_post_norm": ((h,), "norm")})
    if spec.is_moe:                     # the router's scale [H] and per-expert scale [E], the MoE block's norms
        out.update({p + n: ((spec.num_experts if n == "expert_scale" else h,), "norm")
                    for n in ("router_scale", "expert_scale", "mlp_out_norm_1", "moe_out_norm", "moe_in_norm")})
    return out


def _linear_specs(spec, p: str) -> dict[str, tuple[tuple[int, ...], str]]:
    """A Gated DeltaNet layer's tensors (see the module doc)."""
    h, hv, c = spec.hidden_size, spec.linear_num_v_heads, spec.linear_conv_dim
    vd = hv * spec.linear_v_dim
    return {p + "lin_in_w": ((c + vd + 2 * hv, h), "linear"), p + "conv_w": ((c, spec.linear_conv_kernel), "conv"),
            p + "A_log": ((hv,), "a_log"), p + "dt_bias": ((hv,), "dt_bias"), p + "lin_norm": ((spec.linear_v_dim,), "norm"),
            p + "o_w": ((h, vd), "linear")}


def _seed(seed: int, name: str) -> int:
    return (int(seed) * 1_000_003 + zlib.crc32(name.encode())) % (1 << 62)


def init_params(spec, layers: list[int], device="cpu", dtype=torch.bfloat16, seed: int = 0,
                names=None) -> dict[str, torch.Tensor]:
    """Seeded random weights (see the module doc for the scales); ``names``: only these tensors."""
    g = torch.Generator(device=torch.device(device))
    params = {}
    for name, (shape, kind) in param_specs(spec, layers).items():
        if (names is not None and name not in names) or kind == "packed":     # packs: pack_experts below
            continue
        g.manual_seed(_seed(seed, name))
        dt = torch.float32 if kind in ("router_bias", "a_log", "dt_bias") else dtype
        t = torch.randn(shape, generator=g, device=device, dtype=dt)
        if kind == "norm":
            t.mul_(0.05).add_(1.0)
        elif kind == "bias":
            t.mul_(0.1)
        elif kind == "router_bias":
            t.mul_(0.05)
        elif kind == "a_log":               # exp(A_log) ~ 0.14: per-token decays exp(g) ~ 0.8-0.9
            t.mul_(0.3).add_(-2.0)
        elif kind == "dt_bias":
            t.mul_(0.05).add_(1.0)
        elif kind == "conv":                # K taps: unit-variance outputs
            t.mul_(shape[-1] ** -0.5)
        elif kind == "embed":
            t.mul_(spec.hidden_size ** -0.5)
        else:
            t.mul_((shape[-2] if name.endswith("w_uk") else shape[-1]) ** -0.5)      # 1 / sqrt(fan_in)
        params[name] = t
    return gpt_oss.pack_experts(spec, params)


# ----------------------------------------------------------------------------- HF names
def _moe_names(spec, i: int) -> tuple[str, str, str, tuple[str, str, str]]:
    """(router weight, correction bias, experts prefix, (gate, up, down) names) of layer i's MoE."""
    if spec.family in ("minimax_m2", "minimax_m3", "mixtral"):
        b = f"model.layers.{i}.block_sparse_moe."
        return b + "gate.weight", b + "e_score_correction_bias", b + "experts.", ("w1", "w3", "w2")
    b = f"model.layers.{i}.mlp."
    return b + "gate.weight", b + "gate.e_score_correction_bias", b + "experts.", ("gate_proj", "up_proj", "down_proj")


def _sinks_name(spec) -> str:
    """The per-head sink logits' HF name: gpt-oss ``sinks``; MiMo-V2-Flash's Hub checkpoint ``attention_sink_bias``
    (HF transformers renames it to ``sinks`` on load)."""
    return "attention_sink_bias" if spec.family == "mimo_v2_flash" else "sinks"


def _rope_perm(r: int) -> torch.Tensor:
    """Interleaved -> halves: new row j is old row perm[j]."""
    return torch.cat([torch.arange(0, r, 2), torch.arange(1, r, 2)])


# ----------------------------------------------------------------------------- DSA indexer
_INDEXER_HF = {"idx_wq_b": "wq_b.weight", "idx_wk": "wk.weight", "idx_k_norm": "k_norm.weight",
               "idx_k_norm_b": "k_norm.bias", "idx_weights": "weights_proj.weight"}


def _indexer_specs(spec, i: int) -> dict[str, tuple[tuple[int, ...], str]]:
    """The lightning indexer's tensors of layer i (none unless it runs the indexer)."""
    if spec.indexer_kind(i) != "full":
        return {}
    p, h, hi, di = f"layers.{i}.", spec.hidden_size, spec.index_n_heads, spec.index_head_dim
    return {p + "idx_wq_b": ((hi * di, spec.q_lora_rank), "linear"), p + "idx_wk": ((di, h), "linear"),
            p + "idx_k_norm": ((di,), "norm"), p + "idx_k_norm_b": ((di,), "bias"),
            p + "idx_weights": ((hi, h), "linear")}


def _indexer_rope_rows(spec, inverse: bool) -> torch.Tensor:
    """Row permutation of one Di-row indexer head: interleaved rope rows (the first R) -> halves, or back."""
    r, di = spec.qk_rope_head_dim, spec.index_head_dim
    perm = _rope_perm(r) if spec.indexer_rope_interleave else torch.arange(r)
    perm = perm.argsort() if inverse else perm
    return torch.cat([perm, torch.arange(r, di)])


def _permute_indexer(spec, t: dict[str, torch.Tensor], p: str, inverse: bool) -> dict[str, torch.Tensor]:
    rows = _indexer_rope_rows(spec, inverse)
    hi, di = spec.index_n_heads, spec.index_head_dim
    out = dict(t)
    q = t[p + "idx_wq_b"]
    out[p + "idx_wq_b"] = q.reshape(hi, di, -1)[:, rows].reshape(q.shape)
    for name in ("idx_wk", "idx_k_norm", "idx_k_norm_b"):      # LayerNorm commutes with a permutation of
        out[p + name] = t[p + name][rows]                      # its inputs, weight and bias alike
    return out


def _indexer_from_hf(spec, i: int, get) -> dict[str, torch.Tensor]:
    if spec.indexer_kind(i) != "full":
        return {}
    p, base = f"layers.{i}.", f"model.layers.{i}.self_attn.indexer."
    return _permute_indexer(spec, {p + k: get(base + v) for k, v in _INDEXER_HF.items()}, p, inverse=False)


def _indexer_to_hf(spec, i: int, params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    if spec.indexer_kind(i) != "full":
        return {}
    p, base = f"layers.{i}.", f"model.layers.{i}.self_attn.indexer."
    t = _permute_indexer(spec, {p + k: params[p + k] for k in _INDEXER_HF}, p, inverse=True)
    return {base + v: t[p + k] for k, v in _INDEXER_HF.items()}


_NORMS = ("input_norm", "post_norm", "final_norm", "q_norm", "k_norm", "idx_q_norm", "idx_k_norm", "attn_out_norm",
          "mlp_out_norm")


def _block_norm_names(spec) -> tuple[tuple[str, str], ...]:
    """(internal, HF) names of a layer's norms after input_layernorm: post_norm is the norm before the MLP
    (Gemma's pre_feedforward_layernorm; its post_attention_layernorm is on the attention output)."""
    if spec.sandwich_norms:
        return (("post_norm", "pre_feedforward_layernorm"), ("attn_out_norm", "post_attention_layernorm"),
                ("mlp_out_norm", "post_feedforward_layernorm"))
    return (("post_norm", "post_attention_layernorm"),)
_HF_NORMS = ("layernorm.weight", "model.norm.weight", "q_norm.weight", "k_norm.weight")


def _gemma_norms(spec, tensors: dict[str, torch.Tensor], add: float, hf: bool = False) -> dict[str, torch.Tensor]:
    """Gemma-style norms (Gemma-2/3, MiniMax-M3 ``use_gemma_norm``) scale by (1 + w): internally the norm weight is
    1 + w."""
    if not spec.gemma_norm:
        return tensors
    ends = _HF_NORMS if hf else _NORMS
    return {k: (v.float() + add).to(v.dtype) if k.endswith(ends) and "indexer" not in k else v
            for k, v in tensors.items()}


def _llama4_qk_rows(spec, inverse: bool) -> torch.Tensor:
    """Row order of a Llama-4 qkv_w: each q and k head's interleaved rope pairs (HF apply_rotary_emb's complex
    pairs) -> halves (the neox rotary_embedding), or back; v rows unchanged."""
    dh, hq, hk = spec.head_dim, spec.num_heads, spec.num_kv_heads
    perm = _rope_perm(dh).argsort() if inverse else _rope_perm(dh)
    heads = torch.cat([h * dh + perm for h in range(hq + hk)])
    return torch.cat([heads, torch.arange((hq + hk) * dh, (hq + 2 * hk) * dh)])


def _llama4_mlp_from_hf(spec, i: int, get) -> dict[str, torch.Tensor]:
    """Llama-4's feed_forward: dense gate/up/down, or router, experts.gate_up_proj [E, H, 2I] / down_proj [E, I, H]
    (stored transposed) and shared_expert."""
    p, f = f"layers.{i}.", f"model.layers.{i}.feed_forward."
    dense = spec.layer_kind(i) == "dense"
    s = f if dense else f + "shared_expert."
    out = {p + ("gate_up_w" if dense else "shared_gate_up_w"): torch.cat([get(s + "gate_proj.weight"),
                                                                         get(s + "up_proj.weight")]),
           p + ("down_w" if dense else "shared_down_w"): get(s + "down_proj.weight")}
    if not dense:
        out[p + "router_w"] = get(f + "router.weight")
        out[p + "w13"] = get(f + "experts.gate_up_proj").transpose(1, 2).contiguous()
        out[p + "w2"] = get(f + "experts.down_proj").transpose(1, 2).contiguous()
    return out


def _llama4_mlp_to_hf(spec, i: int, params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    p, f = f"layers.{i}.", f"model.layers.{i}.feed_forward."
    dense = spec.layer_kind(i) == "dense"
    s = f if dense else f + "shared_expert."
    out = dict(zip((s + "gate_proj.weight", s + "up_proj.weight"),
                   params[p + ("gate_up_w" if dense else "shared_gate_up_w")].chunk(2)))
    out[s + "down_proj.weight"] = params[p + ("down_w" if dense else "shared_down_w")]
    if not dense:
        out[f + "router.weight"] = params[p + "router_w"]
        out[f + "experts.gate_up_proj"] = params[p + "w13"].transpose(1, 2)
        out[f + "experts.down_proj"] = params[p + "w2"].transpose(1, 2)
    return out


def hf_to_internal(spec, layers: list[int], get) -> dict[str, torch.Tensor]:
    """Internal tensors from an HF checkpoint; ``get(hf_name) -> Tensor``."""
    if spec.family == "gemma4":
        from persistent_engine.models.gemma4 import gemma4_from_hf

        return gemma4_from_hf(spec, layers, get)
    out: dict[str, torch.Tensor] = {"embed": get("model.embed_tokens.weight"), "final_norm": get("model.norm.weight")}
    if not spec.tie_word_embeddings:
        out["lm_head"] = get("lm_head.weight")
    for i in layers:
        p, a = f"layers.{i}.", f"model.layers.{i}.self_attn."
        out[p + "input_norm"] = get(f"model.layers.{i}.input_layernorm.weight")
        for name, hf_name in _block_norm_names(spec):
            out[p + name] = get(f"model.layers.{i}.{hf_name}.weight")
        if spec.attention == "mla":
            hq, dn, r, lat, dv = (spec.num_heads, spec.qk_nope_head_dim, spec.qk_rope_head_dim, spec.kv_lora_rank,
                                  spec.v_head_dim)
            perm = _rope_perm(r) if spec.rope_interleave else torch.arange(r)
            qname = "q_b_w" if spec.q_lora_rank else "q_w"
            q = get(a + ("q_b_proj.weight" if spec.q_lora_rank else "q_proj.weight"))
            qh = q.reshape(hq, dn + r, -1)
            out[p + qname] = torch.cat([qh[:, :dn], qh[:, dn:][:, perm]], dim=1).reshape(q.shape)
            if spec.q_lora_rank:
                out[p + "q_a_w"] = get(a + "q_a_proj.weight")
                out[p + "q_a_norm"] = get(a + "q_a_layernorm.weight")
            kv_a = get(a + "kv_a_proj_with_mqa.weight")
            out[p + "kv_a_w"] = torch.cat([kv_a[:lat], kv_a[lat:][perm]])
            out[p + "kv_a_norm"] = get(a + "kv_a_layernorm.weight")
            kv_b = get(a + "kv_b_proj.weight").reshape(hq, dn + dv, lat)
            out[p + "w_uk"], out[p + "w_uv"] = kv_b[:, :dn].contiguous(), kv_b[:, dn:].contiguous()
            out.update(_indexer_from_hf(spec, i, get))
        else:
            out[p + "qkv_w"] = torch.cat([get(a + f"{x}_proj.weight") for x in "qkv"]
                                         + [get(a + f"index_{x}_proj.weight") for x in "qk" if spec.block_sparse(i)])
            if spec.block_sparse(i):
                out[p + "idx_q_norm"], out[p + "idx_k_norm"] = get(a + "index_q_norm.weight"), get(a + "index_k_norm.weight")
            if spec.layer_sinks(i):
                out[p + "sinks"] = get(a + _sinks_name(spec)).float()
            if spec.qkv_bias:
                out[p + "qkv_b"] = torch.cat([get(a + f"{x}_proj.bias") for x in "qkv"])
            if spec.qk_norm != "none":
                out[p + "q_norm"], out[p + "k_norm"] = get(a + "q_norm.weight"), get(a + "k_norm.weight")
        out[p + "o_w"] = get(a + "o_proj.weight")
        if spec.o_bias:
            out[p + "o_b"] = get(a + "o_proj.bias")
        if spec.family == "llama4":
            out[p + "qkv_w"] = out[p + "qkv_w"][_llama4_qk_rows(spec, inverse=False)]
            out.update(_llama4_mlp_from_hf(spec, i, get))
            continue
        if spec.family == "gpt_oss":
            out.update(gpt_oss.moe_from_hf(spec, i, get))
            continue
        m = f"model.layers.{i}.mlp."
        if spec.layer_kind(i) == "dense":
            out[p + "gate_up_w"] = torch.cat([get(m + "gate_proj.weight"), get(m + "up_proj.weight")])
            out[p + "down_w"] = get(m + "down_proj.weight")
            continue
        router, bias, ex, (gn, un, dn_) = _moe_names(spec, i)
        out[p + "router_w"] = get(router)
        if spec.routing_bias:
            out[p + "router_bias"] = get(bias).float()
        e = spec.num_experts
        out[p + "w13"] = torch.stack([torch.cat([get(f"{ex}{j}.{gn}.weight"), get(f"{ex}{j}.{un}.weight")])
                                      for j in range(e)])
        out[p + "w2"] = torch.stack([get(f"{ex}{j}.{dn_}.weight") for j in range(e)])
        if spec.num_shared_experts:
            s = m + "shared_experts."
            out[p + "shared_gate_up_w"] = torch.cat([get(s + "gate_proj.weight"), get(s + "up_proj.weight")])
            out[p + "shared_down_w"] = get(s + "down_proj.weight")
    return _gemma_norms(spec, out, +1.0)


def internal_to_hf(spec, layers: list[int], params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The inverse of ``hf_to_internal``: HF checkpoint names for a model's (slice's) weights."""
    if spec.family == "gemma4":
        from persistent_engine.models.gemma4 import gemma4_to_hf

        return gemma4_to_hf(spec, layers, params)
    out = {"model.embed_tokens.weight": params["embed"], "model.norm.weight": params["final_norm"]}
    if not spec.tie_word_embeddings:
        out["lm_head.weight"] = params["lm_head"]
    for i in layers:
        p, a = f"layers.{i}.", f"model.layers.{i}.self_attn."
        out[f"model.layers.{i}.input_layernorm.weight"] = params[p + "input_norm"]
        for name, hf_name in _block_norm_names(spec):
            out[f"model.layers.{i}.{hf_name}.weight"] = params[p + name]
        if spec.attention == "mla":
            hq, dn, r, lat = spec.num_heads, spec.qk_nope_head_dim, spec.qk_rope_head_dim, spec.kv_lora_rank
            inv = (_rope_perm(r) if spec.rope_interleave else torch.arange(r)).argsort()
            q = params[p + ("q_b_w" if spec.q_lora_rank else "q_w")]
            qh = q.reshape(hq, dn + r, -1)
            out[a + ("q_b_proj.weight" if spec.q_lora_rank else "q_proj.weight")] = torch.cat(
                [qh[:, :dn], qh[:, dn:][:, inv]], dim=1).reshape(q.shape)
            if spec.q_lora_rank:
                out[a + "q_a_proj.weight"] = params[p + "q_a_w"]
                out[a + "q_a_layernorm.weight"] = params[p + "q_a_norm"]
            kv_a = params[p + "kv_a_w"]
            out[a + "kv_a_proj_with_mqa.weight"] = torch.cat([kv_a[:lat], kv_a[lat:][inv]])
            out[a + "kv_a_layernorm.weight"] = params[p + "kv_a_norm"]
            out[a + "kv_b_proj.weight"] = torch.cat([params[p + "w_uk"], params[p + "w_uv"]], dim=1).reshape(-1, lat)
            out.update(_indexer_to_hf(spec, i, params))
        else:
            hq, hk, dh = spec.num_heads, spec.layer_kv_heads(i), spec.head_dim
            sizes = [hq * dh, hk * dh, hk * spec.gqa_v_head_dim]
            names = [f"{x}_proj.weight" for x in "qkv"]
            if spec.block_sparse(i):
                sizes += [hk * spec.msa_index_dim, spec.msa_index_dim]
                names += ["index_q_proj.weight", "index_k_proj.weight"]
                out[a + "index_q_norm.weight"], out[a + "index_k_norm.weight"] = params[p + "idx_q_norm"], params[p + "idx_k_norm"]
            for x, t in zip(names, params[p + "qkv_w"].split(sizes)):
                out[a + x] = t
            if spec.layer_sinks(i):
                out[a + _sinks_name(spec)] = params[p + "sinks"]
            if spec.qkv_bias:
                for x, t in zip("qkv", params[p + "qkv_b"].split(sizes)):
                    out[a + f"{x}_proj.bias"] = t
            if spec.qk_norm != "none":
                out[a + "q_norm.weight"], out[a + "k_norm.weight"] = params[p + "q_norm"], params[p + "k_norm"]
        out[a + "o_proj.weight"] = params[p + "o_w"]
        if spec.o_bias:
            out[a + "o_proj.bias"] = params[p + "o_b"]
        if spec.family == "gpt_oss":
            out.update(gpt_oss.moe_to_hf(spec, i, params))
            continue
        if spec.family == "llama4":
            rows = _llama4_qk_rows(spec, inverse=True)
            for x, t in zip("qkv", params[p + "qkv_w"][rows].split(sizes)):
                out[a + f"{x}_proj.weight"] = t
            out.update(_llama4_mlp_to_hf(spec, i, params))
            continue
        m = f"model.layers.{i}.mlp."
        if spec.layer_kind(i) == "dense":
            out[m + "gate_proj.weight"], out[m + "up_proj.weight"] = params[p + "gate_up_w"].chunk(2)
            out[m + "down_proj.weight"] = params[p + "down_w"]
            continue
        router, bias, ex, (gn, un, dn_) = _moe_names(spec, i)
        out[router] = params[p + "router_w"]
        if spec.routing_bias:
            out[bias] = params[p + "router_bias"]
        for j in range(spec.num_experts):
            out[f"{ex}{j}.{gn}.weight"], out[f"{ex}{j}.{un}.weight"] = params[p + "w13"][j].chunk(2)
            out[f"{ex}{j}.{dn_}.weight"] = params[p + "w2"][j]
        if spec.num_shared_experts:
            s = m + "shared_experts."
            out[s + "gate_proj.weight"], out[s + "up_proj.weight"] = params[p + "shared_gate_up_w"].chunk(2)
            out[s + "down_proj.weight"] = params[p + "shared_down_w"]
    return _gemma_norms(spec, out, -1.0, hf=True)


def _checkpoint_name(spec, name: str) -> str:
    """A multimodal wrapper's text decoder keeps its tensors under ``language_model.`` (Gemma-4:
    ``model.language_model.`` in place of ``model.``)."""
    if not spec.extra.get("text_only"):
        return name
    if spec.family == "gemma4":
        return "model.language_model." + name.removeprefix("model.")
    return "language_model." + name


def save_weights(model, path) -> None:
    """Write a model's (slice's) weights as one HF-named safetensors file, atomically (a multimodal wrapper's text
    decoder under ``language_model.``, as its published checkpoints name it)."""
    spec = model.spec
    tensors = {_checkpoint_name(spec, k): v.contiguous()
               for k, v in internal_to_hf(spec, model.layers, model.params).items()}
    save_file(tensors, path, metadata={"format": "pt", "tkcc_model": model.spec.name})


def _dequant_fp8(st: SafetensorsDir, name: str, block: int = 128) -> torch.Tensor:
    w = st.get(name)
    scale_name = name + "_scale_inv"
    if w.dtype in (torch.float8_e4m3fn, torch.float8_e5m2) and scale_name in st:
        s = st.get(scale_name).float()
        s = s.repeat_interleave(block, 0)[: w.shape[0]].repeat_interleave(block, 1)[:, : w.shape[1]]
        return w.float() * s
    return w


def unpack_int4(packed: torch.Tensor, scale: torch.Tensor, group: int = 32) -> torch.Tensor:
    """compressed-tensors pack-quantized int4 -> fp32 [out, in]: packed[out, in / 8] int32 holds 8 values of 4 bits
    each (value + 8, the lowest bits first), scale[out, in / group] one per group of ``group`` inputs."""
    shifts = torch.arange(8, dtype=torch.int32, device=packed.device) * 4
    q = ((packed.unsqueeze(-1) >> shifts) & 0xF).flatten(1).float() - 8.0            # [out, in] in [-8, 7]
    return q * scale.float().repeat_interleave(group, 1)[:, : q.shape[1]]


def _dequant(st: SafetensorsDir, name: str) -> torch.Tensor:
    """A checkpoint tensor in fp32 where it is stored quantized: block-fp8 (``*_scale_inv``) or int4 experts
    (``*.weight_packed`` + ``*.weight_scale``, Kimi-K2.5)."""
    packed = name[: -len("weight")] + "weight_packed" if name.endswith(".weight") else ""
    if packed and name not in st and packed in st:
        return unpack_int4(st.get(packed), st.get(packed[: -len("packed")] + "scale"))
    return _dequant_fp8(st, name)


def load_weights(spec, layers: list[int], path, device="cpu", dtype=torch.bfloat16) -> dict[str, torch.Tensor]:
    """Internal tensors for ``layers`` from a safetensors file or directory with HF names (block-fp8 and int4
    expert checkpoints are dequantised; a multimodal wrapper's text decoder under ``language_model.``). Missing
    tensors raise ``WeightsError``."""
    if spec.linear_layers or spec.family in ("kimi_linear", "nemotron_h"):
        family = {"kimi_linear": "Kimi-Linear / Kimi-K3", "nemotron_h": "Nemotron-H"}.get(spec.family, "Qwen3.5")
        raise WeightsError(f"{spec.name}: loading {family} "
                           "checkpoints is not implemented yet; run with seeded random weights (no --weights)")
    st = SafetensorsDir(path)
    params = hf_to_internal(spec, layers, lambda n: _dequant(st, _checkpoint_name(spec, n)))   # models/wrappers.py
    expected = param_specs(spec, layers)
    for name, (shape, kind) in expected.items():
        t = params[name]
        if tuple(t.shape) != tuple(shape):
            raise WeightsError(f"weights at {path}: {name} has shape {list(t.shape)}, expected {list(shape)}")
        params[name] = t.to(device=device, dtype={"router_bias": torch.float32, "packed": t.dtype}.get(kind, dtype))
    return params


def checkpoint_of(model: str):
    """The checkpoint directory ``model`` names when it is a path to an HF checkpoint (a directory, or its
    config.json, beside ``*.safetensors``): what ``--model DIR`` loads unless told otherwise. None for an
    alias or a bare config."""
    from pathlib import Path

    path = Path(str(model))
    directory = path if path.is_dir() else path.parent if path.name == "config.json" and path.is_file() else None
    if directory is None or not (directory / "config.json").is_file():
        return None
    return directory if any(directory.glob("*.safetensors")) else None


__all__ = ["param_specs", "init_params", "hf_to_internal", "internal_to_hf", "save_weights", "load_weights",
           "unpack_int4", "WeightsError", "checkpoint_of"]
