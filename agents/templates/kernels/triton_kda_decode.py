"""kda_decode (Kimi-Linear / Kimi-K3) as one Triton kernel: gate, l2 norms, beta, decay, delta update and output
of one decode step (persistent_engine/ops/kda.py), the state tile kept in registers between them.

Grid (B * H, cdiv(V, BLOCK_V)). Each program reads q, k, f [K] of its (sequence, head), v [BLOCK_V] and the fp32
state tile [K, BLOCK_V] once, and writes o [BLOCK_V] and the new state tile once: 8 K BLOCK_V bytes of state
traffic (the reference makes ~5 passes over the state).
"""

import torch
import triton
import triton.language as tl

# ---- section ----
KDA_BLOCK_V = 32
KDA_NUM_WARPS = 4


@triton.jit
def _kda_decode_kernel(q_ptr, k_ptr, v_ptr, f_ptr, b_ptr, alog_ptr, dt_ptr, s_ptr, o_ptr, ns_ptr,
                       H, K, V, scale, lower_bound,
                       HAS_LB: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr):
    bh = tl.program_id(0).to(tl.int64)
    h = bh % H
    offs_k = tl.arange(0, BLOCK_K)
    offs_v = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
    mk, mv = offs_k < K, offs_v < V
    q = tl.load(q_ptr + bh * K + offs_k, mask=mk, other=0.0).to(tl.float32)
    k = tl.load(k_ptr + bh * K + offs_k, mask=mk, other=0.0).to(tl.float32)
    x = tl.load(f_ptr + bh * K + offs_k, mask=mk, other=0.0).to(tl.float32) + \
        tl.load(dt_ptr + h * K + offs_k, mask=mk, other=0.0).to(tl.float32)
    a = tl.exp(tl.load(alog_ptr + h).to(tl.float32))
    if HAS_LB:
        g = lower_bound / (1.0 + tl.exp(-a * x))
    else:
        g = -a * tl.where(x > 20.0, x, tl.log(1.0 + tl.exp(x)))
    g = tl.where(mk, g, 0.0)
    q = q * tl.rsqrt(tl.sum(q * q, 0) + 1e-6) * scale
    k = k * tl.rsqrt(tl.sum(k * k, 0) + 1e-6)
    beta = 1.0 / (1.0 + tl.exp(-tl.load(b_ptr + bh).to(tl.float32)))
    v = tl.load(v_ptr + bh * V + offs_v, mask=mv, other=0.0).to(tl.float32)
    tile = (bh * K + offs_k[:, None]) * V + offs_v[None, :]
    m2 = mk[:, None] & mv[None, :]
    s = tl.load(s_ptr + tile, mask=m2, other=0.0) * tl.exp(g)[:, None]       # [BLOCK_K, BLOCK_V]
    u = beta * (v - tl.sum(k[:, None] * s, 0))
    s = s + k[:, None] * u[None, :]
    o = tl.sum(q[:, None] * s, 0)
    tl.store(ns_ptr + tile, s, mask=m2)
    tl.store(o_ptr + bh * V + offs_v, o.to(o_ptr.dtype.element_ty), mask=mv)


def kda_decode_triton(q, k, v, f, b, a_log, dt_bias, lower_bound, state):
    bsz, h, kd = q.shape
    vd = v.shape[-1]
    q, k, v, f, b = (t.contiguous() for t in (q, k, v, f, b))
    st = state.float().contiguous()
    o = torch.empty((bsz, h, vd), dtype=v.dtype, device=v.device)
    new = torch.empty_like(st)
    if bsz > 0:
        _kda_decode_kernel[(bsz * h, triton.cdiv(vd, KDA_BLOCK_V))](
            q, k, v, f, b, a_log.float().contiguous(), dt_bias.float().contiguous(), st, o, new, h, kd, vd,
            kd ** -0.5, 0.0 if lower_bound is None else float(lower_bound), HAS_LB=lower_bound is not None,
            BLOCK_K=triton.next_power_of_2(kd), BLOCK_V=KDA_BLOCK_V, num_warps=KDA_NUM_WARPS)
    return o, new.to(state.dtype)
