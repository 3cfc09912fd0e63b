"""DeepSeek-V4's own ops (besides the hyper-connections of ``hc.py``): the clamped SwiGLU, hash routing,
the grouped low-rank output projection and the KV compressor of its compressed attention.

Source: Hugging Face transformers ``models/deepseek_v4/modeling_deepseek_v4.py`` (Apache-2.0) and the
DeepSeek-V4 report's sections it cites:
- ``swiglu_clamp_and_mul`` = ``DeepseekV4Experts._apply_gate`` / ``DeepseekV4MLP``: silu(min(gate, limit)) *
  clamp(up, -limit, limit) (``swiglu_limit`` 10), on tkcc's [gate | up] layout.
- ``moe_experts_clamp``: the routed experts with that activation (``DeepseekV4Experts.forward``).
- ``moe_route_hash`` = ``DeepseekV4HashRouter``: the first ``num_hash_layers`` MoE layers take their experts
  from a frozen table ``tid2eid[token_id]``; the learned gate only weighs them (scores by ``scoring``,
  renormalised, times ``routed_scaling_factor``).
- ``grouped_linear`` = ``DeepseekV4GroupedLinear`` (``o_a_proj``): the Hq*Dh attention output split in G =
  ``o_groups`` groups, each projected by its own [R, Hq*Dh/G] block to R = ``o_lora_rank``; ``o_b_proj`` (a
  plain ``linear``) then mixes the G*R vector to the hidden size.
- ``kv_compress`` = the pooling of ``DeepseekV4HCACompressor`` (HCA, no overlap, ratio 128) and
  ``DeepseekV4CSACompressor`` / ``DeepseekV4Indexer`` (CSA, ratio 4, overlapping): each closed window w of r
  source tokens becomes one entry
      HCA:  e_w = sum_{j in w} softmax_j(gate_j + bias_j) * kv_j                   (per channel)
      CSA:  e_w = sum over the 2r slots [Ca of window w-1 | Cb of window w] likewise, kv/gate rows of width
            2D holding Ca = [:D] and Cb = [D:]; window 0's Ca slots are empty (weight 0)
  then RMS-normed with ``kv_norm`` (the rotary at position w*r is applied by the caller).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from persistent_engine.ops.basic import _acc
from persistent_engine.ops.moe import (_experts_fit, _experts_inputs, _experts_shapes, _route_canonical, _weights,
                                       expert_scores, experts_check_bytes, experts_forward)
from persistent_engine.ops.opdef import (DEFAULT_TOLERANCES, MATMUL_TOLERANCES, OpDef, generator, new_tokens,
                                         randint, randn, tokens)


def swiglu_clamp_and_mul(x: torch.Tensor, limit: float) -> torch.Tensor:
    gate, up = _acc(x).chunk(2, dim=-1)
    return (F.silu(gate.clamp(max=limit)) * up.clamp(min=-limit, max=limit)).to(x.dtype)


def moe_experts_clamp(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                      topk_ids: torch.Tensor, limit: float) -> torch.Tensor:
    return experts_forward(x, w13, w2, topk_weights, topk_ids, lambda h: swiglu_clamp_and_mul(h, limit))


def moe_route_hash(router_logits: torch.Tensor, tid2eid: torch.Tensor, token_ids: torch.Tensor, scoring: str,
                   norm_topk_prob: bool, routed_scaling_factor: float) -> tuple[torch.Tensor, torch.Tensor]:
    ids = tid2eid[token_ids.long()].long()                                      # [T, k]
    scores = expert_scores(_acc(router_logits), scoring)
    return _weights(scores, ids, norm_topk_prob, routed_scaling_factor), ids


def grouped_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    t, g, k = x.shape
    w = _acc(weight).view(g, -1, k)                                             # [G, R, K]
    return torch.einsum("tgk,grk->tgr", _acc(x), w).to(x.dtype)


def kv_compress(kv: torch.Tensor, gate: torch.Tensor, position_bias: torch.Tensor, norm_w: torch.Tensor,
                ratio: int, overlap: bool, eps: float) -> torch.Tensor:
    s, c = kv.shape
    n = s // ratio
    d = c // 2 if overlap else c
    ct = torch.promote_types(_acc(kv).dtype, position_bias.dtype)
    kvw = kv[:n * ratio].to(ct).view(n, ratio, c)
    gw = gate[:n * ratio].to(ct).view(n, ratio, c) + position_bias.to(ct)
    if overlap:                                 # slots [Ca of window w-1 (r) | Cb of window w (r)]
        prev_kv = torch.cat([torch.zeros_like(kvw[:1, :, :d]), kvw[:-1, :, :d]])
        prev_g = torch.cat([torch.full_like(gw[:1, :, :d], float("-inf")), gw[:-1, :, :d]])
        kvw, gw = torch.cat([prev_kv, kvw[..., d:]], dim=1), torch.cat([prev_g, gw[..., d:]], dim=1)
    pooled = (kvw * torch.softmax(gw, dim=1)).sum(dim=1)                        # [n, D]
    normed = pooled * torch.rsqrt(pooled.square().mean(-1, keepdim=True) + eps) * norm_w.to(ct)
    return normed.to(kv.dtype)


# ----------------------------------------------------------------------------- inputs and shapes
def _swiglu_inputs(shape, dtype, device, seed):
    g = generator(device, seed)
    return randn(g, [shape["T"], 2 * shape["I"]], dtype, device, 6.0), float(shape.get("limit", 10.0))


def _clamp_experts_inputs(shape, dtype, device, seed):
    x, w13, w2, w, ids = _experts_inputs(shape, dtype, device, seed)
    return x * 2.0, w13, w2, w, ids, float(shape.get("limit", 10.0))      # x scaled so a 2.0 limit bites


def _clamp_experts_shapes(spec, point) -> list[dict]:
    return [{**s, "limit": spec.swiglu_limit} for s in _experts_shapes(spec, point)] if _v4(spec) else []


def _hash_inputs(shape, dtype, device, seed):
    g = generator(device, seed)
    t, e, k, v = shape["T"], shape["E"], shape["k"], shape.get("V", 64)
    table = torch.rand((v, e), generator=g, device=device).argsort(dim=-1)[:, :k]
    return (randn(g, [t, e], torch.float32, device, 2.0), table, randint(g, v, [t], device),
            shape.get("scoring", "sqrtsoftplus"), True, float(shape.get("scale", 1.5)))


def _grouped_inputs(shape, dtype, device, seed):
    g = generator(device, seed)
    t, gr, k, r = shape["T"], shape["G"], shape["K"], shape["R"]
    return randn(g, [t, gr, k], dtype, device), randn(g, [gr * r, k], dtype, device, k ** -0.5)


def _compress_inputs(shape, dtype, device, seed):
    g = generator(device, seed)
    s, d, r, ov = shape["S"], shape["D"], shape["r"], bool(shape.get("overlap"))
    c = 2 * d if ov else d
    return (randn(g, [s, c], dtype, device), randn(g, [s, c], dtype, device), randn(g, [r, c], torch.float32, device, 0.5),
            1.0 + randn(g, [d], dtype, device, 0.05), r, ov, 1e-6)


def _v4(spec) -> bool:
    return getattr(spec, "family", "") == "deepseek_v4"


def _swiglu_shapes(spec, point) -> list[dict]:
    if not _v4(spec):
        return []
    return [{"T": tokens(point), "I": spec.moe_intermediate_size, "limit": spec.swiglu_limit}]


def _hash_shapes(spec, point) -> list[dict]:
    if not _v4(spec) or not spec.num_hash_layers:
        return []
    return [{"T": tokens(point), "E": spec.num_experts, "k": spec.num_experts_per_tok, "V": spec.vocab_size,
             "scoring": spec.scoring, "scale": spec.routed_scaling_factor}]


def _grouped_shapes(spec, point) -> list[dict]:
    if not _v4(spec):
        return []
    return [{"T": tokens(point), "G": spec.o_groups, "K": spec.num_heads * spec.head_dim // spec.o_groups,
             "R": spec.o_lora_rank}]


def _compress_shapes(spec, point) -> list[dict]:
    if not _v4(spec):
        return []
    ctx = int(point.context) + new_tokens(point)
    return [{"S": ctx, "D": spec.head_dim, "r": r, "overlap": r == spec.csa_ratio}
            for r in sorted({r for r in spec.compress_ratios if r})]


OPS = [
    OpDef("swiglu_clamp_and_mul", swiglu_clamp_and_mul,
          "swiglu_clamp_and_mul(x[..., 2I], limit: float) -> [..., I]: silu(min(gate, limit)) * clamp(up, -limit, "
          "limit) (DeepSeek-V4 swiglu_limit; gate = first half). shape dict: {'T', 'I', 'limit'}",
          _swiglu_inputs, _swiglu_shapes, ({"T": 5, "I": 24, "limit": 10.0}, {"T": 3, "I": 7, "limit": 1.5})),
    OpDef("moe_experts_clamp", moe_experts_clamp,
          "moe_experts_clamp(x[T, H], w13[E, 2I, H], w2[E, H, I], topk_weights[T, k] fp32, topk_ids[T, k] int64, limit) "
          "-> [T, H]: moe_experts with swiglu_clamp_and_mul for silu_and_mul (DeepSeek-V4 experts). shape dict: "
          "{'T', 'E', 'k', 'H', 'I', 'limit'}",
          _clamp_experts_inputs, _clamp_experts_shapes,
          ({"T": 1, "E": 16, "k": 2, "H": 32, "I": 24, "limit": 2.0}, {"T": 6, "E": 8, "k": 2, "H": 48, "I": 16}),
          tolerances=dict(MATMUL_TOLERANCES), fit=_experts_fit,
          check_bytes=experts_check_bytes),
    OpDef("moe_route_hash", moe_route_hash,
          "moe_route_hash(router_logits[T, E] fp32, tid2eid[V, k] int64, token_ids[T] int64, scoring, norm_topk_prob, "
          "routed_scaling_factor) -> (topk_weights[T, k] fp32, topk_ids[T, k] int64): the experts of each token "
          "from the frozen table, weighted by its scores. shape dict: {'T', 'E', 'k', 'V', 'scoring', 'scale'}",
          _hash_inputs, _hash_shapes, ({"T": 7, "E": 16, "k": 4, "V": 50}, {"T": 3, "E": 8, "k": 2, "scoring": "sigmoid"}),
          outputs=2, canonicalize=_route_canonical),
    OpDef("grouped_linear", grouped_linear,
          "grouped_linear(x[T, G, K], weight[G*R, K]) -> [T, G, R]: group g projected by rows g*R..(g+1)*R of weight "
          "(DeepSeek-V4 o_a_proj). shape dict: {'T', 'G', 'K', 'R'}",
          _grouped_inputs, _grouped_shapes, ({"T": 5, "G": 4, "K": 24, "R": 8}, {"T": 1, "G": 2, "K": 17, "R": 5}),
          tolerances=dict(MATMUL_TOLERANCES)),
    OpDef("kv_compress", kv_compress,
          "kv_compress(kv[S, C], gate[S, C], position_bias[r, C] fp32, norm_w[D], ratio r, overlap: bool, eps) -> "
          "[S // r, D]: each closed window of r tokens pooled into one entry by a per-channel softmax over its gates "
          "(+ position_bias), overlapping (C = 2D: the previous window's Ca half joins) or not (C = D), then RMS-"
          "normed. shape dict: {'S', 'D', 'r', 'overlap'}",
          _compress_inputs, _compress_shapes,
          ({"S": 19, "D": 16, "r": 4, "overlap": True}, {"S": 37, "D": 8, "r": 8, "overlap": False},
           {"S": 3, "D": 8, "r": 4, "overlap": True}),
          tolerances=dict(DEFAULT_TOLERANCES)),
]
