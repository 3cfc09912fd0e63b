"""A correct kda_decode written another way: the decay and the delta update folded into one expression,
S' = e^g S + beta k (v - k^T e^g S)^T, with the output q^T S' expanded as q^T e^g S + (q . k) beta (v - ...)."""
import torch


def kda_decode(q, k, v, f, b, a_log, dt_bias, lower_bound, state):
    h, kd = f.shape[-2], f.shape[-1]
    x = f.float() + dt_bias.float().view(h, kd)
    a = a_log.float().exp().view(h, 1)
    g = lower_bound * torch.sigmoid(a * x) if lower_bound is not None else -a * torch.nn.functional.softplus(x)
    kn = k.float() * torch.rsqrt(k.float().pow(2).sum(-1, keepdim=True) + 1e-6)
    qn = q.float() * torch.rsqrt(q.float().pow(2).sum(-1, keepdim=True) + 1e-6) * kd ** -0.5
    decayed = state.float() * g.exp()[..., None]                                   # [B, H, K, V]
    u = torch.sigmoid(b.float())[..., None] * (v.float() - (kn[..., None] * decayed).sum(-2))
    o = (qn[..., None] * decayed).sum(-2) + (qn * kn).sum(-1, keepdim=True) * u
    return o.to(v.dtype), (decayed + kn[..., None] * u[..., None, :]).to(state.dtype)


OVERRIDES = {"kda_decode": kda_decode}
