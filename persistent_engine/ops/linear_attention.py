"""Gated delta rule linear attention (Qwen3.5 / Qwen3-Next Gated DeltaNet) and its short causal convolution.

The math (per value head, state S[Dk, Dv] fp32, decay g <= 0 in log space, write strength beta in (0, 1)):
    S_t = exp(g_t) S_{t-1};   u_t = beta_t (v_t - S_t^T k_t);   S_t = S_t + k_t u_t^T;   o_t = S_t^T q_t
with q, k L2-normalised (eps 1e-6) and q scaled by Dk^-1/2. Sources: Hugging Face transformers
``modeling_qwen3_5_moe.py`` (Apache-2.0: ``torch_recurrent_gated_delta_rule``, ``torch_chunk_gated_delta_rule``,
``causal_conv1d_update``/``causal_conv1d_fn``, ``Qwen3_5MoeGatedDeltaNet``, ``Qwen3_5MoeRMSNormGated``) and the
flash-linear-attention ``fused_recurrent_gated_delta_rule`` / ``chunk_gated_delta_rule`` API it mirrors. Each
key head serves Hv/Hk consecutive value heads (HF ``repeat_interleave``).

The core, for reuse by other delta-rule layers (Kimi delta attention has a per-channel decay):
  ``recurrent_gated_delta(q, k, v, g, beta, state)``  token by token (the decode form)
  ``chunk_gated_delta(q, k, v, g, beta, state, chunk)`` chunk-parallel (the prefill form): an independent
      formulation (a unit-lower-triangular solve per chunk for the corrected values u, derived here), tested
      against the recurrent one. Both take q, k [L, H, Dk], v [L, H, Dv], beta [L, H] (fp32; q, k already
      normalised and scaled), g [L, H] (one decay per head) or [L, H, Dk] (one per key channel), state
      [H, Dk, Dv]; both return (o [L, H, Dv], final state [H, Dk, Dv]) in fp32.

Ops (pure: the new recurrent and conv states are outputs, so verification compares them like any output):
  causal_conv1d_decode, causal_conv1d_prefill, gdn_gating, gated_delta_decode, gated_delta_prefill,
  gated_rms_norm, sigmoid_gate.
Costs per decode token and value head: the state is read and written once (2 Dk Dv x 4 bytes), ~6 Dk Dv FLOPs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from persistent_engine.ops.basic import _acc
from persistent_engine.ops.opdef import (DEFAULT_TOLERANCES, MATMUL_TOLERANCES, OpDef, dedup, generator, randn,
                                         seq_shape, tokens)

L2_EPS = 1e-6
# the recurrent state accumulates over tokens: bf16 inputs get matmul-level slack on outputs and states
STATE_TOLERANCES = {torch.float32: (2e-4, 2e-4), torch.float16: (1e-2, 1e-2), torch.bfloat16: (3e-2, 3e-2)}


# ----------------------------------------------------------------------------- the delta-rule core
def l2norm(x: torch.Tensor, eps: float = L2_EPS) -> torch.Tensor:
    """x / sqrt(sum x^2 + eps) over the last dim (FLA / HF ``l2norm``)."""
    return x * torch.rsqrt((x * x).sum(-1, keepdim=True) + eps)


def _decay(g: torch.Tensor) -> torch.Tensor:
    """g [L, H] or [L, H, Dk] -> [L, H, Dk or 1] (broadcasts over the key channels)."""
    return g.unsqueeze(-1) if g.dim() == 2 else g


def recurrent_gated_delta(q, k, v, g, beta, state):
    """Token-by-token gated delta rule; see the module doc. Cost per token and head: ~6 Dk Dv FLOPs."""
    s = state.clone()
    gd = _decay(g)
    out = torch.empty(q.shape[0], v.shape[1], v.shape[2], dtype=s.dtype, device=s.device)
    for t in range(q.shape[0]):
        s = s * gd[t].exp().unsqueeze(-1)                                 # [H, Dk, Dv] * [H, Dk|1, 1]
        u = beta[t].unsqueeze(-1) * (v[t] - torch.einsum("hk,hkv->hv", k[t], s))
        s = s + k[t].unsqueeze(-1) * u.unsqueeze(-2)
        out[t] = torch.einsum("hk,hkv->hv", q[t], s)
    return out, s


def chunk_gated_delta(q, k, v, g, beta, state, chunk: int = 64):
    """Chunk-parallel gated delta rule. Within a chunk with cumulative decay G_i = sum_{t<=i} g_t and
    D_ij = exp(G_i - G_j) (j <= i, per channel):
        (I + A) U = beta (V - (e^G K) S0),  A_ij = beta_i k_i^T diag(D_ij) k_j  (j < i)
        O = (e^G Q) S0 + [q_i^T diag(D_ij) k_j]_{j<=i} U,   S = e^{G_c} S0 + sum_j diag(D_cj) k_j u_j^T
    Cost per chunk and head: ~c^2 (2 Dk + Dv) + 4 c Dk Dv FLOPs."""
    s = state.clone()
    gd = _decay(g)
    out = torch.empty(q.shape[0], v.shape[1], v.shape[2], dtype=s.dtype, device=s.device)
    for c0 in range(0, q.shape[0], chunk):
        c1 = min(q.shape[0], c0 + chunk)
        qc, kc, vc, bc = q[c0:c1], k[c0:c1], v[c0:c1], beta[c0:c1]
        gc = gd[c0:c1].cumsum(0)                                          # [c, H, Dk|1]
        n = c1 - c0
        causal = torch.ones(n, n, dtype=torch.bool, device=q.device).tril()
        rel = (gc[:, None] - gc[None, :]).masked_fill(~causal[:, :, None, None], float("-inf")).exp()  # [c, c, H, .]
        kk = torch.einsum("ihd,jhd,ijhd->hij", kc, kc, rel.expand(n, n, *kc.shape[1:]))
        a = (bc.t().unsqueeze(-1) * kk).tril(-1)                         # [H, c, c] strictly lower
        eg = gc.exp()
        rhs = bc.t().unsqueeze(-1) * (vc.transpose(0, 1) - torch.einsum("chd,hde->hce", eg * kc, s))
        eye = torch.eye(n, dtype=s.dtype, device=s.device)
        u = torch.linalg.solve_triangular(eye + a, rhs, upper=False, unitriangular=True)      # [H, c, Dv]
        qk = torch.einsum("ihd,jhd,ijhd->hij", qc, kc, rel.expand(n, n, *qc.shape[1:]))
        o = torch.einsum("chd,hde->hce", eg * qc, s) + qk @ u
        out[c0:c1] = o.transpose(0, 1)
        tail = (gc[-1:] - gc).exp()                                       # [c, H, .]: decay from j to the chunk end
        s = gc[-1].exp().unsqueeze(-1) * s + torch.einsum("jhd,jhe->hde", tail * kc, u.transpose(0, 1))
    return out, s


def _prepare(q, k, v, g, beta, state):
    """q, k, v, g, beta, state in one accumulation dtype (fp32, fp64 when any input is), q and k L2-normalised
    (q scaled by Dk^-1/2) and repeated to the value heads."""
    ct = torch.promote_types(torch.promote_types(q.dtype, state.dtype), torch.float32)
    rep = v.shape[-2] // k.shape[-2]
    qf = l2norm(q.to(ct)) * q.shape[-1] ** -0.5
    kf = l2norm(k.to(ct))
    if rep > 1:
        qf, kf = qf.repeat_interleave(rep, dim=-2), kf.repeat_interleave(rep, dim=-2)
    return qf, kf, v.to(ct), g.to(ct), beta.to(ct), state.to(ct)


# ----------------------------------------------------------------------------- ops
def gated_delta_decode(q, k, v, g, beta, state):
    """One token per sequence: q, k [B, Hk, Dk], v [B, Hv, Dv], g, beta [B, Hv] fp32, state [B, Hv, Dk, Dv]
    fp32 -> (o [B, Hv, Dv] in v's dtype, new state [B, Hv, Dk, Dv] fp32)."""
    qf, kf, vf, gf, bf, s = _prepare(q, k, v, g, beta, state)
    s = s * gf.exp()[..., None, None]
    u = bf.unsqueeze(-1) * (vf - torch.einsum("bhk,bhkv->bhv", kf, s))
    s = s + kf.unsqueeze(-1) * u.unsqueeze(-2)
    o = torch.einsum("bhk,bhkv->bhv", qf, s)
    return o.to(v.dtype), s.to(state.dtype)


def gated_delta_prefill(q, k, v, g, beta, state, cu_seqlens_q):
    """A ragged chunk per sequence (tokens cu_seqlens_q[b]:cu_seqlens_q[b+1]) on top of its state: q, k
    [T, Hk, Dk], v [T, Hv, Dv], g, beta [T, Hv] fp32, state [B, Hv, Dk, Dv] fp32 -> (o [T, Hv, Dv],
    final states [B, Hv, Dk, Dv]). Chunk-parallel (64 tokens); reads cu_seqlens on the host."""
    qf, kf, vf, gf, bf, sf = _prepare(q, k, v, g, beta, state)
    out = torch.empty(v.shape, dtype=v.dtype, device=v.device)
    new = state.clone()
    cu = cu_seqlens_q.tolist()
    for b in range(len(cu) - 1):
        s0, s1 = cu[b], cu[b + 1]
        if s1 > s0:
            o, st = chunk_gated_delta(qf[s0:s1], kf[s0:s1], vf[s0:s1], gf[s0:s1], bf[s0:s1], sf[b])
            out[s0:s1], new[b] = o.to(v.dtype), st.to(state.dtype)
    return out, new


def causal_conv1d_decode(x, conv_state, weight):
    """x [B, C] (this token), conv_state [B, C, K-1] (the previous K-1 inputs, oldest first), weight [C, K]
    -> (silu(depthwise conv) [B, C] in x's dtype, new conv_state [B, C, K-1])."""
    win = torch.cat([_acc(conv_state), _acc(x).unsqueeze(-1)], dim=-1)            # [B, C, K]
    y = F.silu((win * _acc(weight)).sum(-1))
    return y.to(x.dtype), win[..., 1:].to(conv_state.dtype)


def causal_conv1d_prefill(x, conv_state, weight, cu_seqlens_q):
    """x [T, C] ragged by cu_seqlens_q [B+1], conv_state [B, C, K-1], weight [C, K] -> (y [T, C], new
    conv_state [B, C, K-1]): each sequence's chunk convolved after its K-1 previous inputs."""
    kk = weight.shape[1]
    y = torch.empty_like(x)
    new = conv_state.clone()
    cu = cu_seqlens_q.tolist()
    for b in range(len(cu) - 1):
        s0, s1 = cu[b], cu[b + 1]
        if s1 == s0:
            continue
        seq = torch.cat([_acc(conv_state[b]), _acc(x[s0:s1]).t()], dim=-1)         # [C, K-1+L]
        y[s0:s1] = F.silu(F.conv1d(seq[None], _acc(weight)[:, None], groups=seq.shape[0])[0]).t().to(x.dtype)
        new[b] = seq[:, -(kk - 1):].to(conv_state.dtype) if kk > 1 else new[b]
    return y, new


def gdn_gating(a, b, a_log, dt_bias):
    """a, b [T, Hv] (projections), a_log, dt_bias [Hv] fp32 -> (g = -exp(A_log) softplus(a + dt_bias),
    beta = sigmoid(b)), both [T, Hv] fp32."""
    g = -_acc(a_log).exp() * F.softplus(_acc(a) + _acc(dt_bias))
    return g, torch.sigmoid(_acc(b))


def gated_rms_norm(x, z, weight, eps: float):
    """HF Qwen3_5MoeRMSNormGated over the last dim: (w * rms_norm(x).to(dtype)) * silu(z) -> x's dtype."""
    xf = _acc(x)
    h = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
    return (_acc(weight * h) * F.silu(_acc(z))).to(x.dtype)


def sigmoid_gate(x, gate):
    """x * sigmoid(gate) (gate broadcast: [T, N] or [T, 1]) in x's dtype: the gated attention output and the
    shared expert's gate."""
    return (_acc(x) * torch.sigmoid(_acc(gate))).to(x.dtype)


# ----------------------------------------------------------------------------- inputs and shapes
def _qkv(g, shape, dtype, device, t):
    hk, hv, dk, dv = shape["Hk"], shape["Hv"], shape["Dk"], shape["Dv"]
    return (randn(g, [t, hk, dk], dtype, device), randn(g, [t, hk, dk], dtype, device), randn(g, [t, hv, dv], dtype, device),
            # decays mostly in [-1, 0] (HF: -exp(A_log) softplus(a + dt_bias)), write strengths in (0, 1)
            -(randn(g, [t, hv], torch.float32, device, 0.5) - 1.0).exp(),
            torch.sigmoid(randn(g, [t, hv], torch.float32, device)))


def _state(g, shape, device):
    return randn(g, [shape["B"], shape["Hv"], shape["Dk"], shape["Dv"]], torch.float32, device, 0.3)


def _decode_inputs(shape, dtype, device, seed):
    g = generator(device, seed)
    return (*_qkv(g, shape, dtype, device, shape["B"]), _state(g, shape, device))


def _ragged(shape, device):
    """cu_seqlens [B+1] int32 for B sequences of about ``chunk`` tokens (odd lengths: chunk, chunk - 1, ...)."""
    lens = [max(1, shape["chunk"] - (b % 3)) for b in range(shape["B"])]
    cu = [0]
    for n in lens:
        cu.append(cu[-1] + n)
    return torch.tensor(cu, dtype=torch.int32, device=device)


def _prefill_inputs(shape, dtype, device, seed):
    g = generator(device, seed)
    cu = _ragged(shape, device)
    return (*_qkv(g, shape, dtype, device, int(cu[-1])), _state(g, shape, device), cu)


def _conv_decode_inputs(shape, dtype, device, seed):
    g = generator(device, seed)
    b, c, k = shape["B"], shape["C"], shape["K"]
    return (randn(g, [b, c], dtype, device), randn(g, [b, c, k - 1], dtype, device),
            randn(g, [c, k], dtype, device, 0.5))


def _conv_prefill_inputs(shape, dtype, device, seed):
    g = generator(device, seed)
    cu = _ragged(shape, device)
    b, c, k = shape["B"], shape["C"], shape["K"]
    return (randn(g, [int(cu[-1]), c], dtype, device), randn(g, [b, c, k - 1], dtype, device),
            randn(g, [c, k], dtype, device, 0.5), cu)


def _gating_inputs(shape, dtype, device, seed):
    g = generator(device, seed)
    t, h = shape["T"], shape["H"]
    return (randn(g, [t, h], dtype, device), randn(g, [t, h], dtype, device),
            randn(g, [h], torch.float32, device, 0.5) - 2.0, randn(g, [h], torch.float32, device, 0.05) + 1.0)


def _norm_inputs(shape, dtype, device, seed):
    g = generator(device, seed)
    t, h, d = shape["T"], shape["H"], shape["D"]
    return (randn(g, [t, h, d], dtype, device), randn(g, [t, h, d], dtype, device),
            randn(g, [d], dtype, device, 0.05) + 1.0, 1e-6)


def _gate_inputs(shape, dtype, device, seed):
    g = generator(device, seed)
    return randn(g, [shape["T"], shape["N"]], dtype, device), randn(g, [shape["T"], shape["G"]], dtype, device)


def _dims(spec) -> dict:
    return {"Hk": spec.linear_num_k_heads, "Hv": spec.linear_num_v_heads, "Dk": spec.linear_k_dim,
            "Dv": spec.linear_v_dim}


def _phase_shapes(phase: str, kind: str):
    def shapes(spec, point) -> list[dict]:
        if not spec.linear_layers or point.phase != phase:
            return []
        if kind == "conv":
            return [{**seq_shape(point), "C": spec.linear_conv_dim, "K": spec.linear_conv_kernel}]
        return [{**seq_shape(point), **_dims(spec)}]
    return shapes


def _per_token_shapes(what: str):
    def shapes(spec, point) -> list[dict]:
        t = tokens(point)
        if what == "gate":
            out = [{"T": t, "N": spec.num_heads * spec.head_dim, "G": spec.num_heads * spec.head_dim}] \
                if spec.attn_output_gate else []
            return dedup(out + ([{"T": t, "N": spec.hidden_size, "G": 1}] if spec.shared_expert_gate else []))
        if not spec.linear_layers:
            return []
        if what == "gating":
            return [{"T": t, "H": spec.linear_num_v_heads}]
        return [{"T": t, "H": spec.linear_num_v_heads, "D": spec.linear_v_dim}]
    return shapes


_SHAPE_DOC = "shape dict: {'B', 'Hk', 'Hv', 'Dk', 'Dv'}"
OPS = [
    OpDef("gated_delta_decode", gated_delta_decode,
          "gated_delta_decode(q[B, Hk, Dk], k[B, Hk, Dk], v[B, Hv, Dv], g[B, Hv] fp32, beta[B, Hv] fp32, state[B, Hv, "
          "Dk, Dv] fp32) -> (o[B, Hv, Dv] v.dtype, new_state[B, Hv, Dk, Dv] fp32): one gated delta rule step per "
          "sequence (q, k L2-normalised, q scaled by Dk^-1/2; key head j serves value heads j*Hv/Hk..). The new "
          "state is an output (inputs stay unchanged). " + _SHAPE_DOC,
          _decode_inputs, _phase_shapes("decode", "delta"),
          ({"B": 3, "Hk": 2, "Hv": 4, "Dk": 16, "Dv": 8}, {"B": 1, "Hk": 1, "Hv": 1, "Dk": 12, "Dv": 20}),
          outputs=2, tolerances=dict(STATE_TOLERANCES)),
    OpDef("gated_delta_prefill", gated_delta_prefill,
          "gated_delta_prefill(q[T, Hk, Dk], k[T, Hk, Dk], v[T, Hv, Dv], g[T, Hv] fp32, beta[T, Hv] fp32, state[B, Hv, "
          "Dk, Dv] fp32, cu_seqlens_q[B+1] int32) -> (o[T, Hv, Dv], final_state[B, Hv, Dk, Dv] fp32): each sequence's "
          "tokens cu_seqlens_q[b]:cu_seqlens_q[b+1] run through the gated delta rule from state[b]. " + _SHAPE_DOC
          + " + 'chunk'",
          _prefill_inputs, _phase_shapes("prefill", "delta"),
          ({"B": 2, "chunk": 70, "Hk": 1, "Hv": 2, "Dk": 8, "Dv": 8}, {"B": 3, "chunk": 5, "Hk": 2, "Hv": 2, "Dk": 16, "Dv": 12}),
          outputs=2, tolerances=dict(STATE_TOLERANCES)),
    OpDef("causal_conv1d_decode", causal_conv1d_decode,
          "causal_conv1d_decode(x[B, C], conv_state[B, C, K-1], weight[C, K]) -> (silu(sum_j [conv_state | x][:, :, j] "
          "weight[:, j]) [B, C], new_conv_state[B, C, K-1] = the last K-1 inputs). shape dict: {'B', 'C', 'K'}",
          _conv_decode_inputs, _phase_shapes("decode", "conv"), ({"B": 3, "C": 40, "K": 4}, {"B": 1, "C": 7, "K": 2}),
          outputs=2),
    OpDef("causal_conv1d_prefill", causal_conv1d_prefill,
          "causal_conv1d_prefill(x[T, C], conv_state[B, C, K-1], weight[C, K], cu_seqlens_q[B+1] int32) -> (y[T, C], "
          "new_conv_state[B, C, K-1]): the depthwise causal conv (+ silu) of each sequence's chunk after its K-1 "
          "previous inputs. shape dict: {'B', 'chunk', 'C', 'K'}",
          _conv_prefill_inputs, _phase_shapes("prefill", "conv"), ({"B": 3, "chunk": 6, "C": 24, "K": 4},),
          outputs=2, tolerances=dict(MATMUL_TOLERANCES)),
    OpDef("gdn_gating", gdn_gating,
          "gdn_gating(a[T, H], b[T, H], A_log[H] fp32, dt_bias[H] fp32) -> (g = -exp(A_log) softplus(a + dt_bias), "
          "beta = sigmoid(b)) fp32 [T, H]. shape dict: {'T', 'H'}",
          _gating_inputs, _per_token_shapes("gating"), ({"T": 5, "H": 6},), outputs=2),
    OpDef("gated_rms_norm", gated_rms_norm,
          "gated_rms_norm(x[T, H, D], z[T, H, D], weight[D], eps) -> [T, H, D] x.dtype: (weight * rms_norm(x)) * "
          "silu(z) (HF Qwen3_5MoeRMSNormGated). shape dict: {'T', 'H', 'D'}",
          _norm_inputs, _per_token_shapes("norm"), ({"T": 5, "H": 3, "D": 16},), tolerances=dict(DEFAULT_TOLERANCES)),
    OpDef("sigmoid_gate", sigmoid_gate,
          "sigmoid_gate(x[T, N], gate[T, N] | [T, 1]) -> x * sigmoid(gate) [T, N] x.dtype. shape dict: {'T', 'N', 'G'}",
          _gate_inputs, _per_token_shapes("gate"), ({"T": 5, "N": 24, "G": 24}, {"T": 3, "N": 16, "G": 1})),
]
