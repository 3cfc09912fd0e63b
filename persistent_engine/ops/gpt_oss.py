"""gpt-oss's routed experts: biased projections around the clamped SwiGLU (``moe_experts_bias``).

Source: HF transformers ``models/gpt_oss/modeling_gpt_oss.py`` (Apache-2.0), ``GptOssExperts``: per expert e
    gate_up = x @ W13[e] + b13[e];  gate, up = clamp(gate, max=limit), clamp(up, -limit, limit)
    out     = ((up + 1) * gate * sigmoid(alpha * gate)) @ W2[e] + b2[e]
and the token's output is the sum over its k experts of topk_weight * out. HF stores gate_up interleaved
(gate = [..., ::2]); tkcc's w13 rows are [gate | up] halves (the loader de-interleaves, models/gpt_oss.py), so
the activation is ``swigluoai_and_mul`` (ops/msa.py). The router (a biased linear, top-k, softmax over the k
logits) is ``linear`` then ``moe_route`` with softmax scoring renormalised over the chosen experts: the same
weights, since softmax over the top-k logits = softmax over all, restricted and renormalised.

MXFP4 checkpoints (gpt-oss's Hub weights): ``packs`` = (w13_blocks [E, 2I, H/32, 16], w13_scales [E, 2I, H/32],
w2_blocks [E, H, I/32, 16], w2_scales [E, H, I/32]) uint8, of which w13 and w2 are the exact decode
(ops/mxfp4.py). The reference reads the bf16 decode and ignores the packs; they are there for a template that
reads 4.25 bits per weight instead of 16 (and must give the same numbers: the values are the same). None: bf16
experts only.

Paths (chosen from shapes only, no host read, like ``moe_experts``): gather the T*k chosen experts' weights when
3 T k < E (batch-1 decode reads T*k experts), else sort the (token, expert) rows by expert and run two grouped
GEMMs (torch._grouped_mm), biases gathered per row; where grouped GEMMs are missing (float64 verification,
old torch) a loop over the used experts gives the same answer. FLOPs 6 T k H I; reads the touched experts' weights
and biases once.
"""

from __future__ import annotations

import torch

from persistent_engine.ops.mxfp4 import decode_mxfp4, encode_mxfp4
from persistent_engine.ops.moe import _experts_fit, _experts_inputs, _experts_shapes, experts_check_bytes
from persistent_engine.ops.msa import swigluoai_and_mul
from persistent_engine.ops.opdef import MATMUL_TOLERANCES, OpDef, generator, randn


def moe_experts_bias(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, b13: torch.Tensor, b2: torch.Tensor,
                     topk_weights: torch.Tensor, topk_ids: torch.Tensor, alpha: float, limit: float,
                     packs: tuple | None = None) -> torch.Tensor:
    t, k = topk_ids.shape
    e = w13.shape[0]
    acc = torch.promote_types(x.dtype, torch.float32)
    if 3 * t * k < e:                                              # gather: reads T*k experts
        h = torch.matmul(w13[topk_ids], x[:, None, :, None]).squeeze(-1) + b13[topk_ids].to(x.dtype)   # [T, k, 2I]
        a = swigluoai_and_mul(h, alpha, limit)
        y = torch.matmul(w2[topk_ids], a[..., None]).squeeze(-1) + b2[topk_ids].to(x.dtype)             # [T, k, H]
        return (y.to(acc) * topk_weights.to(acc)[..., None]).sum(1).to(x.dtype)
    flat = topk_ids.flatten()                                      # [T*k] expert of each row
    ids_sorted, order = flat.sort(stable=True)
    xs = x[order // k]                                             # [T*k, H] rows sorted by expert
    y = _grouped(xs, w13, w2, b13, b2, ids_sorted, alpha, limit)
    if y is None:
        y = _looped(xs, w13, w2, b13, b2, ids_sorted, alpha, limit)
    # back to (token, slot) order, then a fixed-order sum over the k slots (deterministic, unlike index_add_)
    pairs = torch.empty(t * k, x.shape[1], dtype=acc, device=x.device)
    pairs[order] = y.to(acc) * topk_weights.flatten().to(acc)[order, None]
    return pairs.view(t, k, -1).sum(1).to(x.dtype)


def _grouped(xs, w13, w2, b13, b2, ids_sorted, alpha, limit) -> torch.Tensor | None:
    grouped = getattr(torch, "_grouped_mm", None)
    if grouped is None or xs.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        return None
    e = w13.shape[0]
    offs = torch.searchsorted(ids_sorted, torch.arange(e, device=xs.device), right=True).to(torch.int32)
    try:
        h = grouped(xs, w13.transpose(1, 2), offs=offs) + b13[ids_sorted].to(xs.dtype)          # [R, 2I]
        return grouped(swigluoai_and_mul(h, alpha, limit), w2.transpose(1, 2), offs=offs) + b2[ids_sorted].to(xs.dtype)
    except (RuntimeError, NotImplementedError):  # dtype, layout or alignment this build refuses
        return None


def _looped(xs, w13, w2, b13, b2, ids_sorted, alpha, limit) -> torch.Tensor:
    """``_grouped`` one used expert at a time (reads the counts on the host)."""
    y = torch.empty(xs.shape[0], w2.shape[1], dtype=xs.dtype, device=xs.device)
    start = 0
    for expert, c in enumerate(torch.bincount(ids_sorted, minlength=w13.shape[0]).tolist()):
        if c:
            rows = slice(start, start + c)
            h = xs[rows] @ w13[expert].t() + b13[expert].to(xs.dtype)
            y[rows] = swigluoai_and_mul(h, alpha, limit) @ w2[expert].t() + b2[expert].to(xs.dtype)
            start += c
    return y


def _packed(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(w rounded to MXFP4, its blocks, its scales), one expert at a time."""
    packs = [encode_mxfp4(w[e]) for e in range(w.shape[0])]
    blocks, scales = torch.stack([b for b, _ in packs]), torch.stack([s for _, s in packs])
    return decode_mxfp4(blocks, scales, w.dtype), blocks, scales


def _inputs(shape, dtype, device, seed):
    x, w13, w2, w, ids = _experts_inputs(shape, dtype, device, seed)
    g = generator(device, seed + 1)
    e, i, h = shape["E"], shape["I"], shape["H"]
    packs = None
    if shape.get("mxfp4"):
        (w13, b13p, s13), (w2, b2p, s2) = _packed(w13), _packed(w2)
        packs = (b13p, s13, b2p, s2)
    return (x, w13, w2, randn(g, [e, 2 * i], torch.float32, device, 0.5), randn(g, [e, h], torch.float32, device, 0.5),
            w, ids, float(shape.get("alpha", 1.702)), float(shape.get("limit", 7.0)), packs)


def _shapes(spec, point) -> list[dict]:
    if not getattr(spec, "moe_bias", False):
        return []
    return [{**s, "alpha": spec.swiglu_alpha, "limit": spec.swiglu_limit, "mxfp4": spec.expert_dtype == "mxfp4"}
            for s in _experts_shapes(spec, point)]


def _check_bytes(shape: dict) -> int:
    return experts_check_bytes(shape)


OPS = [
    OpDef("moe_experts_bias", moe_experts_bias,
          "moe_experts_bias(x[T, H], w13[E, 2I, H], w2[E, H, I], b13[E, 2I] fp32, b2[E, H] fp32, topk_weights[T, k] "
          "fp32, topk_ids[T, k] int64, alpha, limit, packs: (w13_blocks[E, 2I, H/32, 16], w13_scales[E, 2I, H/32], "
          "w2_blocks[E, H, I/32, 16], w2_scales[E, H, I/32]) uint8 MXFP4 whose exact decode w13 and w2 are | None) "
          "-> [T, H] = sum_j topk_weights[t, j] * (swigluoai(x[t] @ w13[e].T "
          "+ b13[e]) @ w2[e].T + b2[e]), e = topk_ids[t, j]; swigluoai(gate | up) = (clamp(up, -limit, limit) + 1) * g "
          "* sigmoid(alpha g), g = clamp(gate, max=limit) (gpt-oss). shape dict: {'T', 'E', 'k', 'H', 'I', 'alpha', "
          "'limit', 'mxfp4': bool}",
          _inputs, _shapes,
          ({"T": 1, "E": 16, "k": 4, "H": 32, "I": 16}, {"T": 9, "E": 8, "k": 4, "H": 32, "I": 16, "limit": 1.5},
           {"T": 5, "E": 8, "k": 4, "H": 64, "I": 32, "mxfp4": True}),
          tolerances=dict(MATMUL_TOLERANCES), fit=_experts_fit, check_bytes=_check_bytes),
]
