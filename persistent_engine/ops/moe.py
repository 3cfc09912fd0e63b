"""Mixture-of-experts routing and the routed-expert computation.

Routing variants (``moe_route``):
  softmax            Qwen3-MoE: softmax over experts, top-k, renormalised (norm_topk_prob)
  sigmoid + bias     MiniMax-M2, GLM-4.x: sigmoid scores; the correction bias only steers the choice,
                     the weights are the unbiased scores, renormalised, times routed_scaling_factor
  grouped            DeepSeek-V3: experts in n_group groups; a group's score is the sum of its top-2
                     biased scores (the max without bias); only the best topk_group groups compete
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from persistent_engine.ops.basic import _acc
from persistent_engine.ops.opdef import MATMUL_TOLERANCES, OpDef, generator, randn, tokens

# moe_experts picks its path from shapes only: gather the chosen experts' weights when 3*T*k < E
# (batch-1 decode reads T*k experts instead of all E), compute every expert densely up to
# LOOP_MIN_TOKENS tokens (reads each expert once; E/k times the FLOPs of a grouped GEMM), and above
# that sort the T*k (token, expert) rows by expert and run two grouped GEMMs (torch._grouped_mm,
# group offsets stay on the device: no host sync, capturable in a CUDA graph). Where grouped GEMMs
# are missing or refuse the dtype/layout (float64 in verification, old torch), a loop over the used
# experts (reads counts on the host) gives the same answer.
LOOP_MIN_TOKENS = 512


def moe_route(router_logits: torch.Tensor, correction_bias: torch.Tensor | None, top_k: int, scoring: str,
              n_group: int, topk_group: int, norm_topk_prob: bool,
              routed_scaling_factor: float) -> tuple[torch.Tensor, torch.Tensor]:
    scores = expert_scores(_acc(router_logits), scoring)
    choice = scores if correction_bias is None else scores + correction_bias.to(scores.dtype)
    t, e = choice.shape
    if n_group > 1:
        grouped = choice.view(t, n_group, e // n_group)
        group_score = (grouped.topk(2, dim=-1).values.sum(-1) if correction_bias is not None
                       else grouped.max(dim=-1).values)                          # [T, n_group]
        keep = torch.zeros_like(group_score, dtype=torch.bool).scatter_(
            1, group_score.topk(topk_group, dim=-1).indices, True)
        choice = choice.masked_fill(~keep.repeat_interleave(e // n_group, dim=1), float("-inf"))
    ids = choice.topk(top_k, dim=-1).indices
    return _weights(scores, ids, norm_topk_prob, routed_scaling_factor), ids


def expert_scores(logits: torch.Tensor, scoring: str) -> torch.Tensor:
    """Router scores: softmax, sigmoid, or DeepSeek-V4's sqrtsoftplus (sqrt(softplus(logit)), HF ACT2FN)."""
    if scoring == "softmax":
        return torch.softmax(logits, dim=-1)
    if scoring == "sigmoid":
        return torch.sigmoid(logits)
    if scoring == "sqrtsoftplus":
        return torch.sqrt(torch.nn.functional.softplus(logits))
    raise ValueError(f"unknown MoE scoring {scoring!r}")


def _weights(scores: torch.Tensor, ids: torch.Tensor, norm_topk_prob: bool, scale: float) -> torch.Tensor:
    w = scores.gather(1, ids)
    if norm_topk_prob:
        w = w / (w.sum(dim=-1, keepdim=True) + 1e-20)
    return w * scale


def route_weights(router_logits: torch.Tensor, ids: torch.Tensor, scoring: str, norm_topk_prob: bool,
                  routed_scaling_factor: float) -> torch.Tensor:
    """The weights ``moe_route`` gives experts ``ids`` [T, k] from these router logits, whatever it would
    have chosen (verification replays the reference's choice through a candidate's router logits)."""
    logits = _acc(router_logits)
    scores = expert_scores(logits, scoring)
    return _weights(scores, ids.to(logits.device).long(), norm_topk_prob, routed_scaling_factor)


def _route_canonical(outs: tuple) -> tuple:
    """Top-k order carries no meaning: compare rows sorted by expert id."""
    w, ids = outs
    ids_sorted, order = ids.sort(dim=-1)
    return w.gather(1, order), ids_sorted


def moe_experts(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                topk_ids: torch.Tensor) -> torch.Tensor:
    return experts_forward(x, w13, w2, topk_weights, topk_ids, _silu_gate)


def _silu_gate(h: torch.Tensor) -> torch.Tensor:
    """h[..., 2I] (gate | up) -> silu(gate) * up [..., I], in fp32, h's dtype."""
    i = h.shape[-1] // 2
    return (F.silu(_acc(h[..., :i])) * _acc(h[..., i:])).to(h.dtype)


def experts_forward(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                    topk_ids: torch.Tensor, act) -> torch.Tensor:
    """moe_experts with the gated activation ``act`` (h[..., 2I] -> [..., I]): SwiGLU, or swigluoai."""
    t, k = topk_ids.shape
    e = w13.shape[0]
    acc = torch.promote_types(x.dtype, torch.float32)
    if 3 * t * k < e:                                              # gather: reads T*k experts
        h = torch.matmul(w13[topk_ids], x[:, None, :, None]).squeeze(-1)          # [T, k, 2I]
        a = act(h).to(x.dtype)
        y = torch.matmul(w2[topk_ids], a[..., None]).squeeze(-1)                  # [T, k, H]
        return (y.to(acc) * topk_weights.to(acc)[..., None]).sum(1).to(x.dtype)
    if t < LOOP_MIN_TOKENS:                                        # dense: every expert, every token
        dense_w = torch.zeros(t, e, dtype=acc, device=x.device).scatter_add_(1, topk_ids, topk_weights.to(acc))
        h = torch.matmul(x.unsqueeze(0), w13.transpose(1, 2))                       # [E, T, 2I]
        a = act(h).to(x.dtype)
        y = torch.matmul(a, w2.transpose(1, 2))                                      # [E, T, H]
        return torch.einsum("te,eth->th", dense_w, y.to(acc)).to(x.dtype)
    flat = topk_ids.flatten()                                      # [T*k] expert of each row
    ids_sorted, order = flat.sort(stable=True)
    tok = order // k                                               # [T*k] token of each sorted row
    wsorted = topk_weights.flatten().to(acc)[order, None]          # [T*k, 1]
    y = _grouped_experts(x[tok], w13, w2, ids_sorted, e, act)
    if y is None:
        y = _looped_experts(x[tok], w13, w2, ids_sorted, e, act)
    # back to (token, slot) order, then a fixed-order sum over the k slots: index_add_ adds with atomics
    # on CUDA, in an order (and so with a bf16 rounding of the result) that changes from run to run
    pairs = torch.empty(t * k, x.shape[1], dtype=acc, device=x.device)
    pairs[order] = y.to(acc) * wsorted
    return pairs.view(t, k, -1).sum(1).to(x.dtype)


def _grouped_experts(xs: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, ids_sorted: torch.Tensor,
                     e: int, act) -> torch.Tensor | None:
    """xs[R, H] rows sorted by expert -> [R, H] through two grouped GEMMs; None where unsupported.
    Offsets [E] int32 (end row of each expert's group) from searchsorted: no host read."""
    grouped = getattr(torch, "_grouped_mm", None)
    if grouped is None or xs.dtype not in (torch.bfloat16, torch.float16, torch.float32):
        return None
    offs = torch.searchsorted(ids_sorted, torch.arange(e, device=xs.device), right=True).to(torch.int32)
    try:
        h = grouped(xs, w13.transpose(1, 2), offs=offs)                              # [R, 2I]
        return grouped(act(h), w2.transpose(1, 2), offs=offs)                       # [R, H]
    except (RuntimeError, NotImplementedError):  # dtype, layout or alignment this build refuses
        return None


def _looped_experts(xs: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, ids_sorted: torch.Tensor,
                    e: int, act) -> torch.Tensor:
    """The same as ``_grouped_experts`` one used expert at a time (reads the counts on the host)."""
    y = torch.empty(xs.shape[0], w2.shape[1], dtype=xs.dtype, device=xs.device)
    start = 0
    for expert, c in enumerate(torch.bincount(ids_sorted, minlength=e).tolist()):
        if c:
            rows = slice(start, start + c)
            y[rows] = act(xs[rows] @ w13[expert].t()) @ w2[expert].t()
            start += c
    return y


# ----------------------------------------------------------------------------- inputs and shapes
def _route_inputs(shape, dtype, device, seed):
    g = generator(device, seed)
    bias = randn(g, [shape["E"]], torch.float32, device, 0.3) if shape.get("bias") else None
    return (randn(g, [shape["T"], shape["E"]], torch.float32, device, 2.0), bias, shape["k"],
            shape.get("scoring", "softmax"), shape.get("n_group", 1), shape.get("topk_group", 1),
            shape.get("norm", True), float(shape.get("scale", 1.0)))


def _route_shapes(spec, point) -> list[dict]:
    if not spec.is_moe:
        return []
    return [{"T": tokens(point), "E": spec.num_experts, "k": spec.num_experts_per_tok, "scoring": spec.scoring,
             "bias": spec.routing_bias, "n_group": spec.n_group, "topk_group": spec.topk_group,
             "norm": spec.norm_topk_prob, "scale": spec.routed_scaling_factor}]


def _experts_inputs(shape, dtype, device, seed):
    g = generator(device, seed)
    t, e, k, h, i = shape["T"], shape["E"], shape["k"], shape["H"], shape["I"]
    w = torch.rand((t, k), generator=g, device=device) + 0.1
    ids = torch.rand((t, e), generator=g, device=device).argsort(dim=-1)[:, :k]     # k distinct experts
    return (randn(g, [t, h], dtype, device), randn(g, [e, 2 * i, h], dtype, device, h ** -0.5),
            randn(g, [e, h, i], dtype, device, i ** -0.5), w / w.sum(-1, keepdim=True), ids)


def _experts_shapes(spec, point) -> list[dict]:
    if not spec.is_moe or spec.mlp_act in ("relu2", "gelu_tanh"):    # moe_experts_relu2 (ops/relu2.py), Gemma-4's
        return []                                                       # moe_experts_gelu (ops/gemma.py)
    return [{"T": tokens(point), "E": spec.num_experts, "k": spec.num_experts_per_tok, "H": spec.hidden_size,
             "I": spec.moe_intermediate_size}]


def _experts_fit(shape: dict, budget: int) -> dict:
    """Fewer experts when an op-level check at this shape would not fit ``budget`` bytes: it holds about
    8 fp32-sized copies of each expert's w13 and w2 at once (generation temporaries, the inputs, their
    snapshot, the allocator poisoning, the upcast reference). DeepSeek-V3's 256 experts need ~360 GB that
    way; each expert's work is the same with a few dozen of them. At least 2k experts stay."""
    e = max(2 * shape["k"], min(shape["E"], budget // experts_check_bytes({**shape, "E": 1})))
    return shape if e >= shape["E"] else {**shape, "E": int(e)}


def experts_check_bytes(shape: dict) -> int:
    """Bytes an op-level check of an experts op holds at ``shape`` (both halves, the judge's and the
    executor's): ~8 fp32-sized copies of the E experts' w13 [E, 2I, H] and w2 [E, H, I]."""
    return 8 * 3 * shape["E"] * shape["H"] * shape["I"] * 4


# the op-level examples are checked for every model; DeepSeek-V4's sqrtsoftplus scoring joins them once a model
# that uses it runs through the engine (its reference is covered by tests/persistent_engine/test_dsv4_ops.py)
OPS = [
    OpDef("moe_route", moe_route,
          "moe_route(router_logits[T, E] fp32, correction_bias[E] fp32 | None, top_k, scoring: 'softmax'|'sigmoid'|"
          "'sqrtsoftplus', "
          "n_group, topk_group, norm_topk_prob: bool, routed_scaling_factor: float) -> (topk_weights[T, k] fp32, "
          "topk_ids[T, k] int64); the bias steers the choice only, weights are unbiased scores (renormalised "
          "when norm_topk_prob) times routed_scaling_factor; grouped (n_group > 1): only experts of the "
          "topk_group best groups (group score: sum of top-2 biased scores, or max without bias) compete. "
          "Top-k order is free (compared sorted by id). shape dict: {'T', 'E', 'k', 'scoring', 'bias', "
          "'n_group', 'topk_group', 'norm', 'scale'}",
          _route_inputs, _route_shapes,
          ({"T": 7, "E": 16, "k": 4, "scoring": "softmax"},
           {"T": 5, "E": 32, "k": 8, "scoring": "sigmoid", "bias": True, "scale": 2.5},
           {"T": 9, "E": 64, "k": 6, "scoring": "sigmoid", "bias": True, "n_group": 8, "topk_group": 3,
            "scale": 2.5}),
          outputs=2, canonicalize=_route_canonical),
    OpDef("moe_experts", moe_experts,
          "moe_experts(x[T, H], w13[E, 2I, H], w2[E, H, I], topk_weights[T, k] fp32, topk_ids[T, k] int64) -> [T, H] "
          "= sum_j topk_weights[t, j] * (silu_and_mul(x[t] @ w13[e].T) @ w2[e].T), e = topk_ids[t, j] (w13 rows: "
          "gate then up). shape dict: {'T', 'E', 'k', 'H', 'I'}",
          _experts_inputs, _experts_shapes,
          ({"T": 1, "E": 16, "k": 2, "H": 32, "I": 24}, {"T": 6, "E": 8, "k": 2, "H": 48, "I": 16},
           {"T": LOOP_MIN_TOKENS + 3, "E": 8, "k": 3, "H": 16, "I": 8}),
          tolerances=dict(MATMUL_TOLERANCES), fit=_experts_fit,
          check_bytes=experts_check_bytes),
]
