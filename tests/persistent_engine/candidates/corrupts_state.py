"""gated_delta_decode that returns the right output but never advances the recurrent state."""
import torch

DESCRIPTION = "gated_delta_decode: skips the state update"


def gated_delta_decode(q, k, v, g, beta, state):
    hv, dk = v.shape[1], q.shape[2]
    rep = hv // q.shape[1]
    qf = q.float() * torch.rsqrt((q.float() ** 2).sum(-1, keepdim=True) + 1e-6) * dk ** -0.5
    kf = k.float() * torch.rsqrt((k.float() ** 2).sum(-1, keepdim=True) + 1e-6)
    qf, kf = qf.repeat_interleave(rep, 1), kf.repeat_interleave(rep, 1)
    s = state.float() * g.float().exp()[..., None, None]
    u = beta.float()[..., None] * (v.float() - torch.einsum("bhk,bhkv->bhv", kf, s))
    s = s + kf[..., None] * u[..., None, :]
    return torch.einsum("bhk,bhkv->bhv", qf, s).to(v.dtype), state.clone()


OVERRIDES = {"gated_delta_decode": gated_delta_decode}
