"""dense_gqa_decode_layer (DLAY_ knobs) and dense_gqa_decode_step (DSTP_) in Triton: one persistent kernel for a
whole Llama-style decoder layer at decode, its phases separated by grid barriers instead of kernel boundaries.

Grid: P programs (``DLAY_PROGRAMS``, at most one per SM: the barriers need every program resident, checked
before launch), each walking the units of a phase in steps of P. Phases (B rows, H hidden, N = (Hq + 2 Hk) Dh,
I intermediate; all sums in fp32, each op's output rounded to the activations' dtype where the reference
rounds it):

A. ``s = x + residual`` (rounded into ``new_residual``); per (row block, batch block) unit
   ``rms(s) * (s * g1) @ Wqkv[rows].T`` (+ bias), rounded, into an fp32 scratch [B, N]. Reads Wqkv once.
B. Split-KV flash decoding: unit (b, kv head, split) rotates its GQA group's queries and the new token's key
   from the scratch (neox, the token's cos/sin), reads the split's older keys and values through the block
   table and the new token's from the scratch; the split-0 unit writes the new key and value into the caches
   at ``slot_mapping`` (no K/V write launch; no unit reads that slot in this launch). Writes the unnormalised
   [G, Dh] accumulator and (max, sum) per head and split.
C. The splits merged on the fly into ``o`` [B, Hq Dh], ``h = o @ Wo.T``, ``new_residual = h + s``.
D. ``rms(r2) * (r2 * g2) @ Wgu.T`` for the gate and up rows of one block of I, ``silu(gate) * up`` to an
   fp32 scratch [B, I].
E. ``mlp_out = act @ Wd.T``.

Barrier: every program's stores, ``debug_barrier``, one release ``atomic_add`` on a counter, then acquire
reads until it reaches the phase's count; scratch written in the launch is read with ``.cg`` (past L1). A
fifth arrival after the last phase lets the last program zero the counter, so a CUDA-graph replay needs no
memset (one launch at a time per counter: launches on one stream). Under ``TRITON_INTERPRET=1`` (CPU
tensors) programs run one after another, so P is 1 there.

``dense_gqa_decode_step_triton`` (DSTP_ knobs, the same meanings): with ``DSTP_ONE_LAUNCH`` the whole step in one
persistent launch (``_dstp_step``: the embedding, every layer's five phases with its tensors read from an
address table, the residual ping-ponged between two buffers, the final norm + lm_head; 5 L + 1 barriers), else
the embedding gather, this kernel once per layer and the final add + RMSNorm and lm_head in torch (L + ~4
launches a step instead of ~10 L). Not done: the next phase's weights prefetched while a barrier waits.

Bytes per layer: the weights (N H + H Hq Dh + 2 I H + H I elements: llama-1b 60.8 M, 121.6 MB in bf16, ~37 us
at 3.3 TB/s), the K/V of B contexts, a few KB of scratch. Launches: 1 (the fine path: ~10). A GEMV unit streams
BLOCK_N rows x the whole reduction in BLOCK_K chunks (no split-K: no partials to reduce).
"""

import torch
import triton
import triton.language as tl

# ---- section ----
DLAY_PROGRAMS = 132          # persistent programs (capped at the GPU's SM count)
DLAY_BLOCK_N = 32            # output rows of a GEMV unit
DLAY_BLOCK_K = 256           # reduction chunk of the GEMVs
DLAY_BLOCK_B = 1             # batch rows of a unit (a larger batch walks its row blocks again)
DLAY_SPLITS = 16             # split-KV of the attention phase
DLAY_BLOCK_T = 32            # keys per attention tile
DLAY_NUM_WARPS = 8
DSTP_PROGRAMS = 132          # dense_gqa_decode_step: the same knobs for its layers' launches, its own values
DSTP_BLOCK_N = 32
DSTP_BLOCK_K = 256
DSTP_BLOCK_B = 1
DSTP_SPLITS = 16
DSTP_BLOCK_T = 32
DSTP_NUM_WARPS = 8
DSTP_ONE_LAUNCH = 0          # 1: the whole step in one persistent launch (a megakernel); 0: one launch a layer

_DLAY_COUNTERS: dict = {}    # device -> int32[1] barrier counter, zero between launches
_DSTP_TABLES: dict = {}      # (device, the layers' tensors' addresses) -> int64 [L, 9] address table on the device


@triton.jit
def _dlay_sync(bar_ptr, target):
    """Grid barrier: the stores every program made before it are visible to every program after it."""
    tl.debug_barrier()
    tl.atomic_add(bar_ptr, 1, sem="release", scope="gpu")
    seen = tl.atomic_add(bar_ptr, 0, sem="acquire", scope="gpu")
    while seen < target:
        seen = tl.atomic_add(bar_ptr, 0, sem="acquire", scope="gpu")
    tl.debug_barrier()


@triton.jit
def _dlay_acc0(BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """A GEMV unit's accumulator: one row: [BLOCK_N, BLOCK_K] products, reduced once after the loop (no
    cross-thread sum a chunk); more rows: [BLOCK_B, BLOCK_N] sums."""
    if BLOCK_B == 1:
        acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)
    else:
        acc = tl.zeros([BLOCK_B, BLOCK_N], dtype=tl.float32)
    return acc


@triton.jit
def _dlay_fma(acc, a, w, BLOCK_B: tl.constexpr):
    """acc + a [BLOCK_B, BLOCK_K] (fp32) times w [BLOCK_N, BLOCK_K] (the weights' dtype)."""
    if BLOCK_B == 1:
        out = acc + w.to(tl.float32) * a
    else:
        out = acc + tl.sum(a[:, None, :] * w.to(tl.float32)[None, :, :], axis=2)
    return out


@triton.jit
def _dlay_total(acc, BLOCK_B: tl.constexpr):
    """[BLOCK_B, BLOCK_N] of an accumulator from ``_dlay_acc0``."""
    if BLOCK_B == 1:
        out = tl.sum(acc, axis=1)[None, :]
    else:
        out = acc
    return out


@triton.jit
def _dlay_sum(x_ptr, r_ptr, off, mask):
    """x + residual in fp32, both read past L1 (in the one-launch step the previous layer wrote them)."""
    x = tl.load(x_ptr + off, mask=mask, other=0.0, cache_modifier=".cg").to(tl.float32)
    return x + tl.load(r_ptr + off, mask=mask, other=0.0, cache_modifier=".cg").to(tl.float32)


@triton.jit
def _dlay_qkv(x_ptr, r_ptr, g_ptr, w_ptr, b_ptr, qkv_ptr, res_ptr, B, H, N, eps, HAS_BIAS: tl.constexpr,
              BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Phase A: new_residual = x + residual (rounded); per (row block, batch block) unit
    qkv = rms(s) * (s * g1) @ Wqkv.T (+ bias), rounded, into the fp32 scratch [B, N] (rotary: phase B)."""
    pid, P = tl.program_id(0), tl.num_programs(0)
    kk = tl.arange(0, BLOCK_K)
    bb = tl.arange(0, BLOCK_B)
    for c in range(pid * BLOCK_K, H, P * BLOCK_K):
        for b0 in range(0, B, BLOCK_B):
            b = b0 + bb
            m = (b[:, None] < B) & (c + kk[None, :] < H)
            off = b[:, None] * H + c + kk[None, :]
            s = _dlay_sum(x_ptr, r_ptr, off, m)
            tl.store(res_ptr + off, s.to(res_ptr.dtype.element_ty), mask=m)
    nn = tl.cdiv(N, BLOCK_N)
    for u in range(pid, nn * tl.cdiv(B, BLOCK_B), P):
        n = (u % nn) * BLOCK_N + tl.arange(0, BLOCK_N)
        b = (u // nn) * BLOCK_B + bb
        nmask = n < N
        bmask = b < B
        acc = _dlay_acc0(BLOCK_B, BLOCK_N, BLOCK_K)
        ss = tl.zeros([BLOCK_B, BLOCK_K], dtype=tl.float32)
        for k0 in range(0, H, BLOCK_K):
            k = k0 + kk
            kmask = k < H
            xm = bmask[:, None] & kmask[None, :]
            off = b[:, None] * H + k[None, :]
            s = _dlay_sum(x_ptr, r_ptr, off, xm)
            ss += s * s
            a = s * tl.load(g_ptr + k, mask=kmask, other=0.0).to(tl.float32)[None, :]
            w = tl.load(w_ptr + n[:, None] * H + k[None, :], mask=nmask[:, None] & kmask[None, :], other=0.0)
            acc = _dlay_fma(acc, a, w, BLOCK_B)
        y = _dlay_total(acc, BLOCK_B) * tl.rsqrt(tl.sum(ss, axis=1) / H + eps)[:, None]
        if HAS_BIAS:
            y += tl.load(b_ptr + n, mask=nmask, other=0.0).to(tl.float32)[None, :]
        tl.store(qkv_ptr + b[:, None] * N + n[None, :], y.to(res_ptr.dtype.element_ty).to(tl.float32),
                 mask=bmask[:, None] & nmask[None, :])


@triton.jit
def _dlay_rotated(qkv_ptr, row, head, d, partner, dmask, cos, sin, Dh, R, HALF, ROTATE: tl.constexpr):
    """[..., BLOCK_D] of ``head`` (any shape) of token ``row``'s qkv scratch, neox-rotated (fp32 of the dtype-rounded
    value the rotary op returns; ``cos``/``sin`` its token's, broadcastable)."""
    y = tl.load(qkv_ptr + row + head * Dh + d, mask=dmask, other=0.0, cache_modifier=".cg")
    if ROTATE:
        yp = tl.load(qkv_ptr + row + head * Dh + partner, mask=dmask & (d < R), other=0.0, cache_modifier=".cg")
        sign = tl.where(d < HALF, -1.0, 1.0)
        y = tl.where(d < R, y * cos + sign * yp * sin, y)
    return y


@triton.jit
def _dlay_attention(qkv_ptr, pos_ptr, cs_ptr, slot_ptr, kc_ptr, vc_ptr, tab_ptr, len_ptr, pacc_ptr, pml_ptr,
                    B, N, Hq, Hk, Dh, R, HALF, BS, stride_cs, stride_tab, skb, sko, skh, svb, svo, svh, scale,
                    SPLITS: tl.constexpr, GROUP: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_D: tl.constexpr,
                    BLOCK_T: tl.constexpr):
    """Phase B: unit (b, kv head, split): the group's queries and the new token's key rotated from the qkv
    scratch; online softmax over the split's keys, the new token's from the scratch (the split-0 unit writes it and
    its value into the caches: no unit reads that slot from them in this launch)."""
    pid, P = tl.program_id(0), tl.num_programs(0)
    d = tl.arange(0, BLOCK_D)
    g = tl.arange(0, BLOCK_G)
    tt = tl.arange(0, BLOCK_T)
    dmask = d < Dh
    gmask = g < GROUP
    partner = tl.where(d < HALF, d + HALF, d - HALF)
    j = tl.where(d < HALF, d, d - HALF)
    for u in range(pid, B * Hk * SPLITS, P):
        sp = u % SPLITS
        kh = (u // SPLITS) % Hk
        b = u // (SPLITS * Hk)
        n = tl.load(len_ptr + b)
        pos = tl.load(pos_ptr + b)
        cos = tl.load(cs_ptr + pos * stride_cs + j, mask=d < R, other=1.0).to(tl.float32)
        sin = tl.load(cs_ptr + pos * stride_cs + HALF + j, mask=d < R, other=0.0).to(tl.float32)
        qm = gmask[:, None] & dmask[None, :]
        q = _dlay_rotated(qkv_ptr, b * N, (kh * GROUP + g)[:, None], d[None, :], partner[None, :], qm,
                          cos[None, :], sin[None, :], Dh, R, HALF, True)
        q = q.to(kc_ptr.dtype.element_ty).to(tl.float32)                                       # [G, D]
        k_new = _dlay_rotated(qkv_ptr, b * N, Hq + kh, d, partner, dmask, cos, sin, Dh, R, HALF, True)
        k_new = k_new.to(kc_ptr.dtype.element_ty)
        v_new = _dlay_rotated(qkv_ptr, b * N, Hq + Hk + kh, d, partner, dmask, cos, sin, Dh, R, HALF, False)
        v_new = v_new.to(vc_ptr.dtype.element_ty)
        if sp == 0:
            slot = tl.load(slot_ptr + b).to(tl.int64)
            blk_new, o_new = slot // BS, slot % BS
            tl.store(kc_ptr + blk_new * skb + o_new * sko + kh * skh + d, k_new, mask=dmask)
            tl.store(vc_ptr + blk_new * svb + o_new * svo + kh * svh + d, v_new, mask=dmask)
        chunk = tl.cdiv(tl.cdiv(n, SPLITS), BLOCK_T) * BLOCK_T
        start = sp * chunk
        stop = tl.minimum(n, start + chunk)
        m = tl.full([BLOCK_G], float("-inf"), dtype=tl.float32)
        l = tl.zeros([BLOCK_G], dtype=tl.float32)
        acc = tl.zeros([BLOCK_G, BLOCK_D], dtype=tl.float32)
        for t0 in range(start, stop, BLOCK_T):
            t = t0 + tt
            tmask = t < stop
            new = (t == n - 1)[:, None]                                 # the token of this step: from the scratch
            blk = tl.load(tab_ptr + b * stride_tab + t // BS, mask=tmask, other=0).to(tl.int64)
            km = (tmask & (t < n - 1))[:, None] & dmask[None, :]
            koff = (blk * skb + (t % BS) * sko + kh * skh)[:, None] + d[None, :]
            k = tl.where(new, k_new[None, :], tl.load(kc_ptr + koff, mask=km, other=0.0)).to(tl.float32)   # [T, D]
            s = tl.sum(q[:, None, :] * k[None, :, :], axis=2) * scale                                   # [G, T]
            s = tl.where(tmask[None, :], s, float("-inf"))
            m_new = tl.maximum(m, tl.max(s, axis=1))
            alpha = tl.exp(m - m_new)
            p = tl.exp(s - m_new[:, None])
            voff = (blk * svb + (t % BS) * svo + kh * svh)[:, None] + d[None, :]
            v = tl.where(new, v_new[None, :], tl.load(vc_ptr + voff, mask=km, other=0.0)).to(tl.float32)  # [T, D]
            l = l * alpha + tl.sum(p, axis=1)
            acc = acc * alpha[:, None] + tl.sum(p[:, :, None] * v[None, :, :], axis=1)
            m = m_new
        row = (b * Hq + kh * GROUP + g) * SPLITS + sp                                            # [G]
        tl.store(pacc_ptr + row[:, None] * Dh + d[None, :], acc, mask=qm)
        tl.store(pml_ptr + row * 2, m, mask=gmask)
        tl.store(pml_ptr + row * 2 + 1, l, mask=gmask)


@triton.jit
def _dlay_o_proj(pacc_ptr, pml_ptr, w_ptr, res_ptr, B, H, Hq, Dh, SPLITS: tl.constexpr, BLOCK_B: tl.constexpr,
                 BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """Phase C: the splits merged into o (rounded, as the attention op returns it), h = o @ Wo.T rounded,
    new_residual = h + s (each (row, column) read and written by its own unit only)."""
    pid, P = tl.program_id(0), tl.num_programs(0)
    K = Hq * Dh
    nn = tl.cdiv(H, BLOCK_N)
    kk = tl.arange(0, BLOCK_K)
    bb = tl.arange(0, BLOCK_B)
    for u in range(pid, nn * tl.cdiv(B, BLOCK_B), P):
        n = (u % nn) * BLOCK_N + tl.arange(0, BLOCK_N)
        b = (u // nn) * BLOCK_B + bb
        nmask = n < H
        bmask = b < B
        acc = _dlay_acc0(BLOCK_B, BLOCK_N, BLOCK_K)
        for k0 in range(0, K, BLOCK_K):
            k = k0 + kk
            kmask = k < K
            om = bmask[:, None] & kmask[None, :]
            base = (b[:, None] * Hq + (k // Dh)[None, :]) * SPLITS                              # [BB, BK]
            top = tl.full([BLOCK_B, BLOCK_K], float("-inf"), dtype=tl.float32)
            for sp in tl.static_range(SPLITS):
                top = tl.maximum(top, tl.load(pml_ptr + (base + sp) * 2, mask=om, other=0.0, cache_modifier=".cg"))
            num = tl.zeros([BLOCK_B, BLOCK_K], dtype=tl.float32)
            den = tl.zeros([BLOCK_B, BLOCK_K], dtype=tl.float32)
            for sp in tl.static_range(SPLITS):
                wsp = tl.exp(tl.load(pml_ptr + (base + sp) * 2, mask=om, other=0.0, cache_modifier=".cg") - top)
                den += wsp * tl.load(pml_ptr + (base + sp) * 2 + 1, mask=om, other=1.0, cache_modifier=".cg")
                num += wsp * tl.load(pacc_ptr + (base + sp) * Dh + (k % Dh)[None, :], mask=om, other=0.0,
                                     cache_modifier=".cg")
            o = (num / den).to(w_ptr.dtype.element_ty).to(tl.float32)
            w = tl.load(w_ptr + n[:, None] * K + k[None, :], mask=nmask[:, None] & kmask[None, :], other=0.0)
            acc = _dlay_fma(acc, o, w, BLOCK_B)
        h = _dlay_total(acc, BLOCK_B).to(res_ptr.dtype.element_ty).to(tl.float32)
        rm = bmask[:, None] & nmask[None, :]
        off = b[:, None] * H + n[None, :]
        r = tl.load(res_ptr + off, mask=rm, other=0.0, cache_modifier=".cg").to(tl.float32)
        tl.store(res_ptr + off, (h + r).to(res_ptr.dtype.element_ty), mask=rm)


@triton.jit
def _dlay_gate_up(res_ptr, g_ptr, w_ptr, act_ptr, B, H, I, eps, BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr):
    """Phase D: rms(r2) * (r2 * g2) against the gate and up rows of one block of I; silu(gate) * up rounded."""
    pid, P = tl.program_id(0), tl.num_programs(0)
    ni = tl.cdiv(I, BLOCK_N)
    kk = tl.arange(0, BLOCK_K)
    bb = tl.arange(0, BLOCK_B)
    for u in range(pid, ni * tl.cdiv(B, BLOCK_B), P):
        j = (u % ni) * BLOCK_N + tl.arange(0, BLOCK_N)
        b = (u // ni) * BLOCK_B + bb
        jmask = j < I
        bmask = b < B
        gate = _dlay_acc0(BLOCK_B, BLOCK_N, BLOCK_K)
        up = _dlay_acc0(BLOCK_B, BLOCK_N, BLOCK_K)
        ss = tl.zeros([BLOCK_B, BLOCK_K], dtype=tl.float32)
        for k0 in range(0, H, BLOCK_K):
            k = k0 + kk
            kmask = k < H
            r = tl.load(res_ptr + b[:, None] * H + k[None, :], mask=bmask[:, None] & kmask[None, :], other=0.0,
                        cache_modifier=".cg").to(tl.float32)
            ss += r * r
            a = r * tl.load(g_ptr + k, mask=kmask, other=0.0).to(tl.float32)[None, :]
            wm = jmask[:, None] & kmask[None, :]
            wg = tl.load(w_ptr + j[:, None] * H + k[None, :], mask=wm, other=0.0)
            wu = tl.load(w_ptr + (I + j)[:, None] * H + k[None, :], mask=wm, other=0.0)
            gate = _dlay_fma(gate, a, wg, BLOCK_B)
            up = _dlay_fma(up, a, wu, BLOCK_B)
        rms = tl.rsqrt(tl.sum(ss, axis=1) / H + eps)[:, None]
        gate = (_dlay_total(gate, BLOCK_B) * rms).to(w_ptr.dtype.element_ty).to(tl.float32)
        up = (_dlay_total(up, BLOCK_B) * rms).to(w_ptr.dtype.element_ty).to(tl.float32)
        act = (gate / (1.0 + tl.exp(-gate)) * up).to(w_ptr.dtype.element_ty).to(tl.float32)
        tl.store(act_ptr + b[:, None] * I + j[None, :], act, mask=bmask[:, None] & jmask[None, :])


@triton.jit
def _dlay_down(act_ptr, w_ptr, out_ptr, B, H, I, BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr,
               BLOCK_K: tl.constexpr):
    """Phase E: mlp_out = act @ Wd.T."""
    pid, P = tl.program_id(0), tl.num_programs(0)
    nn = tl.cdiv(H, BLOCK_N)
    kk = tl.arange(0, BLOCK_K)
    bb = tl.arange(0, BLOCK_B)
    for u in range(pid, nn * tl.cdiv(B, BLOCK_B), P):
        n = (u % nn) * BLOCK_N + tl.arange(0, BLOCK_N)
        b = (u // nn) * BLOCK_B + bb
        nmask = n < H
        bmask = b < B
        acc = _dlay_acc0(BLOCK_B, BLOCK_N, BLOCK_K)
        for k0 in range(0, I, BLOCK_K):
            k = k0 + kk
            kmask = k < I
            a = tl.load(act_ptr + b[:, None] * I + k[None, :], mask=bmask[:, None] & kmask[None, :], other=0.0,
                        cache_modifier=".cg")
            w = tl.load(w_ptr + n[:, None] * I + k[None, :], mask=nmask[:, None] & kmask[None, :], other=0.0)
            acc = _dlay_fma(acc, a, w, BLOCK_B)
        tl.store(out_ptr + b[:, None] * H + n[None, :], _dlay_total(acc, BLOCK_B).to(out_ptr.dtype.element_ty),
                 mask=bmask[:, None] & nmask[None, :])


@triton.jit
def _dlay_layer(x_ptr, r_ptr, pos_ptr, kc_ptr, vc_ptr, slot_ptr, tab_ptr, len_ptr, g1_ptr, wqkv_ptr, bqkv_ptr,
                wo_ptr, g2_ptr, wgu_ptr, wd_ptr, cs_ptr, out_ptr, res_ptr, qkv_ptr, pacc_ptr, pml_ptr, act_ptr,
                bar_ptr, B, H, I, Hq, Hk, Dh, R, HALF, eps, scale, stride_cs, BS, stride_tab,
                skb, sko, skh, svb, svo, svh, HAS_BIAS: tl.constexpr, GROUP: tl.constexpr, BLOCK_G: tl.constexpr,
                BLOCK_D: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                SPLITS: tl.constexpr, BLOCK_T: tl.constexpr):
    P = tl.num_programs(0)
    N = (Hq + 2 * Hk) * Dh
    _dlay_qkv(x_ptr, r_ptr, g1_ptr, wqkv_ptr, bqkv_ptr, qkv_ptr, res_ptr, B, H, N, eps, HAS_BIAS, BLOCK_B, BLOCK_N,
              BLOCK_K)
    _dlay_sync(bar_ptr, P)
    _dlay_attention(qkv_ptr, pos_ptr, cs_ptr, slot_ptr, kc_ptr, vc_ptr, tab_ptr, len_ptr, pacc_ptr, pml_ptr,
                    B, N, Hq, Hk, Dh, R, HALF, BS, stride_cs, stride_tab, skb, sko, skh, svb, svo, svh, scale,
                    SPLITS, GROUP, BLOCK_G, BLOCK_D, BLOCK_T)
    _dlay_sync(bar_ptr, 2 * P)
    _dlay_o_proj(pacc_ptr, pml_ptr, wo_ptr, res_ptr, B, H, Hq, Dh, SPLITS, BLOCK_B, BLOCK_N, BLOCK_K)
    _dlay_sync(bar_ptr, 3 * P)
    _dlay_gate_up(res_ptr, g2_ptr, wgu_ptr, act_ptr, B, H, I, eps, BLOCK_B, BLOCK_N, BLOCK_K)
    _dlay_sync(bar_ptr, 4 * P)
    _dlay_down(act_ptr, wd_ptr, out_ptr, B, H, I, BLOCK_B, BLOCK_N, BLOCK_K)
    # every program is past the last barrier once all have arrived here: the last one zeroes the counter
    tl.debug_barrier()
    if tl.atomic_add(bar_ptr, 1, sem="acq_rel", scope="gpu") == 5 * P - 1:
        tl.atomic_xchg(bar_ptr, 0, sem="relaxed", scope="gpu")


@triton.jit
def _dstp_embed(ids_ptr, embed_ptr, x_ptr, r_ptr, B, H, BLOCK_K: tl.constexpr):
    """x = embed[ids]; the residual of layer 0 = 0."""
    pid, P = tl.program_id(0), tl.num_programs(0)
    kk = tl.arange(0, BLOCK_K)
    nk = tl.cdiv(H, BLOCK_K)
    for u in range(pid, B * nk, P):
        b = u // nk
        k = (u % nk) * BLOCK_K + kk
        m = k < H
        row = tl.load(ids_ptr + b).to(tl.int64)
        tl.store(x_ptr + b * H + k, tl.load(embed_ptr + row * H + k, mask=m, other=0.0), mask=m)
        tl.store(r_ptr + b * H + k, tl.zeros([BLOCK_K], dtype=tl.float32).to(r_ptr.dtype.element_ty), mask=m)


@triton.jit
def _dstp_lm_head(x_ptr, r_ptr, g_ptr, w_ptr, out_ptr, B, H, V, eps, BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr,
                  BLOCK_K: tl.constexpr):
    """logits = rms(x + r) * ((x + r) * g) @ W.T, rounded to the weights' dtype, stored fp32."""
    pid, P = tl.program_id(0), tl.num_programs(0)
    nn = tl.cdiv(V, BLOCK_N)
    kk = tl.arange(0, BLOCK_K)
    bb = tl.arange(0, BLOCK_B)
    for u in range(pid, nn * tl.cdiv(B, BLOCK_B), P):
        n = (u % nn) * BLOCK_N + tl.arange(0, BLOCK_N)
        b = (u // nn) * BLOCK_B + bb
        nmask = n < V
        bmask = b < B
        acc = _dlay_acc0(BLOCK_B, BLOCK_N, BLOCK_K)
        ss = tl.zeros([BLOCK_B, BLOCK_K], dtype=tl.float32)
        for k0 in range(0, H, BLOCK_K):
            k = k0 + kk
            kmask = k < H
            xm = bmask[:, None] & kmask[None, :]
            off = b[:, None] * H + k[None, :]
            sv = _dlay_sum(x_ptr, r_ptr, off, xm)
            ss += sv * sv
            a = sv * tl.load(g_ptr + k, mask=kmask, other=0.0).to(tl.float32)[None, :]
            w = tl.load(w_ptr + n[:, None] * H + k[None, :], mask=nmask[:, None] & kmask[None, :], other=0.0)
            acc = _dlay_fma(acc, a, w, BLOCK_B)
        y = (_dlay_total(acc, BLOCK_B) * tl.rsqrt(tl.sum(ss, axis=1) / H + eps)[:, None])
        y = y.to(w_ptr.dtype.element_ty).to(tl.float32)
        tl.store(out_ptr + b[:, None] * V + n[None, :], y, mask=bmask[:, None] & nmask[None, :])


@triton.jit
def _dstp_step(ids_ptr, embed_ptr, pos_ptr, slot_ptr, tab_ptr, len_ptr, tbl_ptr, g1_0, wqkv_0, bqkv_0, wo_0, g2_0,
               wgu_0, wd_0, kc_0, vc_0, gf_ptr, lm_ptr, cs_ptr, logits_ptr, x_ptr, rbuf_ptr, qkv_ptr, pacc_ptr,
               pml_ptr, act_ptr, bar_ptr, L, B, H, I, V, Hq, Hk, Dh, R, HALF, eps, scale, stride_cs, BS, stride_tab,
               skb, sko, skh, svb, svo, svh, HAS_BIAS: tl.constexpr, GROUP: tl.constexpr, BLOCK_G: tl.constexpr,
               BLOCK_D: tl.constexpr, BLOCK_B: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
               SPLITS: tl.constexpr, BLOCK_T: tl.constexpr):
    """The whole decode step in one launch: the embedding, each layer's five phases (the layer's tensors read from
    the address table ``tbl`` [L, 9]: input_norm, qkv_weight, qkv_bias, o_weight, post_norm, gate_up, down,
    k_cache, v_cache; typed as layer 0's), the residual ping-ponged between the two halves of ``rbuf`` [2, B, H]
    (a layer reads one, writes the other), the final norm + lm_head; 5 L + 1 grid barriers."""
    P = tl.num_programs(0)
    N = (Hq + 2 * Hk) * Dh
    _dstp_embed(ids_ptr, embed_ptr, x_ptr, rbuf_ptr, B, H, BLOCK_K)
    _dlay_sync(bar_ptr, P)
    for li in range(0, L):
        row = tbl_ptr + li * 9
        g1 = tl.load(row).to(g1_0.dtype)
        wqkv = tl.load(row + 1).to(wqkv_0.dtype)
        bqkv = tl.load(row + 2).to(bqkv_0.dtype)
        wo = tl.load(row + 3).to(wo_0.dtype)
        g2 = tl.load(row + 4).to(g2_0.dtype)
        wgu = tl.load(row + 5).to(wgu_0.dtype)
        wd = tl.load(row + 6).to(wd_0.dtype)
        kc = tl.load(row + 7).to(kc_0.dtype)
        vc = tl.load(row + 8).to(vc_0.dtype)
        r_in = rbuf_ptr + (li % 2) * B * H
        r_out = rbuf_ptr + ((li + 1) % 2) * B * H
        _dlay_qkv(x_ptr, r_in, g1, wqkv, bqkv, qkv_ptr, r_out, B, H, N, eps, HAS_BIAS, BLOCK_B, BLOCK_N, BLOCK_K)
        _dlay_sync(bar_ptr, (5 * li + 2) * P)
        _dlay_attention(qkv_ptr, pos_ptr, cs_ptr, slot_ptr, kc, vc, tab_ptr, len_ptr, pacc_ptr, pml_ptr,
                        B, N, Hq, Hk, Dh, R, HALF, BS, stride_cs, stride_tab, skb, sko, skh, svb, svo, svh, scale,
                        SPLITS, GROUP, BLOCK_G, BLOCK_D, BLOCK_T)
        _dlay_sync(bar_ptr, (5 * li + 3) * P)
        _dlay_o_proj(pacc_ptr, pml_ptr, wo, r_out, B, H, Hq, Dh, SPLITS, BLOCK_B, BLOCK_N, BLOCK_K)
        _dlay_sync(bar_ptr, (5 * li + 4) * P)
        _dlay_gate_up(r_out, g2, wgu, act_ptr, B, H, I, eps, BLOCK_B, BLOCK_N, BLOCK_K)
        _dlay_sync(bar_ptr, (5 * li + 5) * P)
        _dlay_down(act_ptr, wd, x_ptr, B, H, I, BLOCK_B, BLOCK_N, BLOCK_K)
        _dlay_sync(bar_ptr, (5 * li + 6) * P)
    _dstp_lm_head(x_ptr, rbuf_ptr + (L % 2) * B * H, gf_ptr, lm_ptr, logits_ptr, B, H, V, eps, BLOCK_B, BLOCK_N,
                  BLOCK_K)
    tl.debug_barrier()
    if tl.atomic_add(bar_ptr, 1, sem="acq_rel", scope="gpu") == (5 * L + 2) * P - 1:
        tl.atomic_xchg(bar_ptr, 0, sem="relaxed", scope="gpu")


def _dlay_programs(device, programs: int) -> int:
    """The persistent grid: ``programs``, at most one program per SM (the barriers need all of them resident
    at once); 1 under the interpreter (CPU tensors), which runs programs one after another."""
    if device.type != "cuda":
        return 1
    return max(1, min(programs, torch.cuda.get_device_properties(device).multi_processor_count))


def _dlay_counter(device) -> torch.Tensor:
    key = str(device)
    if key not in _DLAY_COUNTERS:
        _DLAY_COUNTERS[key] = torch.zeros(1, dtype=torch.int32, device=device)
    return _DLAY_COUNTERS[key]


def _dlay_launch(x, residual, positions, k_cache, v_cache, slot_mapping, block_tables, context_lens, input_norm,
                 qkv_weight, qkv_bias, o_weight, post_norm, gate_up_weight, down_weight, cos_sin_cache, eps, scale,
                 rotary_dim, num_heads, num_kv_heads, *, programs, block_n, block_k, block_b, splits, block_t,
                 num_warps):
    """One layer in one launch: (mlp_out [B, H], new_residual [B, H]); the caches written at slot_mapping."""
    B, H = x.shape
    hq, hk = int(num_heads), int(num_kv_heads)
    dh, inter = k_cache.shape[-1], down_weight.shape[1]
    dev, dtype = x.device, x.dtype
    if k_cache.stride(-1) != 1 or v_cache.stride(-1) != 1:
        raise ValueError("the persistent layer needs caches with a unit last stride")
    grid = _dlay_programs(dev, programs)
    out = torch.empty((B, H), dtype=dtype, device=dev)
    res = torch.empty((B, H), dtype=dtype, device=dev)
    qkv = torch.empty((B, (hq + 2 * hk) * dh), dtype=torch.float32, device=dev)
    pacc = torch.empty((B, hq, splits, dh), dtype=torch.float32, device=dev)
    pml = torch.empty((B, hq, splits, 2), dtype=torch.float32, device=dev)
    act = torch.empty((B, inter), dtype=torch.float32, device=dev)
    cs = cos_sin_cache if cos_sin_cache.stride(-1) == 1 else cos_sin_cache.contiguous()
    tables = block_tables if block_tables.stride(-1) == 1 else block_tables.contiguous()
    group = hq // hk
    _dlay_layer[(grid,)](
        x.contiguous(), residual.contiguous(), positions, k_cache, v_cache, slot_mapping, tables, context_lens,
        input_norm, qkv_weight.contiguous(), qkv_bias if qkv_bias is not None else input_norm, o_weight.contiguous(),
        post_norm, gate_up_weight.contiguous(), down_weight.contiguous(), cs, out, res, qkv, pacc, pml, act,
        _dlay_counter(dev), B, H, inter, hq, hk, dh, int(rotary_dim), int(rotary_dim) // 2, float(eps),
        float(scale), cs.stride(0), k_cache.shape[1], tables.stride(0), k_cache.stride(0), k_cache.stride(1),
        k_cache.stride(2), v_cache.stride(0), v_cache.stride(1), v_cache.stride(2),
        HAS_BIAS=qkv_bias is not None, GROUP=group, BLOCK_G=triton.next_power_of_2(group),
        BLOCK_D=triton.next_power_of_2(dh), BLOCK_B=block_b, BLOCK_N=block_n, BLOCK_K=block_k,
        SPLITS=splits, BLOCK_T=block_t, num_warps=num_warps)
    return out, res


def dense_gqa_decode_layer_triton(x, residual, positions, k_cache, v_cache, slot_mapping, block_tables, context_lens,
                                  input_norm, qkv_weight, qkv_bias, o_weight, post_norm, gate_up_weight, down_weight,
                                  cos_sin_cache, eps, scale, rotary_dim, num_heads, num_kv_heads):
    return _dlay_launch(x, residual, positions, k_cache, v_cache, slot_mapping, block_tables, context_lens,
                        input_norm, qkv_weight, qkv_bias, o_weight, post_norm, gate_up_weight, down_weight,
                        cos_sin_cache, eps, scale, rotary_dim, num_heads, num_kv_heads, programs=DLAY_PROGRAMS,
                        block_n=DLAY_BLOCK_N, block_k=DLAY_BLOCK_K, block_b=DLAY_BLOCK_B, splits=DLAY_SPLITS,
                        block_t=DLAY_BLOCK_T, num_warps=DLAY_NUM_WARPS)


def _dstp_table(layer_weights, k_caches, v_caches, device) -> torch.Tensor:
    """The layers' tensors' addresses [L * 9] on the device, built once per set of tensors (on the eager warm-up
    call that precedes a CUDA-graph capture; 16 sets kept)."""
    cols = [(*(w if w is not None else ws[0] for w in ws), kc, vc) for ws, kc, vc in zip(layer_weights, k_caches,
                                                                                         v_caches)]
    key = (str(device), tuple((t.data_ptr(), tuple(t.shape)) for c in cols for t in c))
    if key not in _DSTP_TABLES:
        while len(_DSTP_TABLES) >= 16:
            _DSTP_TABLES.pop(next(iter(_DSTP_TABLES)))
        _DSTP_TABLES[key] = torch.tensor([t.data_ptr() for c in cols for t in c], dtype=torch.int64).to(device)
    return _DSTP_TABLES[key]


def _dstp_one_launch(token_ids, positions, slot_mapping, block_tables, context_lens, embed, final_norm, lm_head_weight,
                     layer_weights, k_caches, v_caches, cos_sin_cache, eps, scale, rotary_dim, hq, hk):
    B, (V, H) = token_ids.shape[0], embed.shape
    w0, kc0, vc0 = layer_weights[0], k_caches[0], v_caches[0]
    if any(t.stride(-1) != 1 for t in (*k_caches, *v_caches)) or any(
            (kc.stride(), vc.stride()) != (kc0.stride(), vc0.stride()) for kc, vc in zip(k_caches, v_caches)) or any(
            not t.is_contiguous() for ws in layer_weights for t in ws if t is not None):
        raise ValueError("the one-launch step needs contiguous weights and caches of one layout")
    dh, inter, dev, dtype = kc0.shape[-1], w0[6].shape[1], embed.device, embed.dtype
    grid = _dlay_programs(dev, DSTP_PROGRAMS)
    x = torch.empty((B, H), dtype=dtype, device=dev)
    rbuf = torch.empty((2, B, H), dtype=dtype, device=dev)
    qkv = torch.empty((B, (hq + 2 * hk) * dh), dtype=torch.float32, device=dev)
    pacc = torch.empty((B, hq, DSTP_SPLITS, dh), dtype=torch.float32, device=dev)
    pml = torch.empty((B, hq, DSTP_SPLITS, 2), dtype=torch.float32, device=dev)
    act = torch.empty((B, inter), dtype=torch.float32, device=dev)
    logits = torch.empty((B, V), dtype=torch.float32, device=dev)
    cs = cos_sin_cache if cos_sin_cache.stride(-1) == 1 else cos_sin_cache.contiguous()
    tables = block_tables if block_tables.stride(-1) == 1 else block_tables.contiguous()
    group = hq // hk
    _dstp_step[(grid,)](
        token_ids, embed.contiguous(), positions, slot_mapping, tables, context_lens,
        _dstp_table(layer_weights, k_caches, v_caches, dev), w0[0], w0[1], w0[2] if w0[2] is not None else w0[0],
        w0[3], w0[4], w0[5], w0[6], kc0, vc0, final_norm, lm_head_weight.contiguous(), cs, logits, x, rbuf, qkv, pacc,
        pml, act, _dlay_counter(dev), len(layer_weights), B, H, inter, V, hq, hk, dh, int(rotary_dim),
        int(rotary_dim) // 2, float(eps), float(scale), cs.stride(0), kc0.shape[1], tables.stride(0), kc0.stride(0),
        kc0.stride(1), kc0.stride(2), vc0.stride(0), vc0.stride(1), vc0.stride(2), HAS_BIAS=w0[2] is not None,
        GROUP=group, BLOCK_G=triton.next_power_of_2(group), BLOCK_D=triton.next_power_of_2(dh), BLOCK_B=DSTP_BLOCK_B,
        BLOCK_N=DSTP_BLOCK_N, BLOCK_K=DSTP_BLOCK_K, SPLITS=DSTP_SPLITS, BLOCK_T=DSTP_BLOCK_T, num_warps=DSTP_NUM_WARPS)
    return logits


def dense_gqa_decode_step_triton(token_ids, positions, slot_mapping, block_tables, context_lens, embed, final_norm,
                                 lm_head_weight, layer_weights, k_caches, v_caches, cos_sin_cache, eps, scale,
                                 rotary_dim, num_heads, num_kv_heads):
    """The decode step: with DSTP_ONE_LAUNCH one persistent launch (``_dstp_step``), else the embedding gather,
    one persistent launch per layer, the final add + RMSNorm and the lm_head in torch (L + ~4 launches)."""
    hq, hk = int(num_heads), int(num_kv_heads)
    if DSTP_ONE_LAUNCH:
        return _dstp_one_launch(token_ids, positions, slot_mapping, block_tables, context_lens, embed, final_norm,
                                lm_head_weight, layer_weights, k_caches, v_caches, cos_sin_cache, eps, scale,
                                rotary_dim, hq, hk)
    x = torch.nn.functional.embedding(token_ids, embed)
    residual = torch.zeros_like(x)
    for weights, kc, vc in zip(layer_weights, k_caches, v_caches):
        x, residual = _dlay_launch(x, residual, positions, kc, vc, slot_mapping, block_tables, context_lens, *weights,
                                   cos_sin_cache, eps, scale, rotary_dim, hq, hk, programs=DSTP_PROGRAMS,
                                   block_n=DSTP_BLOCK_N, block_k=DSTP_BLOCK_K, block_b=DSTP_BLOCK_B,
                                   splits=DSTP_SPLITS, block_t=DSTP_BLOCK_T, num_warps=DSTP_NUM_WARPS)
    s = x.float() + residual.float()
    h = (s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + eps) * final_norm.float()).to(x.dtype)
    return torch.nn.functional.linear(h, lm_head_weight).float()
