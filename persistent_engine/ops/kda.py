"""Kimi delta attention (KDA: Kimi-Linear, Kimi-K3) and the other pieces of Kimi-K3's layers.

KDA is a gated delta rule with a per-channel decay. Per head (K = key dim, V = value dim), with
the recurrent state S [K, V] of each sequence (sources: flash-linear-attention ``fla/ops/kda/naive.py``
``naive_recurrent_kda`` / ``naive_chunk_kda`` and ``fla/ops/kda/gate.py``; Moonshot's
``modeling_kimi_linear.py`` ``KimiDeltaAttention.forward``, which calls them with
``use_qk_l2norm_in_kernel``, ``use_gate_in_kernel``, ``use_beta_sigmoid_in_kernel`` and the "safe gate"):
  g_t   = lower_bound * sigmoid(exp(A_log[h]) * (f_t + dt_bias))      (safe gate, K3: lower_bound -5)
        | -exp(A_log[h]) * softplus(f_t + dt_bias)                     (no lower bound, Kimi-Linear)
  q, k  = l2norm(q), l2norm(k) (eps 1e-6);  beta_t = sigmoid(b_t);  scale = K^-1/2
  S_t   = diag(exp(g_t)) S_{t-1};  S_t += beta_t k_t (v_t - k_t^T S_t)^T;  o_t = scale q_t^T S_t
``kda_decode`` is one step (state in, state out); ``kda_prefill`` runs each sequence's chunk from its
state; its reference is the chunked-parallel (WY) form, tested against ``kda_recurrent`` (the loop above).
Cost per token and head: ~6 K V FLOPs, and the decode step reads and writes the fp32 state (8 K V bytes).

The short convolution before it (FLA ``ShortConvolution``, activation silu) is causal and depthwise over
the W last inputs of each channel; decode keeps the last W - 1 inputs per sequence (``conv_state``).
Ops are pure: states come in as arguments and the new states are outputs (so verification compares them:
a candidate that corrupts the state fails even when this step's output is right).

Also here (Kimi-K3, Moonshot's modeling code): ``situ_and_mul`` (SiTU-GLU), ``moe_experts_situ``,
``rms_norm_gated`` (KDA's o_norm: rms_norm(o) w sigmoid(gate)), ``sigmoid_mul`` (the gated MLA's output
gate) and ``attn_res`` (attention residuals: a softmax over the block summaries of the residual stream).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from persistent_engine.ops.basic import _acc
from persistent_engine.ops.moe import _experts_fit, _experts_inputs, experts_check_bytes, experts_forward
from persistent_engine.ops.opdef import (DEFAULT_TOLERANCES, MATMUL_TOLERANCES, OpDef, generator, randn, seq_shape,
                                         tokens)

L2NORM_EPS = 1e-6           # FLA l2norm_fwd
REF_CHUNK = 16              # tokens per chunk of the chunked reference (any size gives the same numbers)
# the state accumulates over the whole context: a little looser than a matmul
KDA_TOLERANCES = {torch.float32: (5e-4, 5e-4), torch.float16: (2e-2, 2e-2), torch.bfloat16: (5e-2, 4e-2)}


# ----------------------------------------------------------------------------- gate, norms, activations
def kda_gate(f: torch.Tensor, a_log: torch.Tensor, dt_bias: torch.Tensor, lower_bound: float | None,
             acc: torch.dtype) -> torch.Tensor:
    """Log-space decay g [..., H, K] (<= 0) from the forget-gate projection f [..., H, K] (FLA gate.py)."""
    h, k = f.shape[-2], f.shape[-1]
    x = f.to(acc) + dt_bias.to(acc).view(h, k)
    a = a_log.to(acc).exp().view(h, 1)
    if lower_bound is not None:
        return float(lower_bound) * torch.sigmoid(a * x)
    return -a * F.softplus(x)


def _l2norm(x: torch.Tensor) -> torch.Tensor:
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + L2NORM_EPS)


def _prepare(q, k, v, f, b, a_log, dt_bias, lower_bound, acc):
    """(scaled normed q, normed k, v, log decay g, beta) in ``acc``."""
    scale = q.shape[-1] ** -0.5
    return (_l2norm(q.to(acc)) * scale, _l2norm(k.to(acc)), v.to(acc),
            kda_gate(f, a_log, dt_bias, lower_bound, acc), torch.sigmoid(b.to(acc)))


def situ_and_mul(x: torch.Tensor, beta: float, linear_beta: float | None) -> torch.Tensor:
    """x[..., 2I] (gate | up) -> beta tanh(gate / beta) sigmoid(gate) * up' [..., I], up' = linear_beta
    tanh(up / linear_beta) when linear_beta is set (Moonshot's ``SituAndMul``), in fp32, x's dtype."""
    i = x.shape[-1] // 2
    gate, up = _acc(x[..., :i]), _acc(x[..., i:])
    a = beta * torch.tanh(gate / beta) * torch.sigmoid(gate)
    if linear_beta is not None:
        up = linear_beta * torch.tanh(up / linear_beta)
    return (a * up).to(x.dtype)


def moe_experts_situ(x, w13, w2, topk_weights, topk_ids, beta: float, linear_beta: float | None) -> torch.Tensor:
    """moe_experts with situ_and_mul in place of silu_and_mul (Kimi-K3's routed experts)."""
    return experts_forward(x, w13, w2, topk_weights, topk_ids, lambda h: situ_and_mul(h, beta, linear_beta))


def rms_norm_gated(x: torch.Tensor, gate: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """rms_norm(x) * weight * sigmoid(gate) over the last dim (FLA FusedRMSNormGated, activation sigmoid)."""
    xf = _acc(x)
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * weight.to(xf.dtype)
    return (y * torch.sigmoid(gate.to(xf.dtype))).to(x.dtype)


def sigmoid_mul(x: torch.Tensor, gate: torch.Tensor) -> torch.Tensor:
    """x * sigmoid(gate) (Kimi-K3's MLA output gate, before o_proj)."""
    return (_acc(x) * torch.sigmoid(_acc(gate))).to(x.dtype)


def attn_res(prefix: torch.Tensor, blocks: torch.Tensor, proj_w: torch.Tensor, norm_w: torch.Tensor,
             eps: float) -> torch.Tensor:
    """Attention residuals: sources v = [blocks[T, NB, H] | prefix[T, H]]; scores = rms(v) . (norm_w * proj_w);
    out = softmax(scores) @ v (the unnormed sources) -> [T, H]. Moonshot's ``_apply_attn_res``."""
    v = torch.cat([_acc(blocks), _acc(prefix)[:, None]], dim=1)                  # [T, NB + 1, H]
    kn = v * torch.rsqrt(v.pow(2).mean(-1, keepdim=True) + eps)
    scores = (kn * (norm_w.to(v.dtype) * proj_w.to(v.dtype))).sum(-1)          # [T, NB + 1]
    return torch.einsum("tb,tbh->th", scores.softmax(-1), v).to(prefix.dtype)


# ----------------------------------------------------------------------------- short convolution
def short_conv_decode(x: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor):
    """x[B, D], conv_state[B, D, W-1] (previous inputs, oldest first), weight[D, W] -> (silu(conv)[B, D],
    new conv_state[B, D, W-1])."""
    win = torch.cat([conv_state.to(x.dtype), x[:, :, None]], dim=-1)                # [B, D, W]
    y = F.silu((_acc(win) * _acc(weight)[None]).sum(-1))
    return y.to(x.dtype), win[:, :, 1:].to(conv_state.dtype)


def short_conv_prefill(x: torch.Tensor, conv_state: torch.Tensor, weight: torch.Tensor, cu_seqlens: torch.Tensor):
    """x[T, D] (sequences packed by cu_seqlens[B+1]), conv_state[B, D, W-1], weight[D, W] -> (silu(causal conv)
    [T, D], each sequence's last W-1 inputs [B, D, W-1])."""
    w = weight.shape[-1]
    cu = cu_seqlens.tolist()
    ys, states = [], []
    for b in range(len(cu) - 1):
        xs = torch.cat([conv_state[b].t().to(x.dtype), x[cu[b]:cu[b + 1]]], dim=0)   # [W-1+n, D]
        win = _acc(xs).unfold(0, w, 1)                                            # [n, D, W]
        ys.append(F.silu((win * _acc(weight)[None]).sum(-1)).to(x.dtype))
        states.append(xs[-(w - 1):].t())
    return torch.cat(ys, 0), torch.stack(states, 0).to(conv_state.dtype)


# ----------------------------------------------------------------------------- the delta rule
def kda_recurrent(q, k, v, g, beta, state):
    """The token loop: q, k [B, T, H, K] (q scaled), v [B, T, H, V], g [B, T, H, K] log decay, beta [B, T, H],
    state [B, H, K, V] -> (o [B, T, H, V], final state)."""
    s = state.clone()
    o = torch.empty(*v.shape, dtype=s.dtype, device=v.device)
    for t in range(q.shape[1]):
        s = s * g[:, t].exp()[..., None]
        kt = k[:, t]
        u = beta[:, t][..., None] * (v[:, t] - torch.einsum("bhk,bhkv->bhv", kt, s))
        s = s + kt[..., None] * u[..., None, :]
        o[:, t] = torch.einsum("bhk,bhkv->bhv", q[:, t], s)
    return o, s


def kda_chunked(q, k, v, g, beta, state, chunk: int = REF_CHUNK):
    """The chunked-parallel (WY) form of ``kda_recurrent`` (FLA naive_chunk_kda), same arguments. Within a
    chunk of C tokens with cumulative decays G: A = (I + L)^-1 diag(beta), L[c, j] = beta_c k_c . (k_j
    e^(G_c - G_j)) (j < c); w = A (e^G k), u = A v; per chunk: v' = u - w S, o = (q e^G) S + Aqk v',
    S <- e^(G_last) S + (e^(G_last - G) k)^T v'. Zero padding past T leaves the state unchanged."""
    b, t, h, kd = q.shape
    pad = (-t) % chunk
    if pad:
        q, k, v, g, beta = (F.pad(x, (0, 0) * (x.dim() - 2) + (0, pad)) for x in (q, k, v, g, beta))
    n = (t + pad) // chunk

    def heads_first(x):                           # [B, T, H, ...] -> [B, H, N, C, ...]
        return x.reshape(b, n, chunk, h, *x.shape[3:]).movedim(3, 1)
    q, k, v, g, beta = map(heads_first, (q, k, v, g, beta))
    gc = g.cumsum(-2)                                                             # [B, H, N, C, K]
    akk = q.new_empty(*q.shape[:-1], chunk)                                       # [B, H, N, C(c), C(j)]
    aqk = torch.empty_like(akk)
    for j in range(chunk):        # column j: k_j against every token of its chunk, decayed from j (<= 1 for c >= j)
        kj = k[..., j:j + 1, :] * (gc - gc[..., j:j + 1, :]).clamp(max=0).exp()  # [B, H, N, C, K]
        akk[..., j], aqk[..., j] = (k * kj).sum(-1), (q * kj).sum(-1)
    lower = torch.tril(torch.ones(chunk, chunk, dtype=torch.bool, device=q.device), -1)
    eye = torch.eye(chunk, dtype=q.dtype, device=q.device)
    akk = akk.masked_fill(~lower, 0) * beta[..., None]
    a = torch.linalg.solve_triangular(eye + akk, torch.diag_embed(beta), upper=False)
    w, u = a @ (gc.exp() * k), a @ v
    aqk = aqk.masked_fill(~(lower | eye.bool()), 0)
    s = state.clone()
    o = torch.empty_like(v)
    for i in range(n):
        vi = u[:, :, i] - w[:, :, i] @ s
        o[:, :, i] = (q[:, :, i] * gc[:, :, i].exp()) @ s + aqk[:, :, i] @ vi
        last = gc[:, :, i, -1]                                                    # [B, H, K]
        s = s * last.exp()[..., None] + ((last[:, :, None] - gc[:, :, i]).exp() * k[:, :, i]).transpose(-1, -2) @ vi
    return o.movedim(1, 3).reshape(b, n * chunk, h, -1)[:, :t], s


def kda_decode(q, k, v, f, b, a_log, dt_bias, lower_bound, state):
    acc = torch.promote_types(state.dtype, torch.float32)
    qn, kn, vf, g, beta = _prepare(q, k, v, f, b, a_log, dt_bias, lower_bound, acc)
    s = state.to(acc) * g.exp()[..., None]                                        # [B, H, K, V]
    u = beta[..., None] * (vf - torch.einsum("bhk,bhkv->bhv", kn, s))
    s = s + kn[..., None] * u[..., None, :]
    o = torch.einsum("bhk,bhkv->bhv", qn, s)
    return o.to(v.dtype), s.to(state.dtype)


def kda_prefill(q, k, v, f, b, a_log, dt_bias, lower_bound, state, cu_seqlens, form=kda_chunked):
    acc = torch.promote_types(state.dtype, torch.float32)
    qn, kn, vf, g, beta = _prepare(q, k, v, f, b, a_log, dt_bias, lower_bound, acc)
    cu = cu_seqlens.tolist()
    lens = [cu[i + 1] - cu[i] for i in range(len(cu) - 1)]
    tmax = max(lens)

    def padded(x):                                # packed [T, ...] -> [B, Tmax, ...] zero padded
        out = x.new_zeros(len(lens), tmax, *x.shape[1:])
        for i, n in enumerate(lens):
            out[i, :n] = x[cu[i]:cu[i + 1]]
        return out
    o, s = form(*map(padded, (qn, kn, vf, g, beta)), state.to(acc))
    return torch.cat([o[i, :n] for i, n in enumerate(lens)], 0).to(v.dtype), s.to(state.dtype)


# ----------------------------------------------------------------------------- inputs and shapes
def _kda_inputs(phase: str):
    def make(shape, dtype, device, seed):
        gen = generator(device, seed)
        bsz, h, kd, vd = shape["B"], shape["H"], shape["K"], shape["V"]
        t = bsz if phase == "decode" else bsz * shape["chunk"]
        lead = [t, h]
        args = (randn(gen, lead + [kd], dtype, device), randn(gen, lead + [kd], dtype, device),
                randn(gen, lead + [vd], dtype, device), randn(gen, lead + [kd], dtype, device, 2.0),
                randn(gen, lead, dtype, device, 2.0), randn(gen, [h], torch.float32, device, 0.5),
                randn(gen, [h * kd], torch.float32, device, 0.5), shape.get("lb", -5.0),
                randn(gen, [bsz, h, kd, vd], torch.float32, device, 0.3))
        if phase == "decode":
            return args
        return args + (torch.arange(0, bsz + 1, dtype=torch.int32, device=device) * shape["chunk"],)
    return make


def _kda_shapes(phase: str):
    def shapes(spec, point) -> list[dict]:
        if not any(getattr(spec, "kda_layers", ())) or point.phase != phase:
            return []
        return [{**seq_shape(point), "H": spec.kda_num_heads, "K": spec.kda_head_dim, "V": spec.kda_head_dim,
                 "lb": spec.kda_gate_lower_bound}]
    return shapes


def _conv_inputs(phase: str):
    def make(shape, dtype, device, seed):
        gen = generator(device, seed)
        bsz, d, w = shape["B"], shape["D"], shape["W"]
        t = bsz if phase == "decode" else bsz * shape["chunk"]
        args = (randn(gen, [t, d], dtype, device), randn(gen, [bsz, d, w - 1], dtype, device),
                randn(gen, [d, w], dtype, device, w ** -0.5))
        if phase == "decode":
            return args
        return args + (torch.arange(0, bsz + 1, dtype=torch.int32, device=device) * shape["chunk"],)
    return make


def _conv_shapes(phase: str):
    def shapes(spec, point) -> list[dict]:
        if not any(getattr(spec, "kda_layers", ())) or point.phase != phase:
            return []
        return [{**seq_shape(point), "D": 3 * spec.kda_num_heads * spec.kda_head_dim, "W": spec.kda_conv_size}]
    return shapes


def _situ(spec) -> bool:
    return getattr(spec, "mlp_act", "") == "situ"


def _situ_inputs(shape, dtype, device, seed):
    g = generator(device, seed)
    return randn(g, shape["x"], dtype, device, 8.0), shape.get("beta", 4.0), shape.get("lbeta", 25.0)


def _situ_shapes(spec, point) -> list[dict]:
    if not _situ(spec):
        return []
    t, lb = tokens(point), spec.situ_linear_beta
    widths = {2 * spec.intermediate_size, 2 * spec.shared_intermediate_size * spec.num_shared_experts}
    return [{"x": [t, w], "beta": spec.situ_beta, "lbeta": lb} for w in sorted(widths) if w]


def _situ_experts_inputs(shape, dtype, device, seed):
    return _experts_inputs(shape, dtype, device, seed) + (shape.get("beta", 4.0), shape.get("lbeta", 25.0))


def _situ_experts_shapes(spec, point) -> list[dict]:
    if not _situ(spec) or not spec.is_moe:
        return []
    return [{"T": tokens(point), "E": spec.num_experts, "k": spec.num_experts_per_tok,
             "H": spec.latent_moe_size or spec.hidden_size, "I": spec.moe_intermediate_size,
             "beta": spec.situ_beta, "lbeta": spec.situ_linear_beta}]


def _situ_experts_fit(shape: dict, budget: int) -> dict:
    return _experts_fit(shape, budget)


def _gated_inputs(shape, dtype, device, seed):
    g = generator(device, seed)
    d = shape["x"][-1]
    return (randn(g, shape["x"], dtype, device, 2.0), randn(g, shape["x"], dtype, device, 2.0),
            1.0 + randn(g, [d], dtype, device, 0.1), 1e-5)


def _gated_shapes(spec, point) -> list[dict]:
    if not any(getattr(spec, "kda_layers", ())):
        return []
    return [{"x": [tokens(point), spec.kda_num_heads, spec.kda_head_dim]}]


def _sigmoid_mul_inputs(shape, dtype, device, seed):
    g = generator(device, seed)
    return randn(g, shape["x"], dtype, device), randn(g, shape["x"], dtype, device, 3.0)


def _sigmoid_mul_shapes(spec, point) -> list[dict]:
    if not getattr(spec, "mla_output_gate", False):
        return []
    return [{"x": [tokens(point), spec.num_heads * spec.v_head_dim]}]


def _attn_res_inputs(shape, dtype, device, seed):
    g = generator(device, seed)
    t, nb, h = shape["T"], shape["NB"], shape["H"]
    return (randn(g, [t, h], dtype, device), randn(g, [t, nb, h], dtype, device),
            randn(g, [h], dtype, device, h ** -0.5), 1.0 + randn(g, [h], dtype, device, 0.05), 1e-5)


def _attn_res_shapes(spec, point) -> list[dict]:
    bs = getattr(spec, "attn_res_block_size", 0)
    if not bs:
        return []
    most = -(-spec.num_layers // bs)
    return [{"T": tokens(point), "NB": nb, "H": spec.hidden_size} for nb in sorted({1, most})]


_KDA_ARGS = ("q[*, H, K], k[*, H, K], v[*, H, V] (after the short conv), f[*, H, K] (forget-gate projection), "
             "b[*, H] (beta logits), a_log[H] fp32, dt_bias[H K] fp32, lower_bound: float | None, "
             "state[B, H, K, V] fp32")
OPS = [
    OpDef("kda_decode", kda_decode,
          "kda_decode(" + _KDA_ARGS.replace("*", "B") + ") -> (o[B, H, V], new_state[B, H, K, V] fp32): one step of "
          "Kimi delta attention (module doc) per sequence. shape dict: {'B', 'H', 'K', 'V', 'lb'}",
          _kda_inputs("decode"), _kda_shapes("decode"),
          ({"B": 3, "H": 2, "K": 16, "V": 8, "lb": -5.0}, {"B": 1, "H": 3, "K": 8, "V": 12, "lb": None}),
          outputs=2, tolerances=dict(KDA_TOLERANCES)),
    OpDef("kda_prefill", kda_prefill,
          "kda_prefill(" + _KDA_ARGS.replace("*", "T") + ", cu_seqlens[B+1] int32) -> (o[T, H, V], "
          "new_state[B, H, K, V] fp32): each sequence's tokens from its state, in order. shape dict: {'B', 'chunk', 'H', 'K', 'V', 'lb'}",
          _kda_inputs("prefill"), _kda_shapes("prefill"),
          ({"B": 2, "chunk": 21, "H": 2, "K": 16, "V": 8, "lb": -5.0}, {"B": 1, "chunk": 5, "H": 1, "K": 8, "V": 8,
                                                                         "lb": None}),
          outputs=2, tolerances=dict(KDA_TOLERANCES)),
    OpDef("short_conv_decode", short_conv_decode,
          "short_conv_decode(x[B, D], conv_state[B, D, W-1], weight[D, W]) -> (silu(causal depthwise conv)[B, D], "
          "new conv_state[B, D, W-1]). shape dict: {'B', 'D', 'W'}",
          _conv_inputs("decode"), _conv_shapes("decode"), ({"B": 3, "D": 24, "W": 4}, {"B": 1, "D": 7, "W": 2}),
          outputs=2),
    OpDef("short_conv_prefill", short_conv_prefill,
          "short_conv_prefill(x[T, D], conv_state[B, D, W-1], weight[D, W], cu_seqlens[B+1] int32) -> (y[T, D], "
          "new conv_state[B, D, W-1]). shape dict: {'B', 'chunk', 'D', 'W'}",
          _conv_inputs("prefill"), _conv_shapes("prefill"), ({"B": 2, "chunk": 5, "D": 24, "W": 4},
                                                             {"B": 1, "chunk": 2, "D": 5, "W": 4}),
          outputs=2),
    OpDef("situ_and_mul", situ_and_mul,
          "situ_and_mul(x[..., 2I], beta: float, linear_beta: float | None) -> [..., I] (SiTU-GLU, module doc). "
          "shape dict: {'x', 'beta', 'lbeta'}",
          _situ_inputs, _situ_shapes, ({"x": [5, 48]}, {"x": [2, 3, 20], "beta": 2.0, "lbeta": None})),
    OpDef("moe_experts_situ", moe_experts_situ,
          "moe_experts_situ(x[T, H], w13[E, 2I, H], w2[E, H, I], topk_weights[T, k] fp32, topk_ids[T, k] int64, beta, "
          "linear_beta) -> [T, H]: moe_experts with situ_and_mul. "
          "shape dict: {'T', 'E', 'k', 'H', 'I', 'beta', 'lbeta'}",
          _situ_experts_inputs, _situ_experts_shapes,
          ({"T": 1, "E": 16, "k": 2, "H": 32, "I": 24}, {"T": 6, "E": 8, "k": 2, "H": 48, "I": 16}),
          tolerances=dict(MATMUL_TOLERANCES), fit=_situ_experts_fit,
          check_bytes=experts_check_bytes),
    OpDef("rms_norm_gated", rms_norm_gated,
          "rms_norm_gated(x[..., D], gate[..., D], weight[D], eps) -> rms_norm(x) * weight * sigmoid(gate). "
          "shape dict: {'x'}",
          _gated_inputs, _gated_shapes, ({"x": [3, 2, 16]}, {"x": [5, 24]}), tolerances=dict(DEFAULT_TOLERANCES)),
    OpDef("sigmoid_mul", sigmoid_mul,
          "sigmoid_mul(x[...], gate[...]) -> x * sigmoid(gate). shape dict: {'x'}",
          _sigmoid_mul_inputs, _sigmoid_mul_shapes, ({"x": [3, 40]}, {"x": [1, 7]})),
    OpDef("attn_res", attn_res,
          "attn_res(prefix[T, H], blocks[T, NB, H], proj_w[H], norm_w[H], eps) -> [T, H]: softmax over the NB + 1 "
          "sources of rms(source) . (norm_w * proj_w), applied to the sources. shape dict: {'T', 'NB', 'H'}",
          _attn_res_inputs, _attn_res_shapes, ({"T": 3, "NB": 2, "H": 32}, {"T": 1, "NB": 1, "H": 24}),
          tolerances=dict(MATMUL_TOLERANCES)),
]
