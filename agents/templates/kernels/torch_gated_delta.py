"""gated_delta_decode restructured in torch: the state is read once and written once.

The reference decays the state (a full pass), reads it for k^T S, writes the rank-1 update (another pass) and
reads the new state again for q^T S. Here, with gamma = exp(g) and rows [q; k] stacked:
    [q^T S; k^T S] = [q; k] @ S               one batched matmul: the only read of S
    u  = beta (v - gamma k^T S);   o = gamma q^T S + (q . k) u      vectors only
    S' = gamma S + k u^T                       one baddbmm: the only write
``TGD_MATMUL``: "bmm" ([q; k] @ S as one bmm) or "einsum" (two einsums over S).
"""

import torch

# ---- section ----
TGD_MATMUL = "bmm"


def gated_delta_decode_torch(q, k, v, g, beta, state):
    b, hk, dk = q.shape
    hv, dv = v.shape[1], v.shape[2]
    ct = torch.promote_types(torch.promote_types(q.dtype, state.dtype), torch.float32)
    rep = hv // hk
    qk = torch.stack([q, k], dim=2).to(ct)                                     # [B, Hk, 2, Dk]
    qk = qk * torch.rsqrt((qk * qk).sum(-1, keepdim=True) + 1e-6)
    qk = qk.repeat_interleave(rep, dim=1) if rep > 1 else qk                   # [B, Hv, 2, Dk]
    qn, kn = qk[:, :, 0] * dk ** -0.5, qk[:, :, 1]
    s = state.to(ct).reshape(b * hv, dk, dv)
    rows = torch.stack([qn, kn], dim=2).reshape(b * hv, 2, dk)
    if TGD_MATMUL == "bmm":
        read = torch.bmm(rows, s).view(b, hv, 2, dv)                           # [q^T S; k^T S]
    else:
        read = torch.stack([torch.einsum("nk,nkv->nv", rows[:, i], s) for i in range(2)], 1).view(b, hv, 2, dv)
    gamma = g.to(ct).exp()                                                     # [B, Hv]
    u = beta.to(ct).unsqueeze(-1) * (v.to(ct) - gamma.unsqueeze(-1) * read[:, :, 1])
    o = gamma.unsqueeze(-1) * read[:, :, 0] + (qn * kn).sum(-1, keepdim=True) * u
    new = torch.baddbmm(s * gamma.reshape(b * hv, 1, 1), kn.reshape(b * hv, dk, 1), u.reshape(b * hv, 1, dv))
    return o.to(v.dtype), new.view(b, hv, dk, dv).to(state.dtype)
