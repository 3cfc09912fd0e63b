"""The kernels of the linear template family, written once: split-K GEMV, tiled ``tl.dot`` GEMM, swap-AB skinny
GEMM (``_sg_skinny``: serving batches of 16-256 rows on the tensor cores, W as the MMA's large side), split-K reduce.

Not a template of its own: ``triton_linear_gemv``, ``triton_linear_tiled``, ``triton_linear_skinny``,
``triton_add_rms_norm_linear``, ``triton_silu_mul_linear`` and ``triton_add_rms_norm_qkv_rotary`` import these
names in their header, and ``render_candidate`` inlines the ones a candidate's templates use (and what those
call) once, after their sections, so a candidate still imports nothing of tkcc. The members differ in the A tile's prologue, a
constexpr resolved at compile time (each member compiles to the kernels its own file used to hold):

- ``PROLOGUE == 0`` plain: ``a = x`` (the linear templates);
- ``PROLOGUE == 1`` add + RMSNorm: ``s = x + r`` in fp32 (stored rounded as new_residual by the pid_n == 0
  column), ``a = s * g`` and the rows' sums of ``s^2``; the RMS scale is a per-row scalar, so the epilogue
  applies it after the dot: ``out = rsqrt(sum_k s^2 / K + eps) * (a @ W.T)``;
- ``PROLOGUE == 2`` SiLU * up: ``a = silu(x[:, :K]) * x[:, K:]`` in fp32 (never rounded, never written).

Reads x (and r, g), W [N, K] (K contiguous), the bias [N]; writes out [M, N] (and new_residual [M, K]), or
with split-K fp32 partials ws [SPLIT_K, M, N] (and ss [SPLIT_K, M]) that ``_sg_reduce`` sums in a fixed
order (deterministic, no atomics). GEMV bytes: N*K weights (dominant) + M*K + M*N; GEMM FLOPs 2*M*N*K.

Fused reduce (``fused``, the templates' ``*_FUSED_REDUCE`` knob; split-K GEMV only): no reduce launch. Each
program stores its partial (PROLOGUE 1: and its rows' partial sums of squares, into ss [n-blocks, SPLIT_K, M],
one copy per output tile, so a tile never reads another tile's), ``tl.debug_barrier()``, then one
``atomic_add(sem="acq_rel", scope="gpu")`` on its output tile's int32 counter (one per (n-block, m-block)).
The program that reads SPLIT_K - 1 (the last of the tile's to arrive) sums the tile's SPLIT_K partials in
split order as ``_sg_reduce`` does (bitwise the same result, deterministic), applies the RMS scale and bias,
stores out and writes its counter back to 0. So the counters, allocated zeroed once per (device, tile count)
in the template's module-level cache (``_sg_counters``), are zero again after every launch (a CUDA-graph
replay needs no memset): 4 bytes a tile, one atomic (8 bytes through L2) and one 4-byte store per tile a
launch; the last program reads SPLIT_K * BLOCK_M * BLOCK_N * 4 bytes of partials (L2 hits). One launch at
a time per cache: launches on one stream, or PDL launches, whose atomics come after ``gdc_wait`` (the
previous grid finished, its counters zeroed). With PDL the GEMV still triggers its dependents right after
its ``gdc_wait``, before the last program stores out: a dependent reads out only after its own ``gdc_wait``,
which waits for this whole grid to complete and flush its memory (griddepcontrol.wait), not for the trigger.
"""

import torch
import triton
import triton.language as tl

# ---- section ----
def _sg_pdl(x, asked) -> bool:
    """Programmatic dependent launch: asked for, and a GPU that has it (SM90+)."""
    return bool(asked) and x.is_cuda and torch.cuda.get_device_capability(x.device)[0] >= 9


def _sg_rows(t, k):
    """``t`` as [rows, k] with k contiguous (a copy only when its last dim is strided)."""
    t2 = t.reshape(-1, k)
    return t2 if t2.stride(-1) == 1 else t2.contiguous()


def _sg_norm_linear_torch(x2, r2, norm_weight, eps, weight, bias):
    """Add + RMSNorm + projection in torch (prefill above MAX_T): fp32 add, one rms_norm kernel, cuBLAS;
    (out [T, N], s rounded [T, H])."""
    s = x2.float() + r2.float()                                           # [T, H] fp32
    normed = torch.nn.functional.rms_norm(s, (x2.shape[1],), norm_weight.float(), eps).to(x2.dtype)
    return torch.nn.functional.linear(normed, weight, bias), s.to(x2.dtype)


def _sg_split(k, split_k, block_k):
    """(K per split, rounded up to BLOCK_K; the number of non-empty splits)."""
    k_per_split = triton.cdiv(triton.cdiv(k, split_k), block_k) * block_k
    return k_per_split, triton.cdiv(k, k_per_split)


def _sg_counters(cache, device, tiles):
    """The fused reduce's int32 counters [tiles] on ``device``: allocated zeroed on the first call and kept in
    ``cache`` (the template's module-level dict); each launch leaves them zeroed."""
    cnt = cache.get((device, tiles))
    if cnt is None:
        cnt = cache[(device, tiles)] = torch.zeros(tiles, dtype=torch.int32, device=device)
    return cnt


@triton.jit
def _sg_offs_k(k0, BLOCK_K: tl.constexpr):
    """The BLOCK_K columns from ``k0`` (a multiple of BLOCK_K), contiguous: 16-byte vector loads."""
    return tl.max_contiguous(tl.multiple_of(k0 + tl.arange(0, BLOCK_K), BLOCK_K), BLOCK_K)


@triton.jit
def _sg_w(w_rows, offs_k, nmask, kmask):
    """The [BLOCK_N, BLOCK_K] weight tile at ``offs_k`` in fp32 (streamed once: evicted first)."""
    return tl.load(w_rows + offs_k[None, :], mask=nmask[:, None] & kmask[None, :], other=0.0,
                   eviction_policy="evict_first").to(tl.float32)


@triton.jit
def _sg_norm_a(x_ptr, r_ptr, g_ptr, res_ptr, rows64, stride_xm, stride_rm, stride_res, offs_k, kmask, mmask,
               resmask):
    """(s * g, sum of s^2 per row) of the [BLOCK_M, BLOCK_K] tile, s = x + r in fp32, stored rounded as
    new_residual where ``resmask`` (the pid_n == 0 column)."""
    xmask = mmask[:, None] & kmask[None, :]
    xv = tl.load(x_ptr + rows64 * stride_xm + offs_k[None, :], mask=xmask, other=0.0)
    rv = tl.load(r_ptr + rows64 * stride_rm + offs_k[None, :], mask=xmask, other=0.0)
    s = xv.to(tl.float32) + rv.to(tl.float32)
    tl.store(res_ptr + rows64 * stride_res + offs_k[None, :], s.to(res_ptr.dtype.element_ty),
             mask=resmask[:, None] & kmask[None, :])
    g = tl.load(g_ptr + offs_k, mask=kmask, other=0.0).to(tl.float32)
    return s * g[None, :], tl.sum(s * s, axis=1)


@triton.jit
def _sg_a(x_ptr, rows64, stride_xm, K, offs_k, mask, PROLOGUE: tl.constexpr):
    """The [BLOCK_M, BLOCK_K] A tile of the plain (as loaded) or SiLU * up (fp32) prologue."""
    if PROLOGUE == 2:
        gate = tl.load(x_ptr + rows64 * stride_xm + offs_k[None, :], mask=mask, other=0.0).to(tl.float32)
        up = tl.load(x_ptr + rows64 * stride_xm + K + offs_k[None, :], mask=mask, other=0.0).to(tl.float32)
        a = gate / (1.0 + tl.exp(-gate)) * up
    else:
        a = tl.load(x_ptr + rows64 * stride_xm + offs_k[None, :], mask=mask, other=0.0)
    return a


@triton.jit
def _sg_fma(acc, w, a, ACC_2D: tl.constexpr):
    """acc + the [BLOCK_M, BLOCK_N, BLOCK_K] products: ACC_2D (one row) elementwise into [BLOCK_N, BLOCK_K],
    reduced once after the loop (no per-step shuffles); otherwise reduced over K each step."""
    if ACC_2D:
        acc += w * a
    else:
        acc += tl.sum(a[:, None, :] * w[None, :, :], axis=2)
    return acc


@triton.jit
def _sg_epilogue(acc, ss, b_ptr, out_ptr, ws_ptr, ss_ptr, pid_k, rows, offs_m, offs_n, mmask, nmask, resmask,
                 M, N, K, stride_om, eps, HAS_BIAS: tl.constexpr, PARTIALS: tl.constexpr, PROLOGUE: tl.constexpr):
    """Stores the [BLOCK_M, BLOCK_N] fp32 ``acc`` of rows ``rows`` [BLOCK_M, 1]: PARTIALS to the workspace (and ss
    for the reduce), else scaled by the rows' RMS (PROLOGUE 1), plus the bias, rounded into out."""
    omask = mmask[:, None] & nmask[None, :]
    if PARTIALS:
        tl.store(ws_ptr + (pid_k * M + rows) * N + offs_n[None, :], acc, mask=omask)
        if PROLOGUE == 1:
            tl.store(ss_ptr + pid_k * M + offs_m, ss, mask=resmask)
    else:
        if PROLOGUE == 1:
            acc = acc * tl.rsqrt(ss / K + eps)[:, None]
        if HAS_BIAS:
            acc += tl.load(b_ptr + offs_n, mask=nmask, other=0.0).to(tl.float32)[None, :]
        tl.store(out_ptr + rows * stride_om + offs_n[None, :], acc.to(out_ptr.dtype.element_ty), mask=omask)


@triton.jit
def _sg_gemv(x_ptr, r_ptr, g_ptr, w_ptr, b_ptr, out_ptr, res_ptr, ws_ptr, ss_ptr, cnt_ptr, M, N, K,
             stride_xm, stride_rm, stride_wn, stride_om, stride_res, eps,
             K_PER_SPLIT: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
             BLOCK_K: tl.constexpr, PARTIALS: tl.constexpr, ACC_2D: tl.constexpr, PEEL: tl.constexpr,
             GDC: tl.constexpr, PROLOGUE: tl.constexpr, FUSED: tl.constexpr, SPLIT_K: tl.constexpr):
    """Split-K GEMV, grid (cdiv(N, BLOCK_N), SPLIT_K, cdiv(M, BLOCK_M)): a program streams a [BLOCK_N, BLOCK_K]
    tile of W per step over its K slice and forms the A tile of its rows (L2 hits after the first program).
    PEEL: the first W tile is loaded before waiting on x's producer (GDC: programmatic dependent launch).
    FUSED (with PARTIALS): the last of an output tile's SPLIT_K programs reduces the tile (``_sg_fused_reduce``).
    Several row blocks: the programs are renumbered so that the row block varies fastest in launch order and the
    programs that read one W tile run together (L2 hits); in grid order each row block would stream all of W
    from memory again (16 rows of BLOCK_M 1: 16x the weight bytes)."""
    pid_n = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_m = tl.program_id(2)
    grid_m = tl.num_programs(2)
    if grid_m > 1:
        launched = pid_n + (pid_k + pid_m * SPLIT_K) * tl.num_programs(0)    # the launch order: axis 0 fastest
        pid_m = launched % grid_m
        pid_k = (launched // grid_m) % SPLIT_K
        pid_n = launched // (grid_m * SPLIT_K)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)             # [BLOCK_N]
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)             # [BLOCK_M]
    nmask = offs_n < N
    mmask = offs_m < M
    k_begin = pid_k * K_PER_SPLIT
    w_rows = w_ptr + offs_n[:, None].to(tl.int64) * stride_wn
    rows64 = offs_m[:, None].to(tl.int64)
    resmask = offs_m < tl.where(pid_n == 0, M, 0)                # only the pid_n == 0 column writes s
    ss = tl.zeros([BLOCK_M], dtype=tl.float32)
    if ACC_2D:
        acc = tl.zeros([BLOCK_N, BLOCK_K], dtype=tl.float32)     # reduced once after the loop
    else:
        acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    k_start = 0
    if PEEL:    # first W tile before waiting for x's producer (GDC); nothing else is read or written before
        offs_k = _sg_offs_k(k_begin, BLOCK_K)
        kmask = offs_k < K
        w = _sg_w(w_rows, offs_k, nmask, kmask)
        if GDC:
            tl.extra.cuda.gdc_wait()
            tl.extra.cuda.gdc_launch_dependents()
        if PROLOGUE == 1:
            a, sq = _sg_norm_a(x_ptr, r_ptr, g_ptr, res_ptr, rows64, stride_xm, stride_rm, stride_res, offs_k,
                               kmask, mmask, resmask)
            ss += sq
        else:
            a = _sg_a(x_ptr, rows64, stride_xm, K, offs_k, mmask[:, None] & kmask[None, :], PROLOGUE).to(tl.float32)
        acc = _sg_fma(acc, w, a, ACC_2D)
        k_start = BLOCK_K
    for k0 in range(k_start, K_PER_SPLIT, BLOCK_K):
        offs_k = _sg_offs_k(k_begin + k0, BLOCK_K)
        kmask = offs_k < K
        if PROLOGUE == 0:                                         # plain x: the W tile is loaded first
            w = _sg_w(w_rows, offs_k, nmask, kmask)              # [BLOCK_N, BLOCK_K]
        if PROLOGUE == 1:
            a, sq = _sg_norm_a(x_ptr, r_ptr, g_ptr, res_ptr, rows64, stride_xm, stride_rm, stride_res, offs_k,
                               kmask, mmask, resmask)            # [BLOCK_M, BLOCK_K], [BLOCK_M]
            ss += sq
        else:
            a = _sg_a(x_ptr, rows64, stride_xm, K, offs_k, mmask[:, None] & kmask[None, :], PROLOGUE).to(tl.float32)
        if PROLOGUE != 0:
            w = _sg_w(w_rows, offs_k, nmask, kmask)
        acc = _sg_fma(acc, w, a, ACC_2D)
    if ACC_2D:
        acc = tl.sum(acc, axis=1)[None, :]                        # [1, BLOCK_N]
    if PROLOGUE == 0:
        out_rows = offs_m[:, None]                                # the linear GEMV's int32 store offsets
    else:
        out_rows = rows64
    if FUSED:   # ss [n-blocks, SPLIT_K, M]: every tile stores (and later reads) its own copy
        ss_ptr += pid_n * SPLIT_K * M
        resmask = mmask
    _sg_epilogue(acc, ss, b_ptr, out_ptr, ws_ptr, ss_ptr, pid_k, out_rows, offs_m, offs_n, mmask, nmask, resmask,
                 M, N, K, stride_om, eps, HAS_BIAS, PARTIALS, PROLOGUE)
    if FUSED:
        _sg_fused_reduce(cnt_ptr + pid_m * tl.num_programs(0) + pid_n, ws_ptr, ss_ptr, b_ptr, out_ptr, out_rows,
                         offs_m, offs_n, mmask, nmask, M, N, K, stride_om, eps, HAS_BIAS, SPLIT_K, PROLOGUE)


@triton.jit
def _sg_fused_reduce(cnt_ptr, ws_ptr, ss_ptr, b_ptr, out_ptr, rows, offs_m, offs_n, mmask, nmask, M, N, K, stride_om,
                     eps, HAS_BIAS: tl.constexpr, SPLIT_K: tl.constexpr, PROLOGUE: tl.constexpr):
    """After the program's partial store: count it on the tile's counter ``cnt_ptr``; the last of the SPLIT_K to
    arrive sums the tile's partials as ``_sg_reduce`` does (same order, same bits), stores out [BLOCK_M, BLOCK_N]
    and zeroes the counter for the next launch."""
    tl.debug_barrier()      # all of the CTA's partial stores before its release; the acquire orders the reads
    if tl.atomic_add(cnt_ptr, 1, sem="acq_rel", scope="gpu") == SPLIT_K - 1:
        omask = mmask[:, None] & nmask[None, :]
        y = _sg_partials(ws_ptr, rows, M, N, offs_n[None, :], omask, SPLIT_K)
        if PROLOGUE == 1:   # rows past M read row M - 1's sums (never stored)
            y = y * _sg_rms_scale(ss_ptr, tl.minimum(offs_m, M - 1), M, K, eps, SPLIT_K)[:, None]
        if HAS_BIAS:
            y += tl.load(b_ptr + offs_n, mask=nmask, other=0.0).to(tl.float32)[None, :]
        tl.store(out_ptr + rows * stride_om + offs_n[None, :], y.to(out_ptr.dtype.element_ty), mask=omask)
        tl.store(cnt_ptr, 0)


@triton.jit
def _sg_group(pid, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, GROUP_M: tl.constexpr):
    """(pid_m, pid_n) of program ``pid`` in grouped order: GROUP_M row blocks share W tiles in L2."""
    grid_m = tl.cdiv(M, BLOCK_M)
    grid_n = tl.cdiv(N, BLOCK_N)
    group = pid // (GROUP_M * grid_n)
    first_m = group * GROUP_M
    size_m = tl.minimum(grid_m - first_m, GROUP_M)
    pid_m = first_m + (pid % (GROUP_M * grid_n)) % size_m
    pid_n = (pid % (GROUP_M * grid_n)) // size_m
    return pid_m, pid_n


@triton.jit
def _sg_dot(a, b, acc, UPCAST: tl.constexpr, IEEE: tl.constexpr):
    """acc + a @ b on the tensor cores (a rounded to the weight dtype); UPCAST: the CPU interpreter's bf16 dot is
    wrong, fp32 there (never on a GPU); IEEE: fp32 inputs at full precision, not tf32."""
    if UPCAST:
        a = a.to(tl.float32)
        b = b.to(tl.float32)
    else:
        a = a.to(b.dtype)
    if IEEE:
        acc = tl.dot(a, b, acc, input_precision="ieee")
    else:
        acc = tl.dot(a, b, acc)
    return acc


@triton.jit
def _sg_tiled(x_ptr, r_ptr, g_ptr, w_ptr, b_ptr, out_ptr, res_ptr, ws_ptr, M, N, K,
              stride_xm, stride_rm, stride_wn, stride_om, stride_res, eps,
              K_PER_SPLIT: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
              BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, PARTIALS: tl.constexpr, UPCAST: tl.constexpr,
              IEEE: tl.constexpr, PROLOGUE: tl.constexpr):
    """Tiled GEMM, grid (cdiv(M, BLOCK_M) * cdiv(N, BLOCK_N), SPLIT_K): ``tl.dot`` of [BLOCK_M, BLOCK_K] A tiles
    (the prologue applied) and [BLOCK_K, BLOCK_N] W tiles in fp32 over the program's K slice; K_PER_SPLIT 0: one
    program over the whole (runtime) K."""
    pid_m, pid_n = _sg_group(tl.program_id(0), M, N, BLOCK_M, BLOCK_N, GROUP_M)
    pid_k = tl.program_id(1)
    offs_m = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    mmask = offs_m < M
    nmask = offs_n < N
    rows64 = offs_m[:, None].to(tl.int64)
    resmask = offs_m < tl.where(pid_n == 0, M, 0)               # only the pid_n == 0 column writes s
    if K_PER_SPLIT == 0:
        k_begin = 0
        k_len = K
    else:
        k_begin = pid_k * K_PER_SPLIT
        k_len = K_PER_SPLIT
    acc = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    ss = tl.zeros([BLOCK_M], dtype=tl.float32)
    for k0 in range(0, k_len, BLOCK_K):
        offs_k = _sg_offs_k(k_begin + k0, BLOCK_K)
        kmask = offs_k < K
        if PROLOGUE == 1:                                         # [BLOCK_M, BLOCK_K] A-tile prologue
            a, sq = _sg_norm_a(x_ptr, r_ptr, g_ptr, res_ptr, rows64, stride_xm, stride_rm, stride_res, offs_k,
                               kmask, mmask, resmask)
            ss += sq
        else:
            a = _sg_a(x_ptr, rows64, stride_xm, K, offs_k, mmask[:, None] & kmask[None, :], PROLOGUE)
        b = tl.load(w_ptr + offs_n[None, :].to(tl.int64) * stride_wn + offs_k[:, None],
                    mask=nmask[None, :] & kmask[:, None], other=0.0)  # [BLOCK_K, BLOCK_N]
        acc = _sg_dot(a, b, acc, UPCAST, IEEE)
    _sg_epilogue(acc, ss, b_ptr, out_ptr, ws_ptr, ws_ptr, pid_k, rows64, offs_m, offs_n, mmask, nmask, resmask,
                 M, N, K, stride_om, eps, HAS_BIAS, PARTIALS, PROLOGUE)


@triton.jit
def _sg_skinny(x_ptr, r_ptr, g_ptr, w_ptr, b_ptr, out_ptr, res_ptr, ws_ptr, ss_ptr, cnt_ptr, M, N, K,
               stride_xm, stride_rm, stride_wn, stride_om, stride_res, eps,
               K_PER_SPLIT: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_N: tl.constexpr,
               BLOCK_K: tl.constexpr, PARTIALS: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr,
               PROLOGUE: tl.constexpr, FUSED: tl.constexpr, SPLIT_K: tl.constexpr, REUSE: tl.constexpr):
    """Swap-AB split-K GEMM for 2-256 rows, grid (cdiv(M, BLOCK_T), SPLIT_K, cdiv(N, BLOCK_N)): a program forms
    out^T [BLOCK_N, BLOCK_T] = W [BLOCK_N, BLOCK_K] @ A^T [BLOCK_K, BLOCK_T] over its K slice, so the weights fill
    the MMA's 64/128-row side and the few rows its 16-256 column side (a tl.dot needs 16 rows at least: a tiled
    GEMM of 16 rows wastes nothing of the weights but cannot use Hopper's 64-row wgmma). The row blocks are the
    fastest grid axis: the programs that read one W tile run together and all but the first read it from L2,
    so W is streamed from memory about once (bytes N*K + M*K + M*N; FLOPs 2*M*N*K). REUSE (more than one row
    block): W tiles stay in L2 for the next row block, else they are evicted first."""
    pid_m = tl.program_id(0)
    pid_k = tl.program_id(1)
    pid_n = tl.program_id(2)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)             # [BLOCK_N]
    offs_m = pid_m * BLOCK_T + tl.arange(0, BLOCK_T)             # [BLOCK_T]
    nmask = offs_n < N
    mmask = offs_m < M
    k_begin = pid_k * K_PER_SPLIT
    w_rows = w_ptr + offs_n[:, None].to(tl.int64) * stride_wn
    rows64 = offs_m[:, None].to(tl.int64)
    resmask = offs_m < tl.where(pid_n == 0, M, 0)                # only the pid_n == 0 row of programs writes s
    acc = tl.zeros([BLOCK_N, BLOCK_T], dtype=tl.float32)
    ss = tl.zeros([BLOCK_T], dtype=tl.float32)
    for k0 in range(0, K_PER_SPLIT, BLOCK_K):
        offs_k = _sg_offs_k(k_begin + k0, BLOCK_K)
        kmask = offs_k < K
        if REUSE:                                                 # [BLOCK_N, BLOCK_K]: the next row block's L2 hit
            w = tl.load(w_rows + offs_k[None, :], mask=nmask[:, None] & kmask[None, :], other=0.0,
                        eviction_policy="evict_last")
        else:
            w = tl.load(w_rows + offs_k[None, :], mask=nmask[:, None] & kmask[None, :], other=0.0,
                        eviction_policy="evict_first")
        if PROLOGUE == 1:                                         # [BLOCK_T, BLOCK_K] A-tile prologue
            a, sq = _sg_norm_a(x_ptr, r_ptr, g_ptr, res_ptr, rows64, stride_xm, stride_rm, stride_res, offs_k,
                               kmask, mmask, resmask)
            ss += sq
        else:
            a = _sg_a(x_ptr, rows64, stride_xm, K, offs_k, mmask[:, None] & kmask[None, :], PROLOGUE)
        if UPCAST:      # the CPU interpreter's bf16 dot is wrong: fp32 there (never on a GPU)
            acc = tl.dot(w.to(tl.float32), tl.trans(a.to(tl.float32)), acc)
        elif IEEE:
            acc = tl.dot(w, tl.trans(a.to(w.dtype)), acc, input_precision="ieee")
        else:
            acc = tl.dot(w, tl.trans(a.to(w.dtype)), acc)
    if FUSED:   # ss [n-blocks, SPLIT_K, M]: every tile stores (and later reads) its own copy
        ss_ptr += pid_n * SPLIT_K * M
        resmask = mmask
    _sg_epilogue(tl.trans(acc), ss, b_ptr, out_ptr, ws_ptr, ss_ptr, pid_k, rows64, offs_m, offs_n, mmask, nmask,
                 resmask, M, N, K, stride_om, eps, HAS_BIAS, PARTIALS, PROLOGUE)
    if FUSED:
        _sg_fused_reduce(cnt_ptr + pid_n * tl.num_programs(0) + pid_m, ws_ptr, ss_ptr, b_ptr, out_ptr, rows64,
                         offs_m, offs_n, mmask, nmask, M, N, K, stride_om, eps, HAS_BIAS, SPLIT_K, PROLOGUE)


@triton.jit
def _sg_partials(ws_ptr, m, M, N, col, mask, SPLIT_K: tl.constexpr):
    """The sum of the SPLIT_K fp32 partials of row(s) ``m`` at columns ``col`` (``mask``'s shape), in a fixed order
    (deterministic)."""
    acc = tl.zeros(mask.shape, dtype=tl.float32)
    for s in range(SPLIT_K):
        acc += tl.load(ws_ptr + (s * M + m) * N + col, mask=mask, other=0.0)
    return acc


@triton.jit
def _sg_rms_scale(ss_ptr, m, M, K, eps, SPLIT_K: tl.constexpr):
    """rsqrt(mean of s^2 + eps) of row(s) ``m`` (a scalar or [BLOCK_M], all < M) from the SPLIT_K partial sums
    of squares ss [SPLIT_K, M], summed in split order (the same bits for one row or a block of rows)."""
    t = tl.load(ss_ptr + m)
    for s in range(1, SPLIT_K):
        t += tl.load(ss_ptr + s * M + m)
    return tl.rsqrt(t / K + eps)


@triton.jit
def _sg_reduce(ws_ptr, ss_ptr, b_ptr, out_ptr, M, N, K, stride_om, eps, HAS_BIAS: tl.constexpr, NORM: tl.constexpr,
               SPLIT_K: tl.constexpr, BLOCK: tl.constexpr, GDC: tl.constexpr):
    """out[m, offs] = sum of the partials (times the RMS scale when NORM) + bias; grid (cdiv(N, BLOCK), M)."""
    if GDC:     # launched early; the partials are read only once the GEMV has finished
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    m = tl.program_id(1).to(tl.int64)
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < N
    y = _sg_partials(ws_ptr, m, M, N, offs, mask, SPLIT_K)
    if NORM:
        y = y * _sg_rms_scale(ss_ptr, m, M, K, eps, SPLIT_K)
    if HAS_BIAS:
        y += tl.load(b_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    tl.store(out_ptr + m * stride_om + offs, y.to(out_ptr.dtype.element_ty), mask=mask)


def _sg_decode(prologue, x2, weight, out, k, *, block_n, block_k, block_m, split_k, num_warps, num_stages, pdl,
               r2=None, g=None, res=None, bias=None, eps=0.0, reduce=True, flat_row=True, fused=0, counters=None):
    """Launches the split-K GEMV over the rows of ``x2`` (and, when K was split and ``reduce``, the reduce into
    ``out``: a second launch, or with ``fused`` the GEMV's last-arriving programs, on the counters of the
    template's cache ``counters``). ``pdl``: the template's PDL knob; ``flat_row``: one-row programs accumulate
    elementwise (False: reduce over K every step). Returns (ws, ss, split, gdc) for a caller that reduces the
    partials itself."""
    m, n = x2.shape[0], weight.shape[0]
    out = x2 if out is None else out
    k_per_split, split = _sg_split(k, split_k, block_k)
    partials = split > 1 or not reduce
    fused = bool(fused) and split > 1 and reduce
    grid = (triton.cdiv(n, block_n), split, triton.cdiv(m, block_m))
    ws = torch.empty((split, m, n), dtype=torch.float32, device=x2.device) if partials else out
    ss_shape = (grid[0], split, m) if fused else (split, m)     # fused: each n-block's own sums of squares
    ss = torch.empty(ss_shape, dtype=torch.float32, device=x2.device) if partials and prologue == 1 else ws
    cnt = _sg_counters(counters, x2.device, grid[0] * grid[2]) if fused else ws
    gdc = _sg_pdl(x2, pdl)                         # the peeled first tile (PEEL) is testable on CPU
    launch = {"launch_pdl": True} if gdc else {}
    b = bias if bias is not None else out
    r2, g, res = (x2 if r2 is None else r2), (x2 if g is None else g), (out if res is None else res)
    _sg_gemv[grid](x2, r2, g, weight, b, out, res, ws, ss, cnt, m, n, k, x2.stride(0), r2.stride(0),
                   weight.stride(0), out.stride(0), res.stride(0), eps, K_PER_SPLIT=k_per_split,
                   HAS_BIAS=bias is not None, BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, PARTIALS=partials,
                   ACC_2D=flat_row and block_m == 1, PEEL=bool(pdl), GDC=gdc, PROLOGUE=prologue, FUSED=fused,
                   SPLIT_K=split, num_warps=num_warps, num_stages=num_stages, **launch)
    if partials and reduce and not fused:
        _sg_reduce[(triton.cdiv(n, 1024), m)](ws, ss, b, out, m, n, k, out.stride(0), eps, HAS_BIAS=bias is not None,
                                              NORM=prologue == 1, SPLIT_K=split, BLOCK=1024, GDC=gdc, num_warps=4,
                                              **launch)
    return ws, ss, split, gdc


def _sg_gemm(prologue, x2, weight, out, k, *, block_m, block_n, block_k, num_warps, num_stages, group_m=8,
             split_k=0, r2=None, g=None, res=None, bias=None, eps=0.0):
    """Launches the tiled GEMM over the rows of ``x2`` into ``out``; ``split_k`` 0: no K split (the loop runs to
    the runtime K), else that many K slices and the reduce (no RMS scale there: add + RMSNorm takes no split)."""
    if split_k and prologue == 1:
        raise ValueError("the tiled GEMM's reduce applies no RMS scale: add + RMSNorm runs unsplit")
    m, n = x2.shape[0], weight.shape[0]
    k_per_split, split = _sg_split(k, split_k, block_k) if split_k else (0, 1)
    ws = torch.empty((split, m, n), dtype=torch.float32, device=x2.device) if split > 1 else out
    b = bias if bias is not None else out
    r2, g, res = (x2 if r2 is None else r2), (x2 if g is None else g), (out if res is None else res)
    grid = (triton.cdiv(m, block_m) * triton.cdiv(n, block_n), split)
    _sg_tiled[grid](x2, r2, g, weight, b, out, res, ws, m, n, k, x2.stride(0), r2.stride(0), weight.stride(0),
                    out.stride(0), res.stride(0), eps, K_PER_SPLIT=k_per_split, HAS_BIAS=bias is not None,
                    BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=group_m, PARTIALS=split > 1,
                    UPCAST=x2.device.type != "cuda", IEEE=x2.dtype == torch.float32, PROLOGUE=prologue,
                    num_warps=num_warps, num_stages=num_stages)
    if split > 1:
        _sg_reduce[(triton.cdiv(n, 1024), m)](ws, ws, b, out, m, n, k, out.stride(0), eps, HAS_BIAS=bias is not None,
                                              NORM=False, SPLIT_K=split, BLOCK=1024, GDC=False, num_warps=4)


def _sg_skinny_gemm(prologue, x2, weight, out, k, *, block_t, block_n, block_k, split_k, num_warps, num_stages,
                    r2=None, g=None, res=None, bias=None, eps=0.0, fused=0, counters=None):
    """Launches the swap-AB GEMM (``_sg_skinny``) over the rows of ``x2`` into ``out``: row tiles of
    max(16, min(block_t, pow2(rows))) (one compile per row bucket), ``split_k`` K slices and their reduce (a
    second launch, or with ``fused`` the last-arriving programs on the counters of the template's cache)."""
    m, n = x2.shape[0], weight.shape[0]
    block_t = max(16, min(block_t, triton.next_power_of_2(m)))
    k_per_split, split = _sg_split(k, split_k, block_k)
    fused = bool(fused) and split > 1
    grid = (triton.cdiv(m, block_t), split, triton.cdiv(n, block_n))
    ws = torch.empty((split, m, n), dtype=torch.float32, device=x2.device) if split > 1 else out
    ss_shape = (grid[2], split, m) if fused else (split, m)
    ss = torch.empty(ss_shape, dtype=torch.float32, device=x2.device) if split > 1 and prologue == 1 else ws
    cnt = _sg_counters(counters, x2.device, grid[0] * grid[2]) if fused else ws
    b = bias if bias is not None else out
    r2, g, res = (x2 if r2 is None else r2), (x2 if g is None else g), (out if res is None else res)
    _sg_skinny[grid](x2, r2, g, weight, b, out, res, ws, ss, cnt, m, n, k, x2.stride(0), r2.stride(0),
                     weight.stride(0), out.stride(0), res.stride(0), eps, K_PER_SPLIT=k_per_split,
                     HAS_BIAS=bias is not None, BLOCK_T=block_t, BLOCK_N=block_n, BLOCK_K=block_k, PARTIALS=split > 1,
                     UPCAST=x2.device.type != "cuda", IEEE=x2.dtype == torch.float32, PROLOGUE=prologue, FUSED=fused,
                     SPLIT_K=split, REUSE=grid[0] > 1, num_warps=num_warps, num_stages=num_stages)
    if split > 1 and not fused:
        _sg_reduce[(triton.cdiv(n, 1024), m)](ws, ss, b, out, m, n, k, out.stride(0), eps, HAS_BIAS=bias is not None,
                                              NORM=prologue == 1, SPLIT_K=split, BLOCK=1024, GDC=False, num_warps=4)
