"""Gemma-4's attention and checkpoint names (HF transformers ``modeling_gemma4.py``, ``Gemma4TextAttention`` and
``Gemma4TextDecoderLayer``, Apache-2.0); the config side is ``models/gemma4_config.py``.

``Gemma4Attention`` of layer i (Dh = ``spec.layer_head_dim(i)``, Hk = ``spec.layer_kv_heads(i)``):
  qkv[T, (Hq + 2 Hk) Dh] (K = V layers: [T, (Hq + Hk) Dh], V = the K rows before k_norm)
  q, k = per-head RMS norm (weights w), v = weightless RMS norm                     [T, H, Dh]
  q, k rotated: sliding layers the default rope at rope_local_theta over Dh, full layers the proportional table
  (R = Dh, the pairs past rope_proportion at frequency 0); scores unscaled (scale 1), sliding layers windowed
Per decode token: reads (Hq + 2 Hk) Dh H + Hq Dh H weights (K = V: Hk Dh H fewer) and 2 Hk Dh elements per cached
token. The decoder multiplies the layer's output by ``layer_scalar`` (models/decoder.py).
"""

from __future__ import annotations

import torch

from persistent_engine.models.attention import GQAAttention
from persistent_engine.ops.registry import call

__all__ = ["Gemma4Attention", "gemma4_from_hf", "gemma4_to_hf"]


class Gemma4Attention(GQAAttention):
    def __init__(self, spec, params: dict[str, torch.Tensor], prefix: str, cos_sin: torch.Tensor, scale: float):
        super().__init__(spec, params, prefix, cos_sin, scale)
        layer = int(prefix.split(".")[1])
        self.dh = self.dv = spec.layer_head_dim(layer)
        self.rotary_dim = cos_sin.shape[1]                  # the layer kind's table: Dh wide
        self.k_eq_v = spec.layer_k_eq_v(layer)
        self.v_ones = torch.ones(self.dh, dtype=self.qkv_w.dtype, device=self.qkv_w.device)   # v_norm: no weight
        self.fused_rotary = None                            # QK-norm sits between the projection and the rotary

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


def _names(i: int) -> tuple[str, str, list[tuple[str, str]]]:
    """(internal prefix, HF prefix, [(internal, HF) of the layer's norms and MLP]) of layer i."""
    m = f"model.layers.{i}."
    pairs = [("input_norm", "input_layernorm.weight"), ("attn_out_norm", "post_attention_layernorm.weight"),
             ("post_norm", "pre_feedforward_layernorm.weight"), ("mlp_out_norm", "post_feedforward_layernorm.weight"),
             ("layer_scalar", "layer_scalar"), ("down_w", "mlp.down_proj.weight")]
    return f"layers.{i}.", m, pairs


def _qkv_sizes(spec, i: int) -> list[int]:
    hq, hk, dh = spec.num_heads, spec.layer_kv_heads(i), spec.layer_head_dim(i)
    return [hq * dh, hk * dh] + ([] if spec.layer_k_eq_v(i) else [hk * dh])


def gemma4_to_hf(spec, layers: list[int], params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """HF Gemma4ForCausalLM names of a model's (slice's) weights (a wrapper's checkpoint holds the same tensors
    under ``model.language_model.``)."""
    out = {"model.embed_tokens.weight": params["embed"], "model.norm.weight": params["final_norm"]}
    if not spec.tie_word_embeddings:
        out["lm_head.weight"] = params["lm_head"]
    for i in layers:
        p, m, pairs = _names(i)
        out.update({m + hf: params[p + name] for name, hf in pairs})
        a = m + "self_attn."
        for x, t in zip("qkv", params[p + "qkv_w"].split(_qkv_sizes(spec, i))):
            out[a + f"{x}_proj.weight"] = t
        out[a + "o_proj.weight"] = params[p + "o_w"]
        out[a + "q_norm.weight"], out[a + "k_norm.weight"] = params[p + "q_norm"], params[p + "k_norm"]
        out[m + "mlp.gate_proj.weight"], out[m + "mlp.up_proj.weight"] = params[p + "gate_up_w"].chunk(2)
    return out


def gemma4_from_hf(spec, layers: list[int], get) -> dict[str, torch.Tensor]:
    """The inverse of ``gemma4_to_hf``; ``get(hf_name) -> Tensor``."""
    out = {"embed": get("model.embed_tokens.weight"), "final_norm": get("model.norm.weight")}
    if not spec.tie_word_embeddings:
        out["lm_head"] = get("lm_head.weight")
    for i in layers:
        p, m, pairs = _names(i)
        out.update({p + name: get(m + hf) for name, hf in pairs})
        a = m + "self_attn."
        out[p + "qkv_w"] = torch.cat([get(a + f"{x}_proj.weight") for x in "qkv"[:len(_qkv_sizes(spec, i))]])
        out[p + "o_w"] = get(a + "o_proj.weight")
        out[p + "q_norm"], out[p + "k_norm"] = get(a + "q_norm.weight"), get(a + "k_norm.weight")
        out[p + "gate_up_w"] = torch.cat([get(m + "mlp.gate_proj.weight"), get(m + "mlp.up_proj.weight")])
    return out
