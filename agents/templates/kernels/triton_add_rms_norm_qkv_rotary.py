"""add_rms_norm_qkv_rotary (QKVR_ knobs) and add_rms_norm_qkv_rotary_kv_write (QKVW_) in Triton: residual add,
RMSNorm, qkv projection and neox rotary, two launches; the second op's reduce also writes the K/V cache.

``s = x + residual`` (fp32; written back rounded as ``new_residual``), ``qkv = rms_norm(s) @ W.T + b``
with the RMS scale factored out of the dot (as in the add_rms_norm_linear template):

    qkv[m, n] = rsqrt(mean_k s[m, k]^2 + eps) * sum_k (s[m, k] * g[k]) * W[n, k]  (+ b[n])

- ``T <= QKVR_MAX_T`` (decode): a split-K GEMV, grid (cdiv(N, BLOCK_N), SPLIT_K, cdiv(T, BLOCK_M)),
  N = (Hq + 2 Hk) Dh, writes fp32 partial products [SPLIT_K, T, N] and partial sums of squares
  [SPLIT_K, T] (programs with pid_n == 0 also store new_residual). The reduce kernel, grid
  (cdiv(Hq + 2 Hk, HEADS), T), owns whole heads (a [HEADS, Dh] tile), so the rotary pairs (i, i + R/2)
  of a head are both in the program: it sums the partials in a fixed order (deterministic, no atomics),
  applies the rms scale and bias, rotates the q and k heads' first R dims with the token's cos/sin row
  and stores q, k, v (contiguous) in their own tensors. The separate rotary launch and its q/k round
  trip are gone. Bytes: N H weights (dominant) + 2 T H read, T (N + H) written, 2 SPLIT_K T N fp32
  through L2; llama-1b qkv (N 3072, H 2048, bf16): 12.6 MB.
  ``add_rms_norm_qkv_rotary_kv_write_triton`` runs the same two kernels with ``KV_CACHE``: the program that
  rotates a k head (or holds a v head) stores it straight into k_cache / v_cache [NB, BS, Hk, Dh] at the
  token's slot (block slot_mapping[t] // BS, offset slot_mapping[t] % BS) and returns (q, new_residual): the
  two K/V write launches (index_copy_) and the k/v round trip (4 T Hk Dh elements) are gone too.
- ``T > QKVR_MAX_T`` (prefill): the torch composition (fp32 add, F.rms_norm, F.linear, rotary in fp32); the
  K/V-writing entry then ``index_copy_``s k and v into the caches (as it does for caches whose k and v strides
  differ).
- ``QKVR_PDL`` = 1 (decode, SM90+ GPUs; ignored elsewhere): both kernels are launched with programmatic
  dependent launch; the GEMV loads its first W tile (written by no kernel) before ``gdc_wait`` (the
  previous kernel, which produced x, done and flushed) and everything else after.

The GEMV is the linear family's (``shared_gemv.py``, add + RMSNorm prologue), inlined by the renderer; the
reduce is this template's own.
"""

import torch
import triton
import triton.language as tl

from agents.templates.kernels.shared_gemv import _sg_decode, _sg_norm_linear_torch, _sg_partials, _sg_rms_scale, _sg_rows

# ---- section ----
QKVR_BLOCK_N = 8
QKVR_BLOCK_K = 512
QKVR_BLOCK_M = 1
QKVR_SPLIT_K = 1
QKVR_NUM_WARPS = 4
QKVR_NUM_STAGES = 3
QKVR_MAX_T = 1
QKVR_HEADS = 2               # heads per reduce program
QKVR_REDUCE_WARPS = 2
QKVR_PDL = 0                 # 1: programmatic dependent launch of the decode kernels (SM90+)
QKVW_BLOCK_N = 8             # add_rms_norm_qkv_rotary_kv_write: the same knobs, its own values
QKVW_BLOCK_K = 512
QKVW_BLOCK_M = 1
QKVW_SPLIT_K = 1
QKVW_NUM_WARPS = 4
QKVW_NUM_STAGES = 3
QKVW_MAX_T = 1
QKVW_HEADS = 2
QKVW_REDUCE_WARPS = 2
QKVW_PDL = 0


@triton.jit
def _qkvr_reduce(ws_ptr, ss_ptr, b_ptr, pos_ptr, cs_ptr, slot_ptr, q_ptr, k_ptr, v_ptr, M, N, K, Hq, Hk, Dh,
                 stride_cs, BS, stride_kb, stride_ko, stride_kh, eps, HALF, R, HAS_BIAS: tl.constexpr,
                 SPLIT_K: tl.constexpr, HEADS: tl.constexpr, BLOCK_D: tl.constexpr,
                 KV_CACHE: tl.constexpr, GDC: tl.constexpr):
    if GDC:     # launched early; the partials are read only once the GEMV has finished
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    m = tl.program_id(1).to(tl.int64)
    heads = tl.program_id(0) * HEADS + tl.arange(0, HEADS)       # [HEADS] of the Hq + 2 Hk heads
    d = tl.arange(0, BLOCK_D)                                     # [BLOCK_D]
    hmask = heads < Hq + 2 * Hk
    mask = hmask[:, None] & (d[None, :] < Dh)
    rot = (heads < Hq + Hk)[:, None] & (d[None, :] < R)          # q and k heads, first R dims
    partner = tl.where(d < HALF, d + HALF, d - HALF)              # the other element of d's rotary pair
    scale = _sg_rms_scale(ss_ptr, m, M, K, eps, SPLIT_K)
    col = heads[:, None] * Dh + d[None, :]                        # [HEADS, BLOCK_D] columns of qkv
    pcol = heads[:, None] * Dh + partner[None, :]
    y = _sg_partials(ws_ptr, m, M, N, col, mask, SPLIT_K) * scale
    yp = _sg_partials(ws_ptr, m, M, N, pcol, rot, SPLIT_K) * scale
    if HAS_BIAS:
        y += tl.load(b_ptr + col, mask=mask, other=0.0).to(tl.float32)
        yp += tl.load(b_ptr + pcol, mask=rot, other=0.0).to(tl.float32)
    pos = tl.load(pos_ptr + m)
    j = tl.where(d < HALF, d, d - HALF)                           # frequency index of the pair
    cmask = d < R
    cos = tl.load(cs_ptr + pos * stride_cs + j, mask=cmask, other=1.0).to(tl.float32)
    sin = tl.load(cs_ptr + pos * stride_cs + HALF + j, mask=cmask, other=0.0).to(tl.float32)
    sign = tl.where(d < HALF, -1.0, 1.0)                          # x1 c - x2 s | x2 c + x1 s
    out = tl.where(rot, y * cos[None, :] + sign[None, :] * yp * sin[None, :], y)
    hq = heads[:, None]
    tl.store(q_ptr + (m * Hq + hq) * Dh + d[None, :], out.to(q_ptr.dtype.element_ty), mask=mask & (hq < Hq))
    if KV_CACHE:    # the token's cache slot: block slot // BS, offset slot % BS of k/v_cache [NB, BS, Hk, Dh]
        row = tl.load(slot_ptr + m)
    else:           # k, v [M, Hk, Dh] passed as BS 1, stride_kb Hk Dh
        row = m
    kv = (row // BS) * stride_kb + (row % BS) * stride_ko                    # the token's [Hk, Dh] row
    kmask = mask & (hq >= Hq) & (hq < Hq + Hk)
    tl.store(k_ptr + kv + (hq - Hq) * stride_kh + d[None, :], out.to(k_ptr.dtype.element_ty), mask=kmask)
    vmask = mask & (hq >= Hq + Hk)
    tl.store(v_ptr + kv + (hq - Hq - Hk) * stride_kh + d[None, :], out.to(v_ptr.dtype.element_ty), mask=vmask)


def _qkvr_torch(x2, r2, norm_weight, eps, weight, bias, positions, cos_sin_cache, rotary_dim, hq, hk):
    """T > MAX_T: fp32 add, one rms_norm kernel, cuBLAS projection, rotary in fp32 on the q/k views."""
    T = x2.shape[0]
    qkv, s = _sg_norm_linear_torch(x2, r2, norm_weight, eps, weight, bias)  # [T, (Hq + 2 Hk) Dh], [T, H]
    dh = qkv.shape[1] // (hq + 2 * hk)
    heads = qkv.view(T, hq + 2 * hk, dh)
    half = rotary_dim // 2
    cos, sin = cos_sin_cache[positions].float().chunk(2, dim=-1)          # [T, R/2] each
    qk = heads[:, :hq + hk].float()
    x1, x2_ = qk[..., :half], qk[..., half:rotary_dim]
    c, sn = cos[:, None, :], sin[:, None, :]
    qk = torch.cat([x1 * c - x2_ * sn, x2_ * c + x1 * sn, qk[..., rotary_dim:]], dim=-1).to(qkv.dtype)
    return qk[:, :hq], qk[:, hq:], heads[:, hq + hk:], s


def _qkvr_decode(x2, r2, norm_weight, eps, w, qkv_bias, positions, cos_sin_cache, rotary_dim, hq, hk, q, res, k, v,
                slots, *, block_n, block_k, block_m, split_k, num_warps, num_stages, heads, reduce_warps, pdl):
    """T <= MAX_T: the GEMV (partials) and the reduce into q [M, Hq, Dh], new_residual ``res`` [M, H] and k, v:
    [M, Hk, Dh] tensors (``slots`` None) or the caches [NB, BS, Hk, Dh] at rows ``slots`` [M] (same strides,
    unit last stride)."""
    M, H = x2.shape
    N, dh = w.shape[0], q.shape[-1]
    cs = cos_sin_cache if cos_sin_cache.stride(-1) == 1 else cos_sin_cache.contiguous()
    ws, ss, split, gdc = _sg_decode(1, x2, w, None, H, r2=r2, g=norm_weight, res=res, eps=eps, reduce=False,
                                    flat_row=False, block_n=block_n, block_k=block_k, block_m=block_m,
                                    split_k=split_k, num_warps=num_warps, num_stages=num_stages,
                                    pdl=pdl)     # fp32 partial products [split, M, N], sums of squares [split, M]
    b = qkv_bias if qkv_bias is not None else ws
    launch = {"launch_pdl": True} if gdc else {}
    bs, sb, so, sh = (k.shape[1], k.stride(0), k.stride(1), k.stride(2)) if slots is not None else (1, hk * dh, 0, dh)
    _qkvr_reduce[(triton.cdiv(hq + 2 * hk, heads), M)](
        ws, ss, b, positions, cs, slots if slots is not None else positions, q, k, v, M, N, H, hq, hk, dh,
        cs.stride(0), bs, sb, so, sh, eps, rotary_dim // 2, rotary_dim, HAS_BIAS=qkv_bias is not None,
        SPLIT_K=split, HEADS=heads, BLOCK_D=triton.next_power_of_2(dh),
        KV_CACHE=slots is not None, GDC=gdc, num_warps=reduce_warps, **launch)


def add_rms_norm_qkv_rotary_triton(x, residual, norm_weight, eps, qkv_weight, qkv_bias, positions, cos_sin_cache,
                                   rotary_dim, num_heads, num_kv_heads):
    H = x.shape[-1]
    N = qkv_weight.shape[0]
    hq, hk = int(num_heads), int(num_kv_heads)
    dh = N // (hq + 2 * hk)
    x2, r2, w = _sg_rows(x, H), _sg_rows(residual, H), _sg_rows(qkv_weight, H)
    M = x2.shape[0]
    eps = float(eps)
    if M > QKVR_MAX_T or M == 0:
        return _qkvr_torch(x2, r2, norm_weight, eps, w, qkv_bias, positions, cos_sin_cache, rotary_dim, hq, hk)
    q = torch.empty((M, hq, dh), dtype=x.dtype, device=x.device)
    k = torch.empty((M, hk, dh), dtype=x.dtype, device=x.device)
    v = torch.empty((M, hk, dh), dtype=x.dtype, device=x.device)
    res = torch.empty((M, H), dtype=x.dtype, device=x.device)
    _qkvr_decode(x2, r2, norm_weight, eps, w, qkv_bias, positions, cos_sin_cache, rotary_dim, hq, hk, q, res, k, v,
                 None, block_n=QKVR_BLOCK_N, block_k=QKVR_BLOCK_K, block_m=QKVR_BLOCK_M, split_k=QKVR_SPLIT_K,
                 num_warps=QKVR_NUM_WARPS, num_stages=QKVR_NUM_STAGES, heads=QKVR_HEADS,
                 reduce_warps=QKVR_REDUCE_WARPS, pdl=QKVR_PDL)
    return q, k, v, res.reshape(x.shape)


def add_rms_norm_qkv_rotary_kv_write_triton(x, residual, norm_weight, eps, qkv_weight, qkv_bias, positions,
                                            cos_sin_cache, rotary_dim, num_heads, num_kv_heads, k_cache, v_cache,
                                            slot_mapping):
    H = x.shape[-1]
    hq, hk = int(num_heads), int(num_kv_heads)
    x2, r2, w = _sg_rows(x, H), _sg_rows(residual, H), _sg_rows(qkv_weight, H)
    M = x2.shape[0]
    eps = float(eps)
    same = k_cache.stride() == v_cache.stride() and k_cache.stride(-1) == 1
    if M > QKVW_MAX_T or M == 0 or not same:    # prefill: the torch composition, then the two K/V writes
        q, k, v, res = _qkvr_torch(x2, r2, norm_weight, eps, w, qkv_bias, positions, cos_sin_cache, rotary_dim,
                                   hq, hk)
        k_cache.view(-1, *k.shape[1:]).index_copy_(0, slot_mapping, k)
        v_cache.view(-1, *v.shape[1:]).index_copy_(0, slot_mapping, v)
        return q, res.reshape(x.shape)
    q = torch.empty((M, hq, k_cache.shape[-1]), dtype=x.dtype, device=x.device)
    res = torch.empty((M, H), dtype=x.dtype, device=x.device)
    _qkvr_decode(x2, r2, norm_weight, eps, w, qkv_bias, positions, cos_sin_cache, rotary_dim, hq, hk, q, res,
                 k_cache, v_cache, slot_mapping, block_n=QKVW_BLOCK_N, block_k=QKVW_BLOCK_K, block_m=QKVW_BLOCK_M,
                 split_k=QKVW_SPLIT_K, num_warps=QKVW_NUM_WARPS, num_stages=QKVW_NUM_STAGES, heads=QKVW_HEADS,
                 reduce_warps=QKVW_REDUCE_WARPS, pdl=QKVW_PDL)
    return q, res.reshape(x.shape)
