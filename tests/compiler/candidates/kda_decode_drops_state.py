"""A wrong kda_decode: this step's output is right, but the state it hands on lost its delta update (only
decayed) -- every later token would attend a corrupted memory. Verification must reject it."""
import torch


def kda_decode(q, k, v, f, b, a_log, dt_bias, lower_bound, state):
    h, kd = f.shape[-2], f.shape[-1]
    x = f.float() + dt_bias.float().view(h, kd)
    a = a_log.float().exp().view(h, 1)
    g = lower_bound * torch.sigmoid(a * x) if lower_bound is not None else -a * torch.nn.functional.softplus(x)
    kn = k.float() * torch.rsqrt(k.float().pow(2).sum(-1, keepdim=True) + 1e-6)
    qn = q.float() * torch.rsqrt(q.float().pow(2).sum(-1, keepdim=True) + 1e-6) * kd ** -0.5
    decayed = state.float() * g.exp()[..., None]
    u = torch.sigmoid(b.float())[..., None] * (v.float() - (kn[..., None] * decayed).sum(-2))
    new = decayed + kn[..., None] * u[..., None, :]
    o = (qn[..., None] * new).sum(-2)
    return o.to(v.dtype), decayed.to(state.dtype)


OVERRIDES = {"kda_decode": kda_decode}
