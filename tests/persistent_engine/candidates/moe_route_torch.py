"""moe_route as plain torch (a correct kernel for an op a dense model never calls)."""
import torch


def moe_route(router_logits, correction_bias, top_k, scoring, n_group, topk_group, norm_topk_prob,
              routed_scaling_factor):
    logits = router_logits.to(torch.promote_types(router_logits.dtype, torch.float32))
    if scoring == "softmax":
        scores = torch.softmax(logits, dim=-1)
    elif scoring == "sqrtsoftplus":
        scores = torch.sqrt(torch.nn.functional.softplus(logits))
    else:
        scores = torch.sigmoid(logits)
    choice = scores if correction_bias is None else scores + correction_bias.to(scores.dtype)
    t, e = choice.shape
    if n_group > 1:
        grouped = choice.view(t, n_group, e // n_group)
        group_score = (grouped.topk(2, dim=-1).values.sum(-1) if correction_bias is not None
                       else grouped.max(dim=-1).values)
        keep = torch.zeros_like(group_score, dtype=torch.bool).scatter_(
            1, group_score.topk(topk_group, dim=-1).indices, True)
        choice = choice.masked_fill(~keep.repeat_interleave(e // n_group, dim=1), float("-inf"))
    ids = choice.topk(top_k, dim=-1).indices
    w = scores.gather(1, ids)
    if norm_topk_prob:
        w = w / (w.sum(dim=-1, keepdim=True) + 1e-20)
    return w * routed_scaling_factor, ids


OVERRIDES = {"moe_route": moe_route}
