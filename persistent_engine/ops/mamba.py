"""Mamba-2 (selective state space, SSD) ops of Nemotron-H's mixer, with its short causal convolution and gated norm.

The math (per head h of Hm, head dim P, state N; B and C come in G groups, head h reading group h // (Hm / G)):
    dt_t = softplus(dt_t + dt_bias)            [Hm] fp32  (time_step_limit (0, inf): no clamp)
    S_t  = exp(dt_t A) S_{t-1} + dt_t x_t B_t^T     S [Hm, P, N] fp32, A = -exp(A_log) [Hm]
    y_t  = S_t C_t + D x_t                     [Hm, P]
Sources: Hugging Face transformers ``modeling_nemotron_h.py`` (Apache-2.0: ``NemotronHMamba2Mixer.torch_forward``,
its cached single-token branch and its chunked "ssd naive" branch; ``Zamba2RMSNormGated``) and vLLM's
``MambaMixer2`` (``selective_state_update``, ``mamba_chunk_scan_combined`` with dt_softplus and no dt limit, the
group-wise gated RMSNorm with norm_before_gate False). HF's torch_forward also clamps dt below at time_step_min
(1e-3); the kernel paths of HF and vLLM do not (time_step_limit (0, inf)), nor does tkcc.

The core, for tests and reuse:
  ``recurrent_ssd(x, dt, a, b, c, state)``        token by token (the decode form)
  ``chunk_ssd(x, dt, a, b, c, state, chunk)``     chunk-parallel (the prefill form): within a chunk with
      cumulative log-decay G_i = sum_{t<=i} dt_t A and L_ij = exp(G_i - G_j) (j <= i):
        y_i = sum_{j<=i} L_ij (C_i . B_j) dt_j x_j + exp(G_i) S0 C_i,
        S   = exp(G_c) S0 + sum_j exp(G_c - G_j) dt_j x_j B_j^T
  Both take x [L, Hm, P], dt [L, Hm] (after softplus), a [Hm] (= A), b, c [L, Hm, N] (groups repeated), state
  [Hm, P, N] fp32 and return (y [L, Hm, P] without the D skip, final state) in fp32.

Ops (pure: new states are outputs): mamba_conv_decode, mamba_conv_prefill (depthwise conv + bias, then silu),
ssd_decode, ssd_prefill, mamba_gated_norm.
Costs per decode token and head: the state read and written once (2 P N x 4 bytes), ~6 P N FLOPs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from persistent_engine.ops.basic import _acc
from persistent_engine.ops.linear_attention import STATE_TOLERANCES, _ragged
from persistent_engine.ops.opdef import (DEFAULT_TOLERANCES, MATMUL_TOLERANCES, OpDef, generator, randn, seq_shape,
                                         tokens)

CHUNK = 64          # tokens per chunk of the reference scan (the result does not depend on it)


# ----------------------------------------------------------------------------- the SSD core
def recurrent_ssd(x, dt, a, b, c, state):
    """Token-by-token selective state update; see the module doc. Per token and head ~6 P N FLOPs."""
    s = state.clone()
    y = torch.empty(x.shape, dtype=s.dtype, device=s.device)
    for t in range(x.shape[0]):
        s = s * (dt[t] * a).exp()[:, None, None] + (dt[t][:, None] * x[t])[..., None] * b[t][:, None, :]
        y[t] = torch.einsum("hpn,hn->hp", s, c[t])
    return y, s


def chunk_ssd(x, dt, a, b, c, state, chunk: int = CHUNK):
    """Chunk-parallel SSD scan (see the module doc). Per chunk and head ~c^2 (N + P) + 4 c P N FLOPs."""
    s = state.clone()
    y = torch.empty(x.shape, dtype=s.dtype, device=s.device)
    for c0 in range(0, x.shape[0], chunk):
        c1 = min(x.shape[0], c0 + chunk)
        n = c1 - c0
        xs, dts, bs, cs = x[c0:c1], dt[c0:c1], b[c0:c1], c[c0:c1]
        g = (dts * a).cumsum(0)                                              # [c, Hm]
        causal = torch.ones(n, n, dtype=torch.bool, device=x.device).tril()
        decay = (g[:, None] - g[None, :]).masked_fill(~causal[:, :, None], float("-inf")).exp()   # [c, c, Hm]
        scores = torch.einsum("ihn,jhn->ijh", cs, bs) * decay                # [c(i), c(j), Hm]
        y_in = torch.einsum("ijh,jhp->ihp", scores, dts[..., None] * xs)
        y_prev = g.exp()[..., None] * torch.einsum("hpn,ihn->ihp", s, cs)
        y[c0:c1] = y_in + y_prev
        tail = (g[-1:] - g).exp() * dts                                      # [c, Hm]: decay to the chunk end
        s = g[-1].exp()[:, None, None] * s + torch.einsum("jh,jhp,jhn->hpn", tail, xs, bs)
    return y, s


def _prepare(x, dt, a_log, b, c, dt_bias, state):
    """fp32 (fp64 when any input is) x, softplus'd dt, A, and B, C repeated from G groups to the Hm heads."""
    ct = torch.promote_types(torch.promote_types(x.dtype, state.dtype), torch.float32)
    rep = x.shape[-2] // b.shape[-2]
    bf, cf = b.to(ct), c.to(ct)
    if rep > 1:
        bf, cf = bf.repeat_interleave(rep, dim=-2), cf.repeat_interleave(rep, dim=-2)
    dtf = F.softplus(dt.to(ct) + dt_bias.to(ct))
    return x.to(ct), dtf, -a_log.to(ct).exp(), bf, cf, state.to(ct)


# ----------------------------------------------------------------------------- ops
def ssd_decode(x, dt, a_log, b, c, d, dt_bias, state):
    """One token per sequence: x [B, Hm, P], dt [B, Hm], A_log, D, dt_bias [Hm] fp32, b, c [B, G, N], state
    [B, Hm, P, N] fp32 -> (y [B, Hm, P] in x's dtype (with the D skip), new state fp32)."""
    xf, dtf, a, bf, cf, s = _prepare(x, dt, a_log, b, c, dt_bias, state)
    s = s * (dtf * a).exp()[..., None, None] + (dtf[..., None] * xf)[..., None] * bf[:, :, None, :]
    y = torch.einsum("bhpn,bhn->bhp", s, cf) + d.to(xf.dtype)[:, None] * xf
    return y.to(x.dtype), s.to(state.dtype)


def ssd_prefill(x, dt, a_log, b, c, d, dt_bias, state, cu_seqlens_q):
    """A ragged chunk per sequence (tokens cu_seqlens_q[b]:cu_seqlens_q[b+1]) on top of its state: x [T, Hm, P],
    dt [T, Hm], b, c [T, G, N], state [B, Hm, P, N] fp32 -> (y [T, Hm, P], final states [B, Hm, P, N] fp32).
    Chunk-parallel; reads cu_seqlens on the host."""
    xf, dtf, a, bf, cf, sf = _prepare(x, dt, a_log, b, c, dt_bias, state)
    y = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    new = state.clone()
    skip = d.to(xf.dtype)[:, None] * xf
    cu = cu_seqlens_q.tolist()
    for i in range(len(cu) - 1):
        s0, s1 = cu[i], cu[i + 1]
        if s1 > s0:
            o, st = chunk_ssd(xf[s0:s1], dtf[s0:s1], a, bf[s0:s1], cf[s0:s1], sf[i])
            y[s0:s1], new[i] = (o + skip[s0:s1]).to(x.dtype), st.to(state.dtype)
    return y, new


def mamba_conv_decode(x, conv_state, weight, bias):
    """x [B, C] (this token), conv_state [B, C, K-1] (the previous K-1 inputs, oldest first), weight [C, K], bias
    [C] -> (silu(depthwise conv + bias) [B, C] in x's dtype, new conv_state [B, C, K-1])."""
    win = torch.cat([_acc(conv_state), _acc(x).unsqueeze(-1)], dim=-1)            # [B, C, K]
    y = F.silu((win * _acc(weight)).sum(-1) + _acc(bias))
    return y.to(x.dtype), win[..., 1:].to(conv_state.dtype)


def mamba_conv_prefill(x, conv_state, weight, bias, cu_seqlens_q):
    """x [T, C] ragged by cu_seqlens_q [B+1], conv_state [B, C, K-1], weight [C, K], bias [C] -> (y [T, C], new
    conv_state [B, C, K-1]): each sequence's chunk convolved after its K-1 previous inputs, + bias, silu."""
    kk = weight.shape[1]
    y = torch.empty_like(x)
    new = conv_state.clone()
    cu = cu_seqlens_q.tolist()
    for i in range(len(cu) - 1):
        s0, s1 = cu[i], cu[i + 1]
        if s1 == s0:
            continue
        seq = torch.cat([_acc(conv_state[i]), _acc(x[s0:s1]).t()], dim=-1)          # [C, K-1+L]
        out = F.conv1d(seq[None], _acc(weight)[:, None], _acc(bias), groups=seq.shape[0])[0]
        y[s0:s1] = F.silu(out).t().to(x.dtype)
        new[i] = seq[:, -(kk - 1):].to(conv_state.dtype)
    return y, new


def mamba_gated_norm(y, z, weight, groups: int, eps: float):
    """HF Zamba2RMSNormGated (norm_before_gate False): y, z [T, I], weight [I] -> weight * rms_norm over each of
    ``groups`` contiguous groups of (y * silu(z)), in y's dtype."""
    h = _acc(y) * F.silu(_acc(z))
    g = h.view(h.shape[0], groups, -1)
    g = g * torch.rsqrt(g.pow(2).mean(-1, keepdim=True) + eps)
    return weight * g.view(h.shape).to(y.dtype)


# ----------------------------------------------------------------------------- inputs and shapes
def _ssd_args(g, shape, dtype, device, t):
    h, p, n, gr = shape["H"], shape["P"], shape["N"], shape["G"]
    return (randn(g, [t, h, p], dtype, device), randn(g, [t, h], dtype, device),
            randn(g, [h], torch.float32, device, 0.5) - 1.0, randn(g, [t, gr, n], dtype, device, n ** -0.5),
            randn(g, [t, gr, n], dtype, device, n ** -0.5), randn(g, [h], torch.float32, device) + 1.0,
            randn(g, [h], torch.float32, device, 0.5) - 2.0)


def _state(g, shape, device):
    return randn(g, [shape["B"], shape["H"], shape["P"], shape["N"]], torch.float32, device, 0.3)


def _decode_inputs(shape, dtype, device, seed):
    g = generator(device, seed)
    return (*_ssd_args(g, shape, dtype, device, shape["B"]), _state(g, shape, device))


def _prefill_inputs(shape, dtype, device, seed):
    g = generator(device, seed)
    cu = _ragged(shape, device)
    return (*_ssd_args(g, shape, dtype, device, int(cu[-1])), _state(g, shape, device), cu)


def _conv_inputs(shape, dtype, device, seed):
    g = generator(device, seed)
    b, c, k = shape["B"], shape["C"], shape["K"]
    cu = _ragged(shape, device) if "chunk" in shape else None
    x = randn(g, [int(cu[-1]) if cu is not None else b, c], dtype, device)
    args = (x, randn(g, [b, c, k - 1], dtype, device), randn(g, [c, k], dtype, device, 0.5),
            randn(g, [c], dtype, device, 0.1))
    return args if cu is None else (*args, cu)


def _norm_inputs(shape, dtype, device, seed):
    g = generator(device, seed)
    t, i = shape["T"], shape["I"]
    return (randn(g, [t, i], dtype, device), randn(g, [t, i], dtype, device),
            randn(g, [i], dtype, device, 0.05) + 1.0, shape["G"], 1e-5)


def _mamba(spec) -> bool:
    return bool(getattr(spec, "hybrid_pattern", "")) and "M" in spec.hybrid_pattern


def _phase_shapes(phase: str, kind: str):
    def shapes(spec, point) -> list[dict]:
        if not _mamba(spec) or point.phase != phase:
            return []
        if kind == "conv":
            return [{**seq_shape(point), "C": spec.mamba_conv_dim, "K": spec.mamba_conv_kernel}]
        return [{**seq_shape(point), "H": spec.mamba_num_heads, "P": spec.mamba_head_dim, "N": spec.ssm_state_size,
                 "G": spec.mamba_n_groups}]
    return shapes


def _norm_shapes(spec, point) -> list[dict]:
    return [{"T": tokens(point), "I": spec.mamba_inner, "G": spec.mamba_n_groups}] if _mamba(spec) else []


_DOC = "shape dict: {'B', 'H', 'P', 'N', 'G'}"
OPS = [
    OpDef("ssd_decode", ssd_decode,
          "ssd_decode(x[B, H, P], dt[B, H], A_log[H] fp32, B[B, G, N], C[B, G, N], D[H] fp32, dt_bias[H] fp32, "
          "state[B, H, P, N] fp32) -> (y[B, H, P] x.dtype, new_state fp32): one Mamba-2 step per sequence: "
          "dt = softplus(dt + dt_bias), S = exp(-dt exp(A_log)) S + dt x B^T, y = S C + D x (head h reads group "
          "h // (H / G)). The new state is an output (inputs stay unchanged). " + _DOC,
          _decode_inputs, _phase_shapes("decode", "ssd"),
          ({"B": 3, "H": 4, "P": 8, "N": 16, "G": 2}, {"B": 1, "H": 3, "P": 5, "N": 7, "G": 1}),
          outputs=2, tolerances=dict(STATE_TOLERANCES)),
    OpDef("ssd_prefill", ssd_prefill,
          "ssd_prefill(x[T, H, P], dt[T, H], A_log[H], B[T, G, N], C[T, G, N], D[H], dt_bias[H], state[B, H, P, N] "
          "fp32, cu_seqlens_q[B+1] int32) -> (y[T, H, P], final_state[B, H, P, N] fp32): each sequence's tokens "
          "run through the Mamba-2 recurrence from state[b] (the SSD chunked scan). " + _DOC + " + 'chunk'",
          _prefill_inputs, _phase_shapes("prefill", "ssd"),
          ({"B": 2, "chunk": 70, "H": 4, "P": 8, "N": 16, "G": 2},
           {"B": 3, "chunk": 5, "H": 2, "P": 6, "N": 8, "G": 1}),
          outputs=2, tolerances=dict(STATE_TOLERANCES)),
    OpDef("mamba_conv_decode", mamba_conv_decode,
          "mamba_conv_decode(x[B, C], conv_state[B, C, K-1], weight[C, K], bias[C]) -> (silu(sum_j [conv_state | x]"
          "[:, :, j] weight[:, j] + bias) [B, C], new_conv_state[B, C, K-1] = the last K-1 inputs). shape dict: "
          "{'B', 'C', 'K'}",
          _conv_inputs, _phase_shapes("decode", "conv"), ({"B": 3, "C": 40, "K": 4}, {"B": 1, "C": 7, "K": 2}),
          outputs=2),
    OpDef("mamba_conv_prefill", mamba_conv_prefill,
          "mamba_conv_prefill(x[T, C], conv_state[B, C, K-1], weight[C, K], bias[C], cu_seqlens_q[B+1] int32) -> "
          "(y[T, C], new_conv_state[B, C, K-1]): the depthwise causal conv + bias + silu of each sequence's chunk "
          "after its K-1 previous inputs. shape dict: {'B', 'chunk', 'C', 'K'}",
          _conv_inputs, _phase_shapes("prefill", "conv"), ({"B": 3, "chunk": 6, "C": 24, "K": 4},),
          outputs=2, tolerances=dict(MATMUL_TOLERANCES)),
    OpDef("mamba_gated_norm", mamba_gated_norm,
          "mamba_gated_norm(y[T, I], z[T, I], weight[I], groups, eps) -> [T, I] y.dtype: weight * rms_norm of "
          "y * silu(z) over each of ``groups`` contiguous groups (HF Zamba2RMSNormGated). shape dict: {'T', 'I', 'G'}",
          _norm_inputs, _norm_shapes, ({"T": 5, "I": 24, "G": 2}, {"T": 3, "I": 16, "G": 1}),
          tolerances=dict(DEFAULT_TOLERANCES)),
]
