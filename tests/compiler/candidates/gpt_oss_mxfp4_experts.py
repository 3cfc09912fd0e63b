"""gpt-oss's biased experts from the MXFP4 packs alone (w13 / w2 unread when packs are given): decode the touched
experts' e2m1 blocks with their e8m0 scales, then the biased projections around the clamped SwiGLU."""
import torch

FP4 = (0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)


def _decode(blocks, scales, dtype):
    lut = torch.tensor(FP4, dtype=torch.float32, device=blocks.device)
    vals = torch.stack([lut[(blocks & 15).long()], lut[(blocks >> 4).long()]], dim=-1).flatten(-2)
    return torch.ldexp(vals, (scales.to(torch.int32) - 127)[..., None].float()).flatten(-2).to(dtype)


def moe_experts_bias(x, w13, w2, b13, b2, topk_weights, topk_ids, alpha, limit, packs=None):
    if packs is not None:
        used = topk_ids.unique()
        w13, w2 = w13.new_zeros(w13.shape), w2.new_zeros(w2.shape)       # only the packs' touched experts
        w13[used] = _decode(packs[0][used], packs[1][used], x.dtype)
        w2[used] = _decode(packs[2][used], packs[3][used], x.dtype)
    out = torch.zeros(x.shape, dtype=torch.float32, device=x.device)
    for slot in range(topk_ids.shape[1]):
        e = topk_ids[:, slot]
        h = (torch.matmul(w13[e], x[:, :, None]).squeeze(-1) + b13[e].to(x.dtype)).float()
        i = h.shape[-1] // 2
        gate, up = h[:, :i].clamp(max=limit), h[:, i:].clamp(-limit, limit)
        a = ((up + 1) * gate * torch.sigmoid(gate * alpha)).to(x.dtype)
        y = torch.matmul(w2[e], a[:, :, None]).squeeze(-1) + b2[e].to(x.dtype)
        out += y.float() * topk_weights[:, slot, None].float()
    return out.to(x.dtype)


OVERRIDES = {"moe_experts_bias": moe_experts_bias}
DESCRIPTION = "gpt-oss experts decoded from their MXFP4 packs"
