"""Gemma-4's attention and checkpoint names (HF transformers ``modeling_gemma4.py``, ``Gemma4TextAttention`` and
``Gemma4TextDecoderLayer``, Apache-2.0); the config side is ``models/gemma4_config.py``.

``Gemma4Attention`` of layer i (Dh = ``spec.layer_head_dim(i)``, Hk = ``spec.layer_kv_heads(i)``):
  qkv[T, (Hq + 2 Hk) Dh] (K = V layers: [T, (Hq + Hk) Dh], V = the K rows before k_norm)
  q, k = per-head RMS norm (weights w), v = weightless RMS norm                     [T, H, Dh]
  q, k rotated: sliding layers the default rope at rope_local_theta over Dh, full layers the proportional table
  (R = Dh, the pairs past rope_proportion at frequency 0); scores unscaled (scale 1), sliding layers windowed
Per decode token: reads (Hq + 2 Hk) Dh H + Hq Dh H weights (K = V: Hk Dh H fewer) and 2 Hk Dh elements per cached
token. The decoder multiplies the layer's output by ``layer_scalar`` (models/decoder.py).

``Gemma4MoE`` (26B-A4B, HF ``Gemma4TextRouter`` / ``Gemma4TextExperts``): the dense GeGLU MLP beside k of E GeGLU
experts routed from the block's residual input r[T, H]; per token 6 H I + k 6 H Im FLOPs, E H router FLOPs.
"""

from __future__ import annotations

import torch

from persistent_engine.models.attention import GQAAttention
from persistent_engine.ops.registry import call

__all__ = ["Gemma4Attention", "Gemma4MoE", "gemma4_from_hf", "gemma4_to_hf", "per_layer_inputs",
           "add_per_layer_input"]


class Gemma4Attention(GQAAttention):
    def __init__(self, spec, params: dict[str, torch.Tensor], prefix: str, cos_sin: torch.Tensor, scale: float):
        super().__init__(spec, params, prefix, cos_sin, scale)
        layer = int(prefix.split(".")[1])
        self.dh = self.dv = spec.layer_head_dim(layer)
        self.rotary_dim = cos_sin.shape[1]                  # the layer kind's table: Dh wide
        self.k_eq_v = spec.layer_k_eq_v(layer)
        self.shared = spec.kv_source(layer) != layer        # attends the source layer's cache, writes none
        self.v_ones = torch.ones(self.dh, dtype=self.qkv_w.dtype, device=self.qkv_w.device)   # v_norm: no weight
        self.fused_rotary = None                            # QK-norm sits between the projection and the rotary

    def __call__(self, a, wl, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
        """K/V-sharing layers: q[T, Hq, Dh] from qkv[T, Hq Dh] (q rows only), attending the source layer's
        ``k_cache`` / ``v_cache`` (which the decoder passes) without writing; else GQAAttention's."""
        if not self.shared:
            return super().__call__(a, wl, k_cache, v_cache)
        t = a.shape[0]
        q = call("rms_norm", a.view(t, self.hq, self.dh), self.q_norm, self.eps)
        q = call("rotary_embedding", wl.positions, q, q, self.cos_sin, self.rotary_dim)[0]
        o = self.attend(q, wl, k_cache, v_cache)                                 # [T, Hq, Dh]
        return call("linear", o.reshape(t, self.hq * self.dv), self.o_w, None)

    def _qk_norm_rotary(self, qkv: torch.Tensor, wl):
        """qkv[T, (Hq + 2 Hk) Dh] (K = V: [T, (Hq + Hk) Dh]) -> rotated q[T, Hq, Dh], k[T, Hk, Dh], normed v."""
        t, hq, hk, dh = qkv.shape[0], self.hq, self.hk, self.dh
        if self.k_eq_v:
            q, k = qkv.split([hq * dh, hk * dh], dim=-1)
            v = k
        else:
            q, k, v = qkv.split([hq * dh, hk * dh, hk * dh], dim=-1)
        q, k, v = q.view(t, hq, dh), k.view(t, hk, dh), v.view(t, hk, dh)                 # strided views, no copy
        v = call("rms_norm", v, self.v_ones, self.eps)
        q, k = call("rms_norm", q, self.q_norm, self.eps), call("rms_norm", k, self.k_norm, self.eps)
        q, k = call("rotary_embedding", wl.positions, q, k, self.cos_sin, self.rotary_dim)
        return q, k, v


class Gemma4MoE:
    """norm_1(mlp(x)) + norm_2(experts(norm_in(r))) for the normed-projected gate_up[T, 2I] and the residual r[T, H];
    the router: softmax top-k of W_router (rms_norm(r) * scale / sqrt(H)), renormalised, times per_expert_scale."""

    def __init__(self, spec, params: dict[str, torch.Tensor], prefix: str):
        p = prefix
        self.gate_up_w, self.down_w = params[p + "shared_gate_up_w"], params[p + "shared_down_w"]
        self.fused_input = (self.gate_up_w, None)            # pre_feedforward_layernorm fused with gate_up
        self.router_w, self.expert_scale, self.w13, self.w2 = (params[p + n] for n in
                                                               ("router_w", "expert_scale", "w13", "w2"))
        # HF: (norm(r) * scale) * H^-0.5 in the weight dtype, folded into one weight of the weightless norm
        self.router_norm = params[p + "router_scale"] * spec.hidden_size ** -0.5
        self.out_norm_1, self.out_norm_2, self.in_norm = (params[p + n] for n in
                                                          ("mlp_out_norm_1", "moe_out_norm", "moe_in_norm"))
        self.top_k, self.eps = spec.num_experts_per_tok, spec.rms_norm_eps

    def route(self, r: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """r[T, H] -> (weights[T, k] fp32, ids[T, k])."""
        logits = call("linear", call("rms_norm", r, self.router_norm, self.eps), self.router_w, None).float()
        weights, ids = call("moe_route", logits, None, self.top_k, "softmax", 1, 1, True, 1.0)
        return weights * self.expert_scale.float()[ids], ids

    def __call__(self, gate_up: torch.Tensor, r: torch.Tensor) -> torch.Tensor:
        dense = call("linear", call("gelu_tanh_and_mul", gate_up), self.down_w, None)          # [T, H]
        weights, ids = self.route(r)
        routed = call("moe_experts_gelu", call("rms_norm", r, self.in_norm, self.eps), self.w13, self.w2, weights, ids)
        return call("rms_norm", dense, self.out_norm_1, self.eps) + call("rms_norm", routed, self.out_norm_2, self.eps)


_PLE = [("ple_embed", "model.embed_tokens_per_layer.weight"), ("ple_proj", "model.per_layer_model_projection.weight"),
        ("ple_norm", "model.per_layer_projection_norm.weight")]


def per_layer_inputs(params: dict[str, torch.Tensor], spec, token_ids: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """HF ``get_per_layer_inputs`` + ``project_per_layer_inputs``: pli[T, L, P] from the token ids and the scaled
    embeddings x[T, H]. Cost: T x H x L P multiply-adds, a gather of T rows of L P."""
    t, n, pl = x.shape[0], spec.num_layers, spec.per_layer_input
    scale = torch.full((), pl ** 0.5, dtype=x.dtype, device=x.device)     # HF: in the weight dtype (a fill: capturable)
    ids = call("embedding", token_ids, params["ple_embed"]) * scale                   # [T, L P]
    proj = call("linear", x, params["ple_proj"], None) * spec.hidden_size ** -0.5
    proj = call("rms_norm", proj.view(t, n, pl), params["ple_norm"], spec.rms_norm_eps)
    return (proj + ids.view(t, n, pl)) * 2 ** -0.5


def add_per_layer_input(params: dict[str, torch.Tensor], prefix: str, h: torch.Tensor, pli: torch.Tensor,
                        eps: float) -> torch.Tensor:
    """HF ``Gemma4TextDecoderLayer``'s last block: h[T, H] + norm(W_out (gelu(W_gate h) * pli[T, P]))."""
    gate = call("linear", h, params[prefix + "ple_gate"], None)                        # [T, P]
    g = call("gelu_tanh_and_mul", torch.cat([gate, pli.to(gate.dtype)], dim=-1))       # gelu(gate) * pli
    out = call("linear", g, params[prefix + "ple_out"], None)
    return h + call("rms_norm", out, params[prefix + "ple_post_norm"], eps)


def _names(spec, i: int) -> tuple[str, str, list[tuple[str, str]]]:
    """(internal prefix, HF prefix, [(internal, HF) of the layer's tensors but the attention's projections])."""
    m = f"model.layers.{i}."
    mlp = "shared_" if spec.is_moe else ""
    pairs = [("input_norm", "input_layernorm.weight"), ("attn_out_norm", "post_attention_layernorm.weight"),
             ("post_norm", "pre_feedforward_layernorm.weight"), ("mlp_out_norm", "post_feedforward_layernorm.weight"),
             ("layer_scalar", "layer_scalar"), (mlp + "down_w", "mlp.down_proj.weight"),
             ("o_w", "self_attn.o_proj.weight"), ("q_norm", "self_attn.q_norm.weight")]
    if spec.kv_source(i) == i:
        pairs.append(("k_norm", "self_attn.k_norm.weight"))
    if spec.per_layer_input:
        pairs += [("ple_gate", "per_layer_input_gate.weight"), ("ple_out", "per_layer_projection.weight"),
                  ("ple_post_norm", "post_per_layer_input_norm.weight")]
    if spec.is_moe:     # the dense MLP (shared_*_w) then the MoE block (expert tensors [E, 2Im, H], [E, H, Im])
        pairs += [("router_w", "router.proj.weight"), ("router_scale", "router.scale"),
                  ("expert_scale", "router.per_expert_scale"), ("w13", "experts.gate_up_proj"),
                  ("w2", "experts.down_proj"), ("mlp_out_norm_1", "post_feedforward_layernorm_1.weight"),
                  ("moe_out_norm", "post_feedforward_layernorm_2.weight"),
                  ("moe_in_norm", "pre_feedforward_layernorm_2.weight")]
    return f"layers.{i}.", m, pairs


def _qkv_sizes(spec, i: int) -> list[int]:
    """Rows of q, k, v in qkv_w (K = V layers: no v; K/V-sharing layers: q only)."""
    hq, hk, dh = spec.num_heads, spec.layer_kv_heads(i), spec.layer_head_dim(i)
    if spec.kv_source(i) != i:
        return [hq * dh]
    return [hq * dh, hk * dh] + ([] if spec.layer_k_eq_v(i) else [hk * dh])


def gemma4_to_hf(spec, layers: list[int], params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """HF Gemma4ForCausalLM names of a model's (slice's) weights (a wrapper's checkpoint holds the same tensors
    under ``model.language_model.``)."""
    out = {"model.embed_tokens.weight": params["embed"], "model.norm.weight": params["final_norm"]}
    if not spec.tie_word_embeddings:
        out["lm_head.weight"] = params["lm_head"]
    out.update({hf: params[name] for name, hf in _PLE if spec.per_layer_input})
    for i in layers:
        p, m, pairs = _names(spec, i)
        out.update({m + hf: params[p + name] for name, hf in pairs})
        for x, t in zip("qkv", params[p + "qkv_w"].split(_qkv_sizes(spec, i))):
            out[m + f"self_attn.{x}_proj.weight"] = t
        gate_up = params[p + ("shared_gate_up_w" if spec.is_moe else "gate_up_w")]
        out[m + "mlp.gate_proj.weight"], out[m + "mlp.up_proj.weight"] = gate_up.chunk(2)
    return out


def gemma4_from_hf(spec, layers: list[int], get) -> dict[str, torch.Tensor]:
    """The inverse of ``gemma4_to_hf``; ``get(hf_name) -> Tensor``."""
    out = {"embed": get("model.embed_tokens.weight"), "final_norm": get("model.norm.weight")}
    if not spec.tie_word_embeddings:
        out["lm_head"] = get("lm_head.weight")
    out.update({name: get(hf) for name, hf in _PLE if spec.per_layer_input})
    for i in layers:
        p, m, pairs = _names(spec, i)
        out.update({p + name: get(m + hf) for name, hf in pairs})
        out[p + "qkv_w"] = torch.cat([get(m + f"self_attn.{x}_proj.weight") for x in "qkv"[:len(_qkv_sizes(spec, i))]])
        out[p + ("shared_gate_up_w" if spec.is_moe else "gate_up_w")] = torch.cat([get(m + "mlp.gate_proj.weight"),
                                                                                  get(m + "mlp.up_proj.weight")])
    return out
