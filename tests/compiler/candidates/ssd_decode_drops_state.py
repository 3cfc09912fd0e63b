"""A wrong ssd_decode: this token's output is right, but the state it hands on only decays (the token's write
dt x B^T is lost), so every later token reads a corrupted memory. Verification must reject it (output 1)."""
import torch


def ssd_decode(x, dt, a_log, b, c, d, dt_bias, state):
    rep = x.shape[1] // b.shape[1]
    bf, cf = b.float().repeat_interleave(rep, 1), c.float().repeat_interleave(rep, 1)
    delta = torch.nn.functional.softplus(dt.float() + dt_bias.float())
    old = state.float() * torch.exp(-delta * a_log.float().exp())[..., None, None]
    new = old + torch.einsum("bh,bhp,bhn->bhpn", delta, x.float(), bf)
    y = torch.einsum("bhpn,bhn->bhp", new, cf) + d.float()[:, None] * x.float()
    return y.to(x.dtype), old.to(state.dtype)


OVERRIDES = {"ssd_decode": ssd_decode}
