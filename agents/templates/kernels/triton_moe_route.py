"""moe_route as one Triton kernel: router scores, correction bias, top-k and the weights in a single launch.

The reference makes a kernel per step (scores, bias add, top-k, gather, sum, divide, scale: ~7 launches a MoE
layer, ~20 us a layer at decode batch sizes where each is a few microseconds of launch for [T, E] = [1..256,
128..896] fp32). Here a program takes ROWS token rows whole (BLOCK_E = next_pow2(E) expert columns): scores in
fp32 (``SCORING`` 0 softmax, 1 sigmoid), choice = scores + bias, top-k as K rounds of argmax (the lowest expert id
on a tie; each round masks its winner), the chosen scores gathered in the same pass, renormalised
(``norm_topk_prob``) and scaled. Reads T * E logits (+ E bias), writes T * k weights and ids. Grouped routing
(n_group > 1) and DeepSeek-V4's sqrt-softplus scoring take the torch path below (the same math as the reference).
"""

import torch
import triton
import triton.language as tl

# ---- section ----
MROUTE_ROWS = 1              # token rows per program
MROUTE_NUM_WARPS = 1


@triton.jit
def _mroute_kernel(logits_ptr, bias_ptr, w_ptr, ids_ptr, T, E, stride_l, stride_w, stride_i, scale,
                   K: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_E: tl.constexpr, ROWS: tl.constexpr,
                   SCORING: tl.constexpr, HAS_BIAS: tl.constexpr, NORM: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)                  # [ROWS]
    rmask = rows < T
    e = tl.arange(0, BLOCK_E)                                            # [BLOCK_E] expert ids
    emask = e < E
    x = tl.load(logits_ptr + rows[:, None].to(tl.int64) * stride_l + e[None, :],
                mask=rmask[:, None] & emask[None, :], other=0.0).to(tl.float32)
    x = tl.where(emask[None, :], x, float("-inf"))                       # padded experts: never chosen
    if SCORING == 0:                                                     # softmax over the experts
        p = tl.exp(x - tl.max(x, axis=1)[:, None])
        s = p / tl.sum(p, axis=1)[:, None]
    else:                                                                # sigmoid
        s = 1.0 / (1.0 + tl.exp(-x))
    s = tl.where(emask[None, :], s, 0.0)                                 # [ROWS, BLOCK_E] scores
    choice = s
    if HAS_BIAS:                                                         # steers the choice, not the weights
        choice = s + tl.load(bias_ptr + e, mask=emask, other=0.0).to(tl.float32)[None, :]
    choice = tl.where(emask[None, :], choice, float("-inf"))
    kk = tl.arange(0, BLOCK_K)
    w = tl.zeros([ROWS, BLOCK_K], dtype=tl.float32)
    ids = tl.zeros([ROWS, BLOCK_K], dtype=tl.int32)
    for j in tl.static_range(K):                                         # round j: the j-th best expert
        best = tl.max(choice, axis=1)                                    # [ROWS]
        pick = tl.min(tl.where(choice == best[:, None], e[None, :], BLOCK_E), axis=1)       # lowest id on a tie
        won = e[None, :] == pick[:, None]                                # [ROWS, BLOCK_E]
        w = tl.where(kk[None, :] == j, tl.sum(tl.where(won, s, 0.0), axis=1)[:, None], w)
        ids = tl.where(kk[None, :] == j, pick[:, None], ids)
        choice = tl.where(won, float("-inf"), choice)
    if NORM:
        w = w / (tl.sum(w, axis=1)[:, None] + 1e-20)
    omask = rmask[:, None] & (kk[None, :] < K)
    tl.store(w_ptr + rows[:, None].to(tl.int64) * stride_w + kk[None, :], w * scale, mask=omask)
    tl.store(ids_ptr + rows[:, None].to(tl.int64) * stride_i + kk[None, :], ids.to(tl.int64), mask=omask)


def _mroute_torch(router_logits, correction_bias, top_k, scoring, n_group, topk_group, norm_topk_prob,
                  routed_scaling_factor):
    """Grouped routing and sqrt-softplus scoring: the reference's math in torch."""
    x = router_logits.float()
    scores = {"softmax": lambda: torch.softmax(x, dim=-1), "sigmoid": lambda: torch.sigmoid(x),
              "sqrtsoftplus": lambda: torch.sqrt(torch.nn.functional.softplus(x))}[scoring]()
    choice = scores if correction_bias is None else scores + correction_bias.to(scores.dtype)
    t, e = choice.shape
    if n_group > 1:
        grouped = choice.view(t, n_group, e // n_group)
        group_score = (grouped.topk(2, dim=-1).values.sum(-1) if correction_bias is not None
                       else grouped.max(dim=-1).values)                                      # [T, n_group]
        keep = torch.zeros_like(group_score, dtype=torch.bool).scatter_(
            1, group_score.topk(topk_group, dim=-1).indices, True)
        choice = choice.masked_fill(~keep.repeat_interleave(e // n_group, dim=1), float("-inf"))
    ids = choice.topk(top_k, dim=-1).indices
    w = scores.gather(1, ids)
    if norm_topk_prob:
        w = w / (w.sum(dim=-1, keepdim=True) + 1e-20)
    return w * routed_scaling_factor, ids


def moe_route_triton(router_logits, correction_bias, top_k, scoring, n_group, topk_group, norm_topk_prob,
                     routed_scaling_factor):
    if n_group > 1 or scoring not in ("softmax", "sigmoid"):
        return _mroute_torch(router_logits, correction_bias, top_k, scoring, n_group, topk_group, norm_topk_prob,
                             routed_scaling_factor)
    T, E = router_logits.shape
    logits = router_logits if router_logits.stride(-1) == 1 else router_logits.contiguous()
    w = torch.empty((T, top_k), dtype=torch.float32, device=logits.device)
    ids = torch.empty((T, top_k), dtype=torch.int64, device=logits.device)
    if T == 0:
        return w, ids
    bias = correction_bias if correction_bias is not None else logits
    _mroute_kernel[(triton.cdiv(T, MROUTE_ROWS),)](
        logits, bias, w, ids, T, E, logits.stride(0), w.stride(0), ids.stride(0), float(routed_scaling_factor),
        K=top_k, BLOCK_K=triton.next_power_of_2(top_k), BLOCK_E=triton.next_power_of_2(E), ROWS=MROUTE_ROWS,
        SCORING=0 if scoring == "softmax" else 1, HAS_BIAS=correction_bias is not None, NORM=bool(norm_topk_prob),
        num_warps=MROUTE_NUM_WARPS)
    return w, ids
