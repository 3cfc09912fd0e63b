"""gated_delta_decode (one gated delta rule step per sequence) as one Triton kernel.

Grid (B * Hv, cdiv(Dv, BLOCK_V)): a program takes one sequence, one value head and BLOCK_V columns of its
state S[Dk, Dv] (fp32). It reads q and k of the head's key head (head hv // (Hv / Hk)), L2-normalises them
in registers, reads its state tile once and writes the new tile once:
    kS = k^T S, qS = q^T S (one pass over the tile);  u = beta (v - gamma kS);  o = gamma qS + (q . k) u
    S' = gamma S + k u^T,  gamma = exp(g)
Bytes per program: 2 x Dk x BLOCK_V x 4 (state) + 2 Dk + 2 BLOCK_V elements; no intermediate in memory.
"""

import torch
import triton
import triton.language as tl

# ---- section ----
GDD_BLOCK_V = 32
GDD_NUM_WARPS = 4


@triton.jit
def _gdd_kernel(q_ptr, k_ptr, v_ptr, g_ptr, beta_ptr, s_ptr, o_ptr, ns_ptr, scale,
                stride_qb, stride_qh, stride_kb, stride_kh, stride_vb, stride_vh, stride_ob, stride_oh,
                HV, REP, DK, DV, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr):
    pid = tl.program_id(0)
    b = pid // HV
    hv = pid % HV
    hk = hv // REP
    offs_k = tl.arange(0, BLOCK_K)
    offs_v = tl.program_id(1) * BLOCK_V + tl.arange(0, BLOCK_V)
    kmask = offs_k < DK
    vmask = offs_v < DV
    q = tl.load(q_ptr + b * stride_qb + hk * stride_qh + offs_k, mask=kmask, other=0.0).to(tl.float32)
    k = tl.load(k_ptr + b * stride_kb + hk * stride_kh + offs_k, mask=kmask, other=0.0).to(tl.float32)
    q = q * tl.rsqrt(tl.sum(q * q, axis=0) + 1e-6) * scale
    k = k * tl.rsqrt(tl.sum(k * k, axis=0) + 1e-6)
    v = tl.load(v_ptr + b * stride_vb + hv * stride_vh + offs_v, mask=vmask, other=0.0).to(tl.float32)
    gamma = tl.exp(tl.load(g_ptr + pid).to(tl.float32))
    beta = tl.load(beta_ptr + pid).to(tl.float32)
    tile = (pid * DK + offs_k[:, None]) * DV + offs_v[None, :]                 # state [B*Hv, Dk, Dv] contiguous
    m2 = kmask[:, None] & vmask[None, :]
    s = tl.load(s_ptr + tile, mask=m2, other=0.0)
    ks = tl.sum(s * k[:, None], axis=0)
    qs = tl.sum(s * q[:, None], axis=0)
    u = beta * (v - gamma * ks)
    o = gamma * qs + tl.sum(q * k, axis=0) * u
    tl.store(ns_ptr + tile, gamma * s + k[:, None] * u[None, :], mask=m2)
    tl.store(o_ptr + b * stride_ob + hv * stride_oh + offs_v, o.to(o_ptr.dtype.element_ty), mask=vmask)


def gated_delta_decode_triton(q, k, v, g, beta, state):
    B, HK, DK = q.shape
    HV, DV = v.shape[1], v.shape[2]
    q = q if q.stride(-1) == 1 else q.contiguous()
    k = k if k.stride(-1) == 1 else k.contiguous()
    v = v if v.stride(-1) == 1 else v.contiguous()
    s = state.contiguous()
    g, beta = g.float().contiguous(), beta.float().contiguous()
    out = torch.empty((B, HV, DV), dtype=v.dtype, device=v.device)
    new = torch.empty_like(s)
    if B == 0:
        return out, new
    grid = (B * HV, triton.cdiv(DV, GDD_BLOCK_V))
    _gdd_kernel[grid](q, k, v, g, beta, s, out, new, DK ** -0.5, q.stride(0), q.stride(1), k.stride(0), k.stride(1),
                      v.stride(0), v.stride(1), out.stride(0), out.stride(1), HV, HV // HK, DK, DV,
                      BLOCK_K=triton.next_power_of_2(DK), BLOCK_V=GDD_BLOCK_V, num_warps=GDD_NUM_WARPS)
    return out, new
