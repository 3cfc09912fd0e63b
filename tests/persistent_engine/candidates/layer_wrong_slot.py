"""A WRONG dense_gqa_decode_layer: layer_torch.py with the new K/V written one row past the declared slots
(and attention reading the cache as written): the outputs may even look plausible; the judge must reject it
(the declared rows stay unwritten, another row of the cache changed)."""
import torch

DESCRIPTION = "dense_gqa_decode_layer writing K/V at the wrong slots"


def _rms(x, w, eps):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w.float()


def _rope(t, cos, sin, r):
    a, b = t[..., : r // 2], t[..., r // 2: r]
    return torch.cat([a * cos - b * sin, b * cos + a * sin, t[..., r:]], dim=-1)


def dense_gqa_decode_layer(x, residual, positions, k_cache, v_cache, slot_mapping, block_tables, context_lens,
                           input_norm, qkv_weight, qkv_bias, o_weight, post_norm, gate_up_weight, down_weight,
                           cos_sin_cache, eps, scale, rotary_dim, num_heads, num_kv_heads):
    b, dt = x.shape[0], x.dtype
    hk, dh = num_kv_heads, k_cache.shape[-1]
    r1 = (x.float() + residual.float()).to(dt)                               # [B, H] new residual
    qkv = (_rms(r1.float(), input_norm, eps).to(dt).float() @ qkv_weight.float().t())
    if qkv_bias is not None:
        qkv = qkv + qkv_bias.float()
    qkv = qkv.to(dt).float()
    q, k, v = qkv.split([num_heads * dh, hk * dh, hk * dh], dim=-1)
    cos, sin = cos_sin_cache[positions].chunk(2, dim=-1)
    cos, sin = cos[:, None, :], sin[:, None, :]
    q = _rope(q.view(b, num_heads, dh), cos, sin, rotary_dim).to(dt)
    k = _rope(k.view(b, hk, dh), cos, sin, rotary_dim).to(dt)
    wrong = (slot_mapping + 1) % (k_cache.shape[0] * k_cache.shape[1])       # one row off
    k_cache.view(-1, hk, dh)[wrong] = k
    v_cache.view(-1, hk, dh)[wrong] = v.view(b, hk, dh).to(dt)
    bs, mb = k_cache.shape[1], block_tables.shape[1]
    keys = k_cache[block_tables.long()].reshape(b, mb * bs, hk, dh).float()
    vals = v_cache[block_tables.long()].reshape(b, mb * bs, hk, dh).float()
    g = num_heads // hk
    s = torch.einsum("bhgd,blhd->bhgl", q.float().view(b, hk, g, dh), keys) * scale
    past = torch.arange(mb * bs, device=x.device)[None, :] >= context_lens[:, None]
    p = torch.softmax(s.masked_fill(past[:, None, None, :], float("-inf")), dim=-1)
    o = torch.einsum("bhgl,blhd->bhgd", p, vals).reshape(b, num_heads * dh).to(dt)
    h = (o.float() @ o_weight.float().t()).to(dt)
    r2 = (h.float() + r1.float()).to(dt)
    gate_up = (_rms(r2.float(), post_norm, eps).to(dt).float() @ gate_up_weight.float().t()).to(dt).float()
    gate, up = gate_up.chunk(2, dim=-1)
    act = (torch.nn.functional.silu(gate) * up).to(dt)
    return (act.float() @ down_weight.float().t()).to(dt), r2


OVERRIDES = {"dense_gqa_decode_layer": dense_gqa_decode_layer}
