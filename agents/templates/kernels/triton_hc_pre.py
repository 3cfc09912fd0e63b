"""hc_pre (DeepSeek-V4 hyper-connections) as two Triton kernels: per token t of x[T, N, D] (K = N*D),

    mix[t]       = (x[t].flatten() @ fn.T) * rsqrt(mean(x[t]^2) + norm_eps)       [(2+N)*N] fp32
    pre[t]       = sigmoid(mix[:N] * scale[0] + base[:N]) + hc_eps                  [N]
    post[t]      = 2 * sigmoid(mix[N:2N] * scale[1] + base[N:2N])                   [N]      (written)
    comb[t]      = sinkhorn(softmax(mix[2N:].view(N, N) * scale[2] + base[2N:], -1) + hc_eps)  [N, N] (written)
    collapsed[t] = sum_n pre[n] * x[t, n]                                           [D] x.dtype (written)

in fp32 (the RMS factored out of the dot: the same sum, one rounding less), collapsed rounded once.

1. ``_hc_pre_mix_kernel``, grid (cdiv(T, BLOCK_T), SPLIT_K): a split-K GEMV. Each program takes BLOCK_T tokens
   and one CHUNK of the K axis (a multiple of BLOCK_K), loads each [BLOCK_T, BLOCK_K] x tile and [R_PAD, BLOCK_K]
   fn tile once (the fn tile serves all BLOCK_T tokens), and writes its fp32 partial logits plus the partial sum
   of squares (slot R) to part[T, SPLIT_K, R_PAD]: no atomics, so the result is deterministic.
2. ``_hc_pre_weights_kernel``, grid (T, cdiv(D, BLOCK_D)): each program sums its token's SPLIT_K partials,
   forms pre (and, in the D-block-0 program, post and the Sinkhorn-normalised comb: N x N in registers), and
   collapses its D-block of the N streams.

Bytes: x read once from HBM (T*N*D*2 B for bf16; the collapse pass re-reads it, from L2 at decode sizes), fn once
((2+N)*N*N*D*4 B: 1.5 MiB for V4-Flash, re-read from L2 by each of the cdiv(T, BLOCK_T) token blocks), T*D
elements out plus T*(N + N^2) fp32 weights and the T*SPLIT_K*R_PAD fp32 partials. The reference makes ~8 passes
(fp32 copy of x, square, mean, normalise, matmul, the weights' small ops, the collapse and its cast) and
~60 launches for the Sinkhorn loop. The defaults at V4-Flash's decode batch 32 (K = 16384): 16 token pairs x 16
splits = 256 stage-1 programs of a 1024-wide K chunk each (fn from L2 16 times: 24 MiB), then 32 x 4 collapse
programs.
"""

import torch
import triton
import triton.language as tl

# ---- section ----
HCPR_SPLIT_K = 16
HCPR_BLOCK_K = 128
HCPR_BLOCK_T = 2
HCPR_NUM_WARPS = 4
HCPR_BLOCK_D = 1024
HCPR_COLLAPSE_WARPS = 4


@triton.jit
def _hc_pre_mix_kernel(x_ptr, fn_ptr, part_ptr, T, K, CHUNK, R: tl.constexpr, R_PAD: tl.constexpr,
                       SPLIT_K: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_K: tl.constexpr):
    toks = (tl.program_id(0) * BLOCK_T + tl.arange(0, BLOCK_T)).to(tl.int64)          # [BLOCK_T]
    split = tl.program_id(1)
    tmask = toks < T
    rows = tl.arange(0, R_PAD)                                                          # [R_PAD]
    rmask = rows < R
    acc = tl.zeros([BLOCK_T, R_PAD], dtype=tl.float32)
    sumsq = tl.zeros([BLOCK_T], dtype=tl.float32)
    for kb in range(0, CHUNK, BLOCK_K):
        ks = split * CHUNK + kb + tl.arange(0, BLOCK_K)                                 # [BLOCK_K]
        kmask = ks < K
        xv = tl.load(x_ptr + toks[:, None] * K + ks[None, :], mask=tmask[:, None] & kmask[None, :],
                     other=0.0).to(tl.float32)                                          # [BLOCK_T, BLOCK_K]
        w = tl.load(fn_ptr + rows[:, None] * K + ks[None, :], mask=rmask[:, None] & kmask[None, :],
                    other=0.0).to(tl.float32)                                           # [R_PAD, BLOCK_K]
        sumsq += tl.sum(xv * xv, axis=1)
        acc += tl.sum(xv[:, None, :] * w[None, :, :], axis=2)
    acc = tl.where(rows[None, :] == R, sumsq[:, None], acc)
    tl.store(part_ptr + (toks[:, None] * SPLIT_K + split) * R_PAD + rows[None, :], acc, mask=tmask[:, None])


@triton.jit
def _hc_pre_weights_kernel(x_ptr, part_ptr, scale_ptr, base_ptr, col_ptr, post_ptr, comb_ptr, D, K, iters, hc_eps,
                           norm_eps, N: tl.constexpr, NP: tl.constexpr, R_PAD: tl.constexpr,
                           SPLIT_K: tl.constexpr, BLOCK_D: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    i = tl.arange(0, NP)                                                                # stream index
    imask = i < N
    cidx = 2 * N + i[:, None] * N + i[None, :]                                          # comb logit slots
    cmask = imask[:, None] & imask[None, :]
    R = (2 + N) * N
    sumsq = 0.0
    m_pre = tl.zeros([NP], dtype=tl.float32)
    m_post = tl.zeros([NP], dtype=tl.float32)
    m_comb = tl.zeros([NP, NP], dtype=tl.float32)
    for s in tl.static_range(SPLIT_K):                                                  # fixed order: deterministic
        p = part_ptr + (t * SPLIT_K + s) * R_PAD
        sumsq += tl.load(p + R)
        m_pre += tl.load(p + i, mask=imask, other=0.0)
        m_post += tl.load(p + N + i, mask=imask, other=0.0)
        m_comb += tl.load(p + cidx, mask=cmask, other=0.0)
    r = 1.0 / tl.sqrt(sumsq / K + norm_eps)
    pre = tl.sigmoid(m_pre * r * tl.load(scale_ptr) + tl.load(base_ptr + i, mask=imask, other=0.0)) + hc_eps
    pre = tl.where(imask, pre, 0.0)
    if tl.program_id(1) == 0:
        post = 2.0 * tl.sigmoid(m_post * r * tl.load(scale_ptr + 1) + tl.load(base_ptr + N + i, mask=imask, other=0.0))
        tl.store(post_ptr + t * N + i, post, mask=imask)
        logits = m_comb * r * tl.load(scale_ptr + 2) + tl.load(base_ptr + cidx, mask=cmask, other=0.0)
        logits = tl.where(imask[None, :], logits, float("-inf"))                          # padded columns
        e = tl.exp(logits - tl.max(logits, axis=1)[:, None])
        comb = tl.where(cmask, e / tl.sum(e, axis=1)[:, None] + hc_eps, 0.0)
        comb = comb / (tl.sum(comb, axis=0)[None, :] + hc_eps)                            # Sinkhorn: columns
        for _ in range(iters - 1):                                                      # then (rows, columns)
            comb = comb / (tl.sum(comb, axis=1)[:, None] + hc_eps)
            comb = comb / (tl.sum(comb, axis=0)[None, :] + hc_eps)
        tl.store(comb_ptr + t * N * N + i[:, None] * N + i[None, :], comb, mask=cmask)
    offs = tl.program_id(1) * BLOCK_D + tl.arange(0, BLOCK_D)
    dmask = offs < D
    xv = tl.load(x_ptr + (t * N + i[:, None]) * D + offs[None, :], mask=imask[:, None] & dmask[None, :],
                 other=0.0).to(tl.float32)                                              # [NP, BLOCK_D]
    out = tl.sum(pre[:, None] * xv, axis=0)
    tl.store(col_ptr + t * D + offs, out.to(col_ptr.dtype.element_ty), mask=dmask)


def hc_pre_triton(x, fn, scale, base, iters, hc_eps, norm_eps):
    t, n, d = x.shape
    k, rows = n * d, (2 + n) * n
    r_pad = triton.next_power_of_2(rows + 1)                        # + the sum-of-squares slot
    xc, w = x.contiguous(), fn.float().contiguous()
    sc, b = scale.float().contiguous(), base.float().contiguous()
    collapsed = torch.empty((t, d), dtype=x.dtype, device=x.device)
    post = torch.empty((t, n), dtype=torch.float32, device=x.device)
    comb = torch.empty((t, n, n), dtype=torch.float32, device=x.device)
    if t == 0:
        return collapsed, post, comb
    split = max(min(HCPR_SPLIT_K, triton.cdiv(k, HCPR_BLOCK_K)), 1)
    chunk = triton.cdiv(triton.cdiv(k, split), HCPR_BLOCK_K) * HCPR_BLOCK_K
    part = torch.empty((t, split, r_pad), dtype=torch.float32, device=x.device)
    _hc_pre_mix_kernel[(triton.cdiv(t, HCPR_BLOCK_T), split)](
        xc, w, part, t, k, chunk, R=rows, R_PAD=r_pad, SPLIT_K=split, BLOCK_T=HCPR_BLOCK_T, BLOCK_K=HCPR_BLOCK_K,
        num_warps=HCPR_NUM_WARPS)
    _hc_pre_weights_kernel[(t, triton.cdiv(d, HCPR_BLOCK_D))](
        xc, part, sc, b, collapsed, post, comb, d, k, int(iters), float(hc_eps), float(norm_eps), N=n,
        NP=triton.next_power_of_2(n), R_PAD=r_pad, SPLIT_K=split, BLOCK_D=HCPR_BLOCK_D,
        num_warps=HCPR_COLLAPSE_WARPS)
    return collapsed, post, comb
