"""Gemma-4's text decoder (HF ``gemma4_text``: transformers ``models/gemma4/configuration_gemma4.py`` and
``modeling_gemma4.py``, Apache-2.0): config parsing and the per-layer-kind views the cost model averages. Pure data
(no torch); the layers are ``models/gemma4.py``.

What differs from Gemma-3 (``config_sections.gemma_fields``), per layer kind of ``layer_types``:
  sliding layers  ``head_dim`` heads, ``num_key_value_heads`` KV heads, default rope at
                  ``rope_parameters.sliding_attention.rope_theta`` (``rope_local_theta``), ``sliding_window`` tokens
  full layers     ``global_head_dim`` heads (``layer_head_dim``), ``num_global_key_value_heads`` KV heads when
                  ``attention_k_eq_v`` (else ``num_key_value_heads``); K = V: no v_proj, V = v_norm(k_proj(x))
                  (before k_norm and the rotary); "proportional" rope: of the D/2 rotary pairs (d, d + D/2) the first
                  partial_rotary_factor * D/2 turn at rope_theta^(-2d/D), the rest not at all (``rope_proportion``)
  every layer     per-head QK-norm, a weightless RMS norm on V (v_norm), scores not scaled (HF ``scaling = 1.0``:
                  ``query_pre_attn_scalar`` 1), no score soft-cap; RMSNorms scale by w (HF ``Gemma4RMSNorm``), not
                  Gemma-3's 1 + w; the layer's output (residual included) times ``layers.{i}.layer_scalar`` [1]
Kept from Gemma-3: GeGLU (gelu_pytorch_tanh), norms before and after attention and the MLP, embeddings times
sqrt(hidden), tied lm_head, tanh soft-cap of the final logits.

The small sizes (E2B, E4B):
  ``num_kv_shared_layers``  the last n layers compute only q: each attends the K/V cache of the last earlier layer of
                            its kind (``spec.kv_source``), writes none; with ``use_double_wide_mlp`` their MLPs are
                            2 x intermediate_size wide (``layer_intermediate``)
  ``hidden_size_per_layer_input`` P > 0: per-layer inputs pli[T, L, P] = (rms_norm(x_emb W_ple^T / sqrt(H)) +
                            E_ple[ids] sqrt(P)) / sqrt(2) (x_emb: the scaled embeddings); after layer i's MLP
                            h += norm(W_proj (gelu(W_gate h) * pli[:, i])) (``models/gemma4.py``)
The MoE size (26B-A4B, ``enable_moe_block``): every layer runs the dense GeGLU MLP (intermediate_size, kept as the
spec's one shared expert so the cost model and sharding count it) beside ``num_experts`` GeGLU experts of
``moe_intermediate_size``, ``top_k_experts`` per token, routed from the MLP's residual input r (``models/gemma4.py``):
  weights, ids = top-k of softmax(W_router (rms_norm(r) * scale / sqrt(H))), renormalised, times per_expert_scale[ids]
  out = norm_1(mlp(pre_norm(r))) + norm_2(experts(norm_pre_2(r), weights, ids))   then post_feedforward_layernorm
``num_experts``, ``top_k_experts``, ``moe_intermediate_size`` change nothing without the MoE block.
Refused by name (not implemented): ``use_bidirectional_attention: all``; ``vision`` makes only image tokens
bidirectional (text decode stays causal).
"""

from __future__ import annotations

from typing import Any

from persistent_engine.models.config_keys import SpecError

__all__ = ["gemma4_fields", "gemma4_tiny", "kv_shared", "layer_intermediate", "layer_kind_specs"]



def _rope(c: dict, name: str) -> tuple[dict, dict]:
    """(full layers', sliding layers') rope parameters (HF defaults: proportional 0.25 at 1e6; default at 1e4)."""
    rp = c.get("rope_parameters") or {}
    if not isinstance(rp, dict) or (rp and not {"full_attention", "sliding_attention"} >= set(rp)):
        raise SpecError(f"{name}: Gemma-4 rope_parameters must be given per layer type (full_attention, "
                        f"sliding_attention), got {rp!r}")
    full = dict(rp.get("full_attention") or {"rope_type": "proportional", "partial_rotary_factor": 0.25,
                                             "rope_theta": 1e6})
    local = dict(rp.get("sliding_attention") or {"rope_type": "default", "rope_theta": 1e4})
    kind = full.get("rope_type") or "default"
    if kind not in ("default", "proportional") or float(full.get("factor", 1.0)) != 1.0:
        raise SpecError(f"{name}: Gemma-4 full layers' rope {full!r} is not implemented (tkcc implements default and "
                        "proportional rope without a factor)")
    if (local.get("rope_type") or "default") != "default" or float(local.get("partial_rotary_factor", 1.0)) != 1.0:
        raise SpecError(f"{name}: Gemma-4 sliding layers' rope {local!r} is not implemented (tkcc implements the "
                        "default rope over the whole head)")
    return full, local


def gemma4_fields(c: dict, name: str, num_layers: int) -> dict[str, Any]:
    """The ModelSpec fields of an HF Gemma4TextConfig (a key a config leaves out means HF's default)."""
    if c.get("use_bidirectional_attention") not in (None, "vision"):
        raise SpecError(f"{name}: use_bidirectional_attention = {c['use_bidirectional_attention']!r} is not "
                        "implemented (tkcc decodes causally: null or 'vision')")
    window = int(c.get("sliding_window", 512) or 0)
    types = c.get("layer_types") or ["full_attention" if (i + 1) % 6 == 0 else "sliding_attention"
                                     for i in range(num_layers)]
    if len(types) != num_layers or set(types) - {"sliding_attention", "full_attention"}:
        raise SpecError(f"{name}: layer_types must give full_attention or sliding_attention for each of the "
                        f"{num_layers} layers")
    if types[-1] != "full_attention":
        raise SpecError(f"{name}: Gemma-4's last layer must be full_attention (HF forces it), got {types[-1]!r}")
    if "sliding_attention" in types and not window:
        raise SpecError(f"{name}: layer_types has sliding_attention layers but sliding_window is {window}")
    shared, ple = int(c.get("num_kv_shared_layers") or 0), int(c.get("hidden_size_per_layer_input", 256) or 0)
    if shared and set(types[num_layers - shared:]) - set(types[:num_layers - shared]):
        raise SpecError(f"{name}: num_kv_shared_layers {shared} leaves a layer kind of the shared layers without an "
                        "earlier layer of that kind to read K/V from")
    if ple and int(c.get("vocab_size_per_layer_input", 262144)) != int(c["vocab_size"]):
        raise SpecError(f"{name}: vocab_size_per_layer_input {c.get('vocab_size_per_layer_input', 262144)} differs "
                        f"from vocab_size {c['vocab_size']} (tkcc implements per-layer inputs over the vocabulary)")
    full, local = _rope(c, name)
    head_dim, k_eq_v = int(c.get("head_dim", 256)), bool(c.get("attention_k_eq_v", False))
    kv = int(c.get("num_key_value_heads", 4))
    global_kv = int(c.get("num_global_key_value_heads") or kv) if k_eq_v else kv
    proportion = float(full.get("partial_rotary_factor", 1.0)) if full.get("rope_type") == "proportional" else 1.0
    return dict(
        head_dim=head_dim, rotary_dim=head_dim, global_head_dim=int(c.get("global_head_dim", 512)),
        num_kv_heads=global_kv, window_kv_heads=kv, k_eq_v=k_eq_v, qk_norm="per_head", mlp_act="gelu_tanh",
        gemma_norm=False, embed_scale=True, sandwich_norms=True, query_pre_attn_scalar=1.0, attn_softcap=0.0,
        tie_word_embeddings=bool(c.get("tie_word_embeddings", True)),
        layer_windows=tuple(window if t == "sliding_attention" else 0 for t in types),
        final_softcap=float(c.get("final_logit_softcapping") or 0.0),
        max_position_embeddings=int(c.get("max_position_embeddings", 131072)),
        rope_theta=float(full.get("rope_theta", 1e6)), rope_scaling=None, rope_proportion=proportion,
        rope_local_theta=float(local.get("rope_theta", 1e4)), kv_shared_layers=shared, per_layer_input=ple,
        double_wide_mlp=bool(c.get("use_double_wide_mlp", False)) and shared > 0, **_moe(c, name))


def _moe(c: dict, name: str) -> dict[str, Any]:
    """The MoE block's fields (26B-A4B): experts, softmax top-k renormalised, the dense MLP as one shared expert."""
    if not c.get("enable_moe_block"):
        return {}
    e, k = int(c.get("num_experts") or 0), int(c.get("top_k_experts") or 0)
    if not 0 < k <= e or not c.get("moe_intermediate_size"):
        raise SpecError(f"{name}: enable_moe_block needs num_experts, top_k_experts (1..num_experts) and "
                        f"moe_intermediate_size, got {e}, {k}, {c.get('moe_intermediate_size')!r}")
    return dict(num_experts=e, num_experts_per_tok=k, moe_intermediate_size=int(c["moe_intermediate_size"]),
                scoring="softmax", norm_topk_prob=True, routed_scaling_factor=1.0, num_shared_experts=1,
                shared_intermediate_size=int(c["intermediate_size"]))


def gemma4_tiny(spec, kw: dict) -> dict:
    """Gemma-4 at toy size: full layers' heads twice the sliding ones' (32 vs 16) where the original's differ, the
    same rope proportion (0.25 of 32: 4 of 16 pairs turn), scores still unscaled."""
    wide = spec.global_head_dim != spec.head_dim
    out = dict(global_head_dim=2 * kw["head_dim"] if wide else kw["head_dim"], query_pre_attn_scalar=1.0,
               rotary_dim=kw["head_dim"], per_layer_input=8 if spec.per_layer_input else 0)
    if spec.is_moe:                     # the dense MLP (the shared expert) keeps the tiny MLP width
        out["shared_intermediate_size"] = kw["intermediate_size"]
    if spec.kv_shared_layers:           # [sliding, full] then two layers reading their K/V
        out.update(num_layers=4, layer_windows=(8, 0, 8, 0), kv_shared_layers=2)
    return out


def layer_intermediate(spec, i: int) -> int:
    """Layer i's MLP width: intermediate_size, twice that on K/V-sharing layers with use_double_wide_mlp."""
    return spec.intermediate_size * (2 if spec.double_wide_mlp and kv_shared(spec, i) else 1)


def kv_shared(spec, i: int) -> bool:
    """Whether layer i attends an earlier layer's K/V (Gemma-4's last num_kv_shared_layers layers)."""
    return i >= spec.num_layers - spec.kv_shared_layers if spec.kv_shared_layers else False


def layer_kind_specs(spec) -> list[tuple[float, Any]]:
    """(share of the layers, a spec whose every layer is that kind) for each distinct (head dim, KV heads, window,
    K = V, K/V shared, MLP width) among ``spec``'s layers: the cost model's per-kind terms, averaged with these
    weights (a uniform spec of shared layers: every layer attends an earlier cache, kv_shared_layers = L)."""
    n = spec.num_layers
    kinds: dict[tuple, list[int]] = {}
    for i in range(n):
        key = (spec.layer_head_dim(i), spec.layer_kv_heads(i), spec.layer_window(i), spec.layer_k_eq_v(i),
               kv_shared(spec, i), layer_intermediate(spec, i))
        kinds.setdefault(key, []).append(i)
    out = []
    for (dh, hk, window, k_eq_v, shared, inter), idx in kinds.items():
        uniform = spec.replace(head_dim=dh, rotary_dim=dh, num_kv_heads=hk, window_kv_heads=0, global_head_dim=0,
                               k_eq_v=k_eq_v, layer_windows=(window,) * n if window else (), rope_proportion=0.0,
                               kv_shared_layers=n if shared else 0, intermediate_size=inter, double_wide_mlp=False)
        out.append((len(idx) / n, uniform))
    return out
