"""moe_experts for decode batches in Triton: each (token, slot) pair as two fused GEMVs.

Kernel 1, grid (T*k, cdiv(I, BLOCK_I)): pair p = (t, j) with expert e = topk_ids[t, j] computes
BLOCK_I gate rows and the matching up rows of w13[e] against x[t] over H in BLOCK_H chunks and
writes silu(gate) * up to an intermediate [T*k, I] (x's dtype, as the unfused path rounds it).
Kernel 2, grid (T, cdiv(H, BLOCK_N)): sums topk_weights[t, j] * w2[e_j][n, :] @ inter[p] over the
k slots in a fixed order (deterministic, no atomics), writes out[t, n].
Only the selected experts' weights are read: T*k*3*H*I elements at most (less when tokens share
experts and the tiles hit L2). Above ``MOE_MAX_T`` tokens (prefill) the pairs are grouped by expert
and run as one torch GEMM per expert.
"""

import torch
import triton
import triton.language as tl

# ---- section ----
MOE_BLOCK_I = 32
MOE_BLOCK_H = 128
MOE_BLOCK_N = 32
MOE_NUM_WARPS = 4
MOE_MAX_T = 64


@triton.jit
def _moe_up_kernel(x_ptr, w13_ptr, ids_ptr, inter_ptr, H, I, stride_xt, stride_we, stride_wr,
                   TOPK: tl.constexpr, BLOCK_I: tl.constexpr, BLOCK_H: tl.constexpr):
    p = tl.program_id(0)
    t = p // TOPK
    e = tl.load(ids_ptr + p).to(tl.int64)
    offs_i = tl.program_id(1) * BLOCK_I + tl.arange(0, BLOCK_I)
    imask = offs_i < I
    base = w13_ptr + e * stride_we
    acc_g = tl.zeros([BLOCK_I, BLOCK_H], dtype=tl.float32)
    acc_u = tl.zeros([BLOCK_I, BLOCK_H], dtype=tl.float32)
    for h0 in range(0, H, BLOCK_H):
        offs_h = h0 + tl.arange(0, BLOCK_H)
        hmask = offs_h < H
        x = tl.load(x_ptr + t * stride_xt + offs_h, mask=hmask, other=0.0).to(tl.float32)
        m2 = imask[:, None] & hmask[None, :]
        g = tl.load(base + offs_i[:, None] * stride_wr + offs_h[None, :], mask=m2, other=0.0)
        u = tl.load(base + (I + offs_i[:, None]) * stride_wr + offs_h[None, :], mask=m2, other=0.0)
        acc_g += g.to(tl.float32) * x[None, :]
        acc_u += u.to(tl.float32) * x[None, :]
    gate = tl.sum(acc_g, axis=1).to(inter_ptr.dtype.element_ty).to(tl.float32)
    up = tl.sum(acc_u, axis=1).to(inter_ptr.dtype.element_ty).to(tl.float32)
    y = gate / (1.0 + tl.exp(-gate)) * up
    tl.store(inter_ptr + p * I + offs_i, y.to(inter_ptr.dtype.element_ty), mask=imask)


@triton.jit
def _moe_down_kernel(inter_ptr, w2_ptr, ids_ptr, tw_ptr, out_ptr, H, I, stride_we, stride_wr, stride_ot,
                     TOPK: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_I: tl.constexpr):
    t = tl.program_id(0)
    offs_n = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = offs_n < H
    total = tl.zeros([BLOCK_N], dtype=tl.float32)
    for j in range(TOPK):
        p = t * TOPK + j
        e = tl.load(ids_ptr + p).to(tl.int64)
        wt = tl.load(tw_ptr + p).to(tl.float32)
        acc = tl.zeros([BLOCK_N, BLOCK_I], dtype=tl.float32)
        for i0 in range(0, I, BLOCK_I):
            offs_i = i0 + tl.arange(0, BLOCK_I)
            imask = offs_i < I
            h = tl.load(inter_ptr + p * I + offs_i, mask=imask, other=0.0).to(tl.float32)
            w = tl.load(w2_ptr + e * stride_we + offs_n[:, None] * stride_wr + offs_i[None, :],
                        mask=nmask[:, None] & imask[None, :], other=0.0)
            acc += w.to(tl.float32) * h[None, :]
        total += wt * tl.sum(acc, axis=1)
    tl.store(out_ptr + t * stride_ot + offs_n, total.to(out_ptr.dtype.element_ty), mask=nmask)


def _moe_grouped_torch(x, w13, w2, topk_weights, topk_ids):
    T, H = x.shape
    k = topk_ids.shape[1]
    I = w2.shape[2]
    flat = topk_ids.reshape(-1)
    order = torch.argsort(flat, stable=True)
    counts = torch.bincount(flat, minlength=w13.shape[0]).tolist()
    tok = order // k
    xs = x[tok]                                                        # [T*k, H] grouped by expert
    ys = torch.empty((T * k, H), dtype=torch.float32, device=x.device)
    start = 0
    for e, n in enumerate(counts):
        if n:
            h = torch.nn.functional.linear(xs[start:start + n], w13[e])
            h = (torch.nn.functional.silu(h[:, :I]) * h[:, I:]).to(x.dtype)
            ys[start:start + n] = torch.nn.functional.linear(h, w2[e]).float()
            start += n
    ys = ys * topk_weights.reshape(-1)[order].float()[:, None]
    out = torch.zeros((T, H), dtype=torch.float32, device=x.device)
    out.index_add_(0, tok, ys)
    return out.to(x.dtype)


def moe_experts_triton(x, w13, w2, topk_weights, topk_ids):
    T, H = x.shape
    E, two_i, _ = w13.shape
    I = two_i // 2
    k = topk_ids.shape[1]
    if T > MOE_MAX_T:
        return _moe_grouped_torch(x, w13, w2, topk_weights, topk_ids)
    out = torch.empty((T, H), dtype=x.dtype, device=x.device)
    if T == 0:
        return out
    if x.stride(-1) != 1:
        x = x.contiguous()
    ids = topk_ids.contiguous()
    tw = topk_weights.contiguous()
    inter = torch.empty((T * k, I), dtype=x.dtype, device=x.device)
    _moe_up_kernel[(T * k, triton.cdiv(I, MOE_BLOCK_I))](
        x, w13, ids, inter, H, I, x.stride(0), w13.stride(0), w13.stride(1),
        TOPK=k, BLOCK_I=MOE_BLOCK_I, BLOCK_H=MOE_BLOCK_H, num_warps=MOE_NUM_WARPS)
    _moe_down_kernel[(T, triton.cdiv(H, MOE_BLOCK_N))](
        inter, w2, ids, tw, out, H, I, w2.stride(0), w2.stride(1), out.stride(0),
        TOPK=k, BLOCK_N=MOE_BLOCK_N, BLOCK_I=MOE_BLOCK_H, num_warps=MOE_NUM_WARPS)
    return out
