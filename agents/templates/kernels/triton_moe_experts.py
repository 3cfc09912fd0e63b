"""moe_experts as a fused MoE in Triton: align by expert, two grouped GEMMs, a deterministic k-sum.

P = T*k (token, slot) pairs, e = topk_ids[t, j]. Two paths, picked from shapes only (no host sync,
so decode stays CUDA-graph capturable):

Grouped path (P > MOE_GEMV_MAX_PAIRS), four launches:
  1. align, one program: counts pairs per expert, pads each expert's group to a multiple of
     BLOCK_M and scatters pair ids into ``sorted[S]`` by expert (stable: pair order within an
     expert), S = P + E*(BLOCK_M-1) slots (static), padding slots hold the sentinel P; and
     ``block_expert[S/BLOCK_M]`` (E for blocks past the last group: they exit at once). Every slot is
     written exactly once and prefix sums are masked reductions (no scan, no slot written twice under a
     barrier): the layout cannot depend on the warp schedule. Cost: 2*cdiv(P, CHUNK) steps over a
     [CHUNK, E] one-hot and a [CHUNK, CHUNK] same-expert mask (CHUNK 64 at E=128: 16 steps at P=512),
     plus cdiv(S/BLOCK_M, CHUNK) block steps; latency-bound, one launch.
  2. w13 grouped GEMM, grid (S/BLOCK_M * cdiv(I, BLOCK_N)) with GROUP_M swizzling: a block's
     BLOCK_M rows gather x[t] (token t = pair // k), tl.dot against the gate and up rows of
     w13[e] ([BLOCK_N, H] each), epilogue silu(gate) * up into ``inter[S, I]`` (x's dtype, gate and
     up rounded to it first as the unfused path does).
  3. w2 grouped GEMM, grid (S/BLOCK_M * cdiv(H, BLOCK_N)): inter rows against w2[e], epilogue times
     the routing weight, fp32 rows scattered to ``ypair[P, H]`` by pair id.
  4. k-sum: out[t] = sum_j ypair[t*k + j] in a fixed order (deterministic, no atomics), cast.
  Every used expert's weights are read once per BLOCK_M pairs routed to it (once per step at decode);
  FLOPs 6*P*H*I plus the padding rows.

GEMV path (P <= MOE_GEMV_MAX_PAIRS, batch-1 decode): no align; grid (P, cdiv(I, ROWS)) fused
gate/up GEMV into ``inter[P, I]``, grid (P, cdiv(H, ROWS)) down GEMV times the weight into
``ypair``, then the same k-sum. Bytes: P*3*H*I weight elements, the floor at small batch.

The w13 epilogue (``_moe_act``, ACT a constexpr: one compiled kernel per activation, no branch at run time)
serves three ops, each with its own entry and knob set, so one candidate can hold all three with their own
tiles: ``moe_experts_triton`` (MOE_ knobs) SiLU(gate) * up; ``moe_experts_clamp_triton`` (MOEC_, DeepSeek-V4's
``swiglu_limit``) silu(min(gate, limit)) * clamp(up, -limit, limit); ``moe_experts_situ_triton`` (MOES_,
Kimi-K3) SiTU-GLU beta tanh(gate / beta) sigmoid(gate) * (lb tanh(up / lb), or up without ``linear_beta``).
Gate and up are rounded to x's dtype first in every case, as the reference does.
"""

import torch
import triton
import triton.language as tl

from agents.templates.kernels.shared_math import _sm_tanh

# ---- section ----
MOE_GEMV_MAX_PAIRS = 16
MOE_GEMV_ROWS = 8
MOE_GEMV_BLOCK_K = 512
MOE_GEMV_WARPS = 4
MOE_BLOCK_M = 16
MOE_BLOCK_N = 64
MOE_BLOCK_K = 64
MOE_GROUP_M = 8
MOE_NUM_WARPS = 4
MOE_NUM_STAGES = 3
MOEC_GEMV_MAX_PAIRS = 16
MOEC_GEMV_ROWS = 8
MOEC_GEMV_BLOCK_K = 512
MOEC_GEMV_WARPS = 4
MOEC_BLOCK_M = 16
MOEC_BLOCK_N = 64
MOEC_BLOCK_K = 64
MOEC_GROUP_M = 8
MOEC_NUM_WARPS = 4
MOEC_NUM_STAGES = 3
MOES_GEMV_MAX_PAIRS = 16
MOES_GEMV_ROWS = 8
MOES_GEMV_BLOCK_K = 512
MOES_GEMV_WARPS = 4
MOES_BLOCK_M = 16
MOES_BLOCK_N = 64
MOES_BLOCK_K = 64
MOES_GROUP_M = 8
MOES_NUM_WARPS = 4
MOES_NUM_STAGES = 3
MOE_SUM_BLOCK = 1024          # elements of out per k-sum program
MOE_ALIGN_ELEMS = 8192        # one-hot tile of the align kernel (CHUNK * E_POW2), 8 warps: 32 a thread

MOE_SILU, MOE_CLAMP, MOE_SITU, MOE_SITU_LB = 0, 1, 2, 3     # ACT: the w13 epilogue


@triton.jit
def _moe_act(gate, up, A, B, ACT: tl.constexpr):
    """The GLU of gate and up (fp32): SiLU * up; clamped at limit A first; SiTU-GLU with beta A (and lb B)."""
    if ACT == 1:                                           # the clamped SwiGLU (swiglu_limit)
        gate = tl.minimum(gate, A)
        up = tl.minimum(tl.maximum(up, -A), A)
    if ACT == 3:
        up = B * _sm_tanh(up / B)
    if ACT >= 2:
        act = A * _sm_tanh(gate / A) / (1.0 + tl.exp(-gate))
    else:
        act = gate / (1.0 + tl.exp(-gate))
    return act * up


@triton.jit
def _moe_align_kernel(ids_ptr, sorted_ptr, bexp_ptr, P, E, NUM_BLOCKS,
                      BLOCK_M: tl.constexpr, E_POW2: tl.constexpr, CHUNK: tl.constexpr):
    # Every slot of sorted[NUM_BLOCKS * BLOCK_M] is written exactly once (a pair id or the sentinel P) and
    # no value depends on another thread's global store: no write-after-write on a slot ordered only by a
    # CTA barrier, and no tl.cumsum (a cross-warp scan over the one-hot's interleaved rows); prefix sums are
    # masked reductions instead. Deterministic whatever the warp schedule.
    experts = tl.arange(0, E_POW2)
    counts = tl.zeros([E_POW2], dtype=tl.int32)
    for p0 in range(0, P, CHUNK):                           # pass 1: pairs per expert
        offs = p0 + tl.arange(0, CHUNK)
        e = tl.load(ids_ptr + offs, mask=offs < P, other=-1).to(tl.int32)
        counts += tl.sum((e[:, None] == experts[None, :]).to(tl.int32), axis=0)
    padded = (counts + BLOCK_M - 1) // BLOCK_M * BLOCK_M
    upto = experts[None, :] <= experts[:, None]             # [E_POW2 (e), E_POW2 (f)]: f <= e
    ends = tl.sum(tl.where(upto, padded[None, :], 0), axis=1)   # [E_POW2] end slot of each group
    starts = ends - padded
    fills = starts + counts                                 # first padding slot of each group
    rows = tl.arange(0, BLOCK_M)
    for b0 in range(0, NUM_BLOCKS, CHUNK):                  # blocks: owner expert, padding slots
        blk = b0 + tl.arange(0, CHUNK)
        # owner: first expert whose group ends after the block; E_POW2 past the last group
        owner = tl.sum((blk[:, None] * BLOCK_M >= ends[None, :]).to(tl.int32), axis=1)
        fill = tl.sum(tl.where(experts[None, :] == owner[:, None], fills[None, :], 0), axis=1)  # 0 past the end
        inb = blk < NUM_BLOCKS
        tl.store(bexp_ptr + blk, tl.minimum(owner, E), mask=inb)
        slot = blk[:, None] * BLOCK_M + rows[None, :]                       # [CHUNK, BLOCK_M]
        tl.store(sorted_ptr + slot, tl.zeros([CHUNK, BLOCK_M], dtype=tl.int32) + P,
                 mask=(slot >= fill[:, None]) & inb[:, None])
    before = tl.arange(0, CHUNK)[None, :] < tl.arange(0, CHUNK)[:, None]   # [CHUNK (i), CHUNK (j)]: j < i
    running = tl.zeros([E_POW2], dtype=tl.int32)
    for p0 in range(0, P, CHUNK):                           # pass 2: stable scatter by expert
        offs = p0 + tl.arange(0, CHUNK)
        e = tl.load(ids_ptr + offs, mask=offs < P, other=-1).to(tl.int32)
        hit = (e[:, None] == experts[None, :]).to(tl.int32)                 # [CHUNK, E_POW2]
        base = tl.sum(hit * (starts + running)[None, :], axis=1)            # next free slot of its expert
        rank = tl.sum(((e[:, None] == e[None, :]) & before).to(tl.int32), axis=1)   # earlier same-expert pairs
        tl.store(sorted_ptr + base + rank, offs, mask=offs < P)
        running += tl.sum(hit, axis=0)


@triton.jit
def _grouped_pid(pid, num_pid_m, num_pid_n, GROUP_M: tl.constexpr):
    """GROUP_M swizzle: GROUP_M consecutive row blocks (of one expert in prefill) run one after another
    over the N blocks, so they share a weight tile in L2. Returns (pid_m, pid_n)."""
    width = GROUP_M * num_pid_n
    first_m = (pid // width) * GROUP_M
    size_m = tl.minimum(num_pid_m - first_m, GROUP_M)
    return first_m + (pid % width) % size_m, (pid % width) // size_m


@triton.jit
def _moe_w13_kernel(x_ptr, w13_ptr, sorted_ptr, bexp_ptr, inter_ptr, P, H, I, E, num_pid_m, A, B,
                    stride_xt, stride_xh, stride_we, stride_wr, stride_wk,
                    TOPK: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                    GROUP_M: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr, ACT: tl.constexpr):
    pid_m, pid_n = _grouped_pid(tl.program_id(0), num_pid_m, tl.cdiv(I, BLOCK_N), GROUP_M)
    e = tl.load(bexp_ptr + pid_m)
    if e >= E:                                              # past the last group: nothing to do
        return
    slots = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    pair = tl.load(sorted_ptr + slots)
    valid = pair < P
    tok = (pair // TOPK).to(tl.int64)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = offs_n < I
    w_gate = w13_ptr + e.to(tl.int64) * stride_we + offs_n[None, :].to(tl.int64) * stride_wr   # [1, BLOCK_N]
    w_up = w_gate + I * stride_wr
    acc_g = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_u = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, H, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        kmask = offs_k < H
        a = tl.load(x_ptr + tok[:, None] * stride_xt + offs_k[None, :] * stride_xh,
                    mask=valid[:, None] & kmask[None, :], other=0.0)                     # [BLOCK_M, BLOCK_K]
        bmask = kmask[:, None] & nmask[None, :]
        g = tl.load(w_gate + offs_k[:, None] * stride_wk, mask=bmask, other=0.0)          # [BLOCK_K, BLOCK_N]
        u = tl.load(w_up + offs_k[:, None] * stride_wk, mask=bmask, other=0.0)
        if UPCAST:      # the CPU interpreter's bf16 dot is wrong; fp32 there (never on a GPU)
            a = a.to(tl.float32)
            g = g.to(tl.float32)
            u = u.to(tl.float32)
        if IEEE:        # fp32 inputs: full precision, not tf32
            acc_g = tl.dot(a, g, acc_g, input_precision="ieee")
            acc_u = tl.dot(a, u, acc_u, input_precision="ieee")
        else:
            acc_g = tl.dot(a, g, acc_g)
            acc_u = tl.dot(a, u, acc_u)
    gate = acc_g.to(inter_ptr.dtype.element_ty).to(tl.float32)
    up = acc_u.to(inter_ptr.dtype.element_ty).to(tl.float32)
    y = _moe_act(gate, up, A, B, ACT)
    tl.store(inter_ptr + slots[:, None].to(tl.int64) * I + offs_n[None, :], y.to(inter_ptr.dtype.element_ty),
             mask=valid[:, None] & nmask[None, :])


@triton.jit
def _moe_w2_kernel(inter_ptr, w2_ptr, sorted_ptr, bexp_ptr, tw_ptr, ypair_ptr, P, H, I, E, num_pid_m,
                   stride_we, stride_wr, stride_wk,
                   BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                   UPCAST: tl.constexpr, IEEE: tl.constexpr):
    pid_m, pid_n = _grouped_pid(tl.program_id(0), num_pid_m, tl.cdiv(H, BLOCK_N), GROUP_M)
    e = tl.load(bexp_ptr + pid_m)
    if e >= E:
        return
    slots = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    pair = tl.load(sorted_ptr + slots)
    valid = pair < P
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    nmask = offs_n < H
    w_rows = w2_ptr + e.to(tl.int64) * stride_we + offs_n[None, :].to(tl.int64) * stride_wr     # [1, BLOCK_N]
    a_rows = inter_ptr + slots[:, None].to(tl.int64) * I                                     # [BLOCK_M, 1]
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    for k0 in range(0, I, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        kmask = offs_k < I
        a = tl.load(a_rows + offs_k[None, :], mask=valid[:, None] & kmask[None, :], other=0.0)
        b = tl.load(w_rows + offs_k[:, None] * stride_wk, mask=kmask[:, None] & nmask[None, :], other=0.0)
        if UPCAST:
            a = a.to(tl.float32)
            b = b.to(tl.float32)
        if IEEE:
            acc = tl.dot(a, b, acc, input_precision="ieee")
        else:
            acc = tl.dot(a, b, acc)
    wt = tl.load(tw_ptr + pair, mask=valid, other=0.0).to(tl.float32)
    acc = acc * wt[:, None]
    tl.store(ypair_ptr + pair[:, None].to(tl.int64) * H + offs_n[None, :], acc,
             mask=valid[:, None] & nmask[None, :])


@triton.jit
def _moe_gemv_up_kernel(x_ptr, w13_ptr, ids_ptr, inter_ptr, H, I, A, B, stride_xt, stride_xh,
                        stride_we, stride_wr, stride_wk,
                        TOPK: tl.constexpr, ROWS: tl.constexpr, BLOCK_K: tl.constexpr, ACT: tl.constexpr):
    p = tl.program_id(0)
    t = p // TOPK
    e = tl.load(ids_ptr + p).to(tl.int64)
    offs_i = tl.program_id(1) * ROWS + tl.arange(0, ROWS)
    imask = offs_i < I
    w_gate = w13_ptr + e * stride_we + offs_i[:, None].to(tl.int64) * stride_wr                # [ROWS, 1]
    w_up = w_gate + I * stride_wr
    acc_g = tl.zeros([ROWS, BLOCK_K], dtype=tl.float32)
    acc_u = tl.zeros([ROWS, BLOCK_K], dtype=tl.float32)
    for k0 in range(0, H, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        kmask = offs_k < H
        x = tl.load(x_ptr + t * stride_xt + offs_k * stride_xh, mask=kmask, other=0.0).to(tl.float32)
        m2 = imask[:, None] & kmask[None, :]
        g = tl.load(w_gate + offs_k[None, :] * stride_wk, mask=m2, other=0.0)
        u = tl.load(w_up + offs_k[None, :] * stride_wk, mask=m2, other=0.0)
        acc_g += g.to(tl.float32) * x[None, :]
        acc_u += u.to(tl.float32) * x[None, :]
    gate = tl.sum(acc_g, axis=1).to(inter_ptr.dtype.element_ty).to(tl.float32)
    up = tl.sum(acc_u, axis=1).to(inter_ptr.dtype.element_ty).to(tl.float32)
    y = _moe_act(gate, up, A, B, ACT)
    tl.store(inter_ptr + p * I + offs_i, y.to(inter_ptr.dtype.element_ty), mask=imask)


@triton.jit
def _moe_gemv_down_kernel(inter_ptr, w2_ptr, ids_ptr, tw_ptr, ypair_ptr, H, I,
                          stride_we, stride_wr, stride_wk, ROWS: tl.constexpr, BLOCK_K: tl.constexpr):
    p = tl.program_id(0)
    e = tl.load(ids_ptr + p).to(tl.int64)
    offs_n = tl.program_id(1) * ROWS + tl.arange(0, ROWS)
    nmask = offs_n < H
    w_rows = w2_ptr + e * stride_we + offs_n[:, None].to(tl.int64) * stride_wr                  # [ROWS, 1]
    acc = tl.zeros([ROWS, BLOCK_K], dtype=tl.float32)
    for k0 in range(0, I, BLOCK_K):
        offs_k = k0 + tl.arange(0, BLOCK_K)
        kmask = offs_k < I
        h = tl.load(inter_ptr + p * I + offs_k, mask=kmask, other=0.0).to(tl.float32)
        w = tl.load(w_rows + offs_k[None, :] * stride_wk, mask=nmask[:, None] & kmask[None, :], other=0.0)
        acc += w.to(tl.float32) * h[None, :]
    y = tl.sum(acc, axis=1) * tl.load(tw_ptr + p).to(tl.float32)
    tl.store(ypair_ptr + p.to(tl.int64) * H + offs_n, y, mask=nmask)


@triton.jit
def _moe_sum_kernel(ypair_ptr, out_ptr, TH, H, TOPK: tl.constexpr, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)          # flat index t*H + h
    mask = offs < TH
    src = ypair_ptr + (offs // H) * (TOPK * H) + offs % H
    acc = tl.zeros([BLOCK], dtype=tl.float32)
    for j in tl.static_range(TOPK):                                             # fixed order: deterministic
        acc += tl.load(src + j * H, mask=mask, other=0.0)
    tl.store(out_ptr + offs, acc.to(out_ptr.dtype.element_ty), mask=mask)


def _moe_pow2(n):
    return 1 << max(int(n) - 1, 0).bit_length()


def _moe_align_chunk(e_pow2):
    """Pairs per step of the align kernel: its tiles are [CHUNK, E_POW2] (one-hot) and [CHUNK, CHUNK]
    (ranks), both kept within MOE_ALIGN_ELEMS. Without the second bound 8 experts gave CHUNK 1024, a
    [1024, 1024] tile that LLVM did not finish compiling in 300 s on the H200."""
    return max(1, min(MOE_ALIGN_ELEMS // e_pow2, _moe_pow2(int(MOE_ALIGN_ELEMS ** 0.5) + 1) // 2))


def _moe_fused(x, w13, w2, topk_weights, topk_ids, act, a, b, tiles):
    """The four launches (or three on the GEMV path) with epilogue ``act`` (A=a, B=b) and ``tiles``
    (GEMV_MAX_PAIRS, GEMV_ROWS, GEMV_BLOCK_K, GEMV_WARPS, BLOCK_M, BLOCK_N, BLOCK_K, GROUP_M, NUM_WARPS,
    NUM_STAGES): one entry's knob values."""
    (gemv_max_pairs, gemv_rows, gemv_block_k, gemv_warps, block_m, block_n, block_k, group_m, num_warps,
     num_stages) = tiles
    T, H = x.shape
    E, two_i, _ = w13.shape
    I = two_i // 2
    k = topk_ids.shape[1]
    P = T * k
    out = torch.empty((T, H), dtype=x.dtype, device=x.device)
    if P == 0:
        return out
    ids = topk_ids.reshape(-1)                                  # [P] pair p = t*k + j
    tw = topk_weights.reshape(-1)
    ypair = torch.empty((P, H), dtype=torch.float32, device=x.device)      # weighted expert outputs
    upcast, ieee = x.device.type != "cuda", x.dtype == torch.float32
    if P <= gemv_max_pairs:
        inter = torch.empty((P, I), dtype=x.dtype, device=x.device)
        _moe_gemv_up_kernel[(P, triton.cdiv(I, gemv_rows))](
            x, w13, ids, inter, H, I, a, b, x.stride(0), x.stride(1), w13.stride(0), w13.stride(1), w13.stride(2),
            TOPK=k, ROWS=gemv_rows, BLOCK_K=gemv_block_k, ACT=act, num_warps=gemv_warps,
            num_stages=num_stages)
        _moe_gemv_down_kernel[(P, triton.cdiv(H, gemv_rows))](
            inter, w2, ids, tw, ypair, H, I, w2.stride(0), w2.stride(1), w2.stride(2),
            ROWS=gemv_rows, BLOCK_K=gemv_block_k, num_warps=gemv_warps, num_stages=num_stages)
    else:
        slots = P + E * (block_m - 1)                       # static bound on the padded length
        num_blocks = triton.cdiv(slots, block_m)
        slots = num_blocks * block_m
        sorted_ids = torch.empty((slots,), dtype=torch.int32, device=x.device)
        block_expert = torch.empty((num_blocks,), dtype=torch.int32, device=x.device)
        e_pow2 = _moe_pow2(E)
        _moe_align_kernel[(1,)](ids, sorted_ids, block_expert, P, E, num_blocks, BLOCK_M=block_m,
                                E_POW2=e_pow2, CHUNK=_moe_align_chunk(e_pow2), num_warps=8)
        inter = torch.empty((slots, I), dtype=x.dtype, device=x.device)
        _moe_w13_kernel[(num_blocks * triton.cdiv(I, block_n),)](
            x, w13, sorted_ids, block_expert, inter, P, H, I, E, num_blocks, a, b, x.stride(0), x.stride(1),
            w13.stride(0), w13.stride(1), w13.stride(2), TOPK=k, BLOCK_M=block_m, BLOCK_N=block_n,
            BLOCK_K=block_k, GROUP_M=group_m, UPCAST=upcast, IEEE=ieee, ACT=act, num_warps=num_warps,
            num_stages=num_stages)
        _moe_w2_kernel[(num_blocks * triton.cdiv(H, block_n),)](
            inter, w2, sorted_ids, block_expert, tw, ypair, P, H, I, E, num_blocks,
            w2.stride(0), w2.stride(1), w2.stride(2), BLOCK_M=block_m, BLOCK_N=block_n,
            BLOCK_K=block_k, GROUP_M=group_m, UPCAST=upcast, IEEE=ieee, num_warps=num_warps,
            num_stages=num_stages)
    _moe_sum_kernel[(triton.cdiv(T * H, MOE_SUM_BLOCK),)](ypair, out, T * H, H, TOPK=k, BLOCK=MOE_SUM_BLOCK,
                                                          num_warps=4)
    return out


def moe_experts_triton(x, w13, w2, topk_weights, topk_ids):
    return _moe_fused(x, w13, w2, topk_weights, topk_ids, MOE_SILU, 0.0, 0.0,
                      (MOE_GEMV_MAX_PAIRS, MOE_GEMV_ROWS, MOE_GEMV_BLOCK_K, MOE_GEMV_WARPS, MOE_BLOCK_M,
                       MOE_BLOCK_N, MOE_BLOCK_K, MOE_GROUP_M, MOE_NUM_WARPS, MOE_NUM_STAGES))


def moe_experts_clamp_triton(x, w13, w2, topk_weights, topk_ids, limit):
    return _moe_fused(x, w13, w2, topk_weights, topk_ids, MOE_CLAMP, float(limit), 0.0,
                      (MOEC_GEMV_MAX_PAIRS, MOEC_GEMV_ROWS, MOEC_GEMV_BLOCK_K, MOEC_GEMV_WARPS, MOEC_BLOCK_M,
                       MOEC_BLOCK_N, MOEC_BLOCK_K, MOEC_GROUP_M, MOEC_NUM_WARPS, MOEC_NUM_STAGES))


def moe_experts_situ_triton(x, w13, w2, topk_weights, topk_ids, beta, linear_beta):
    act, lb = (MOE_SITU, 1.0) if linear_beta is None else (MOE_SITU_LB, float(linear_beta))
    return _moe_fused(x, w13, w2, topk_weights, topk_ids, act, float(beta), lb,
                      (MOES_GEMV_MAX_PAIRS, MOES_GEMV_ROWS, MOES_GEMV_BLOCK_K, MOES_GEMV_WARPS, MOES_BLOCK_M,
                       MOES_BLOCK_N, MOES_BLOCK_K, MOES_GROUP_M, MOES_NUM_WARPS, MOES_NUM_STAGES))
