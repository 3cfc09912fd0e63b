"""tkcc composed plan: 3 accepted optimization(s): offline-kernel-3-attention_decode-5, offline-kernel-1-rotary_embedding-11, offline-kernel-0-rms_norm-16. Generated; do not edit."""
import math
import torch
import triton
import triton.language as tl
ATTD_BLOCK_T = 32
ATTD_NUM_SPLITS = 0
ATTD_NUM_WARPS = 4
ATTD_NUM_STAGES = 2
ATTD_DOT = True
ATTD_PDL = 1

def _attd_pdl(q) -> bool:
    """Programmatic dependent launch: asked for, and a GPU that has it (SM90+)."""
    return bool(ATTD_PDL) and q.is_cuda and (torch.cuda.get_device_capability(q.device)[0] >= 9)
_SMS = {}

def _attd_splits(q, B: int, Hk: int, max_tokens: int) -> int:
    """Split count: ATTD_NUM_SPLITS, or (0) enough slices for ~2 programs per SM; a power of 2, at most
    one slice per BLOCK_T tile of the block table's width (host-side, no sync)."""
    want = ATTD_NUM_SPLITS
    if not want:
        if q.device not in _SMS:
            _SMS[q.device] = torch.cuda.get_device_properties(q.device).multi_processor_count if q.is_cuda else 4
        want = triton.cdiv(2 * _SMS[q.device], B * Hk)
    splits = max(1, min(want, 64, triton.cdiv(max_tokens, ATTD_BLOCK_T)))
    return triton.next_power_of_2(splits) if splits > 1 else 1

@triton.jit
def _attd_kernel(q_ptr, k_ptr, v_ptr, bt_ptr, cl_ptr, out_ptr, po_ptr, pl_ptr, scale, tokens_per_split, stride_qb, stride_qh, stride_kn, stride_kt, stride_kh, stride_vn, stride_vt, stride_vh, stride_bt, stride_ob, stride_oh, Hq, DH, DV, G: tl.constexpr, BLOCK_G: tl.constexpr, BLOCK_DH: tl.constexpr, BLOCK_DV: tl.constexpr, PAGE: tl.constexpr, BLOCK_T: tl.constexpr, NUM_SPLITS: tl.constexpr, DOT: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr, GDC: tl.constexpr):
    if GDC:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    b = tl.program_id(0)
    hk = tl.program_id(1)
    s = tl.program_id(2)
    ctx = tl.load(cl_ptr + b)
    start = s * tokens_per_split
    end = tl.minimum(start + tokens_per_split, ctx)
    offs_g = tl.arange(0, BLOCK_G)
    gmask = offs_g < G
    heads = hk * G + offs_g
    dh = tl.arange(0, BLOCK_DH)
    dv = tl.arange(0, BLOCK_DV)
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + dh[None, :], mask=gmask[:, None] & (dh[None, :] < DH), other=0.0).to(tl.float32) * scale
    m = tl.full([BLOCK_G], -1e+30, dtype=tl.float32)
    l = tl.zeros([BLOCK_G], dtype=tl.float32)
    acc = tl.zeros([BLOCK_G, BLOCK_DV], dtype=tl.float32)
    for t0 in range(start, end, BLOCK_T):
        offs_t = t0 + tl.arange(0, BLOCK_T)
        tmask = offs_t < end
        page = tl.load(bt_ptr + b * stride_bt + offs_t // PAGE, mask=tmask, other=0).to(tl.int64)
        slot = offs_t % PAGE
        kk = tl.load(k_ptr + page[:, None] * stride_kn + slot[:, None] * stride_kt + hk * stride_kh + dh[None, :], mask=tmask[:, None] & (dh[None, :] < DH), other=0.0).to(tl.float32)
        vv = tl.load(v_ptr + page[:, None] * stride_vn + slot[:, None] * stride_vt + hk * stride_vh + dv[None, :], mask=tmask[:, None] & (dv[None, :] < DV), other=0.0).to(tl.float32)
        if DOT:
            sc = _attd_dot(q, tl.trans(kk), k_ptr, UPCAST, IEEE)
        else:
            sc = tl.sum(q[:, None, :] * kk[None, :, :], axis=2)
        sc = tl.where(tmask[None, :], sc, float('-inf'))
        m_new = tl.maximum(m, tl.max(sc, axis=1))
        p = tl.exp(sc - m_new[:, None])
        alpha = tl.exp(m - m_new)
        l = l * alpha + tl.sum(p, axis=1)
        if DOT:
            pv = _attd_dot(p, vv, v_ptr, UPCAST, IEEE)
        else:
            pv = tl.sum(p[:, :, None] * vv[None, :, :], axis=1)
        acc = acc * alpha[:, None] + pv
        m = m_new
    safe_l = tl.where(l > 0, l, 1.0)
    o = acc / safe_l[:, None]
    omask = gmask[:, None] & (dv[None, :] < DV)
    if NUM_SPLITS == 1:
        tl.store(out_ptr + b * stride_ob + heads[:, None] * stride_oh + dv[None, :], o.to(out_ptr.dtype.element_ty), mask=omask)
    else:
        row = (b * Hq + heads) * NUM_SPLITS + s
        tl.store(po_ptr + row[:, None] * BLOCK_DV + dv[None, :], o, mask=omask)
        lse = tl.where(l > 0, m + tl.log(safe_l), float('-inf'))
        tl.store(pl_ptr + row, lse, mask=gmask)

@triton.jit
def _attd_dot(a, b, kv_ptr, UPCAST: tl.constexpr, IEEE: tl.constexpr):
    """a @ b in fp32: operands in the cache dtype on tensor cores (fp32 in the CPU interpreter,
    whose 16-bit dot is wrong; full fp32 precision for fp32 caches)."""
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32))
    elif IEEE:
        return tl.dot(a, b, input_precision='ieee')
    else:
        return tl.dot(a.to(kv_ptr.dtype.element_ty), b.to(kv_ptr.dtype.element_ty))

@triton.jit
def _attd_merge(po_ptr, pl_ptr, out_ptr, Hq, DV, stride_ob, stride_oh, NUM_SPLITS: tl.constexpr, BLOCK_DV: tl.constexpr, GDC: tl.constexpr):
    if GDC:
        tl.extra.cuda.gdc_wait()
        tl.extra.cuda.gdc_launch_dependents()
    b = tl.program_id(0)
    h = tl.program_id(1)
    sp = tl.arange(0, NUM_SPLITS)
    row = (b * Hq + h) * NUM_SPLITS + sp
    lse = tl.load(pl_ptr + row)
    mx = tl.max(lse, axis=0)
    mx = tl.where(mx > float('-inf'), mx, 0.0)
    w = tl.exp(lse - mx)
    dv = tl.arange(0, BLOCK_DV)
    o = tl.load(po_ptr + row[:, None] * BLOCK_DV + dv[None, :], mask=(w[:, None] > 0) & (dv[None, :] < DV), other=0.0)
    den = tl.sum(w, axis=0)
    res = tl.sum(o * w[:, None], axis=0) / tl.where(den > 0, den, 1.0)
    tl.store(out_ptr + b * stride_ob + h * stride_oh + dv, res.to(out_ptr.dtype.element_ty), mask=dv < DV)

def attention_decode_triton(q, k_cache, v_cache, block_tables, context_lens, scale):
    B, Hq, DH = q.shape
    _, PAGE, Hk, _ = k_cache.shape
    DV = v_cache.shape[-1]
    G = Hq // Hk
    if q.stride(-1) != 1:
        q = q.contiguous()
    out = torch.empty((B, Hq, DV), dtype=q.dtype, device=q.device)
    if B == 0:
        return out
    max_tokens = block_tables.shape[1] * PAGE
    splits = _attd_splits(q, B, Hk, max_tokens)
    tokens_per_split = triton.cdiv(triton.cdiv(max_tokens, splits), ATTD_BLOCK_T) * ATTD_BLOCK_T
    BLOCK_DV = max(16, triton.next_power_of_2(DV))
    if splits > 1:
        po = torch.empty((B * Hq * splits, BLOCK_DV), dtype=torch.float32, device=q.device)
        pl = torch.empty((B * Hq * splits,), dtype=torch.float32, device=q.device)
    else:
        po = pl = out
    block_g = max(16, triton.next_power_of_2(G)) if ATTD_DOT else triton.next_power_of_2(G)
    pdl = _attd_pdl(q)
    launch = {'launch_pdl': True} if pdl else {}
    _attd_kernel[B, Hk, splits](q, k_cache, v_cache, block_tables, context_lens, out, po, pl, float(scale), tokens_per_split, q.stride(0), q.stride(1), k_cache.stride(0), k_cache.stride(1), k_cache.stride(2), v_cache.stride(0), v_cache.stride(1), v_cache.stride(2), block_tables.stride(0), out.stride(0), out.stride(1), Hq, DH, DV, G=G, BLOCK_G=block_g, BLOCK_DH=max(16, triton.next_power_of_2(DH)), BLOCK_DV=BLOCK_DV, PAGE=PAGE, BLOCK_T=ATTD_BLOCK_T, NUM_SPLITS=splits, DOT=ATTD_DOT, UPCAST=q.device.type != 'cuda', IEEE=q.dtype == torch.float32, GDC=pdl, num_warps=ATTD_NUM_WARPS, num_stages=ATTD_NUM_STAGES, **launch)
    if splits > 1:
        _attd_merge[B, Hq](po, pl, out, Hq, DV, out.stride(0), out.stride(1), NUM_SPLITS=splits, BLOCK_DV=BLOCK_DV, GDC=pdl, num_warps=1, **launch)
    return out
_c0_DESCRIPTION = 'attention_decode.triton_splitkv{ATTD_BLOCK_T=32,ATTD_DOT=True,ATTD_NUM_SPLITS=0,ATTD_NUM_STAGES=2,ATTD_NUM_WARPS=4,ATTD_PDL=1}'
ROPE_HEADS = 4
ROPE_NUM_WARPS = 4

@triton.jit
def _rope_heads(src_ptr, dst_ptr, h0, H, stride_st, stride_sh, t, cos, sin, Dh, HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, PASS: tl.constexpr, BLOCK_PASS: tl.constexpr, HEADS: tl.constexpr):
    heads = h0 + tl.arange(0, HEADS)
    hmask = heads < H
    d = tl.arange(0, BLOCK_HALF)
    mask = hmask[:, None] & (d[None, :] < HALF)
    src = src_ptr + t * stride_st + heads[:, None] * stride_sh
    dst = dst_ptr + (t * H + heads[:, None]) * Dh
    x1 = tl.load(src + d[None, :], mask=mask, other=0.0).to(tl.float32)
    x2 = tl.load(src + HALF + d[None, :], mask=mask, other=0.0).to(tl.float32)
    o1 = x1 * cos[None, :] - x2 * sin[None, :]
    o2 = x2 * cos[None, :] + x1 * sin[None, :]
    tl.store(dst + d[None, :], o1.to(dst_ptr.dtype.element_ty), mask=mask)
    tl.store(dst + HALF + d[None, :], o2.to(dst_ptr.dtype.element_ty), mask=mask)
    if PASS > 0:
        p = 2 * HALF + tl.arange(0, BLOCK_PASS)
        pmask = hmask[:, None] & (p[None, :] < Dh)
        xp = tl.load(src + p[None, :], mask=pmask, other=0.0)
        tl.store(dst + p[None, :], xp, mask=pmask)

@triton.jit
def _rope_kernel(pos_ptr, q_ptr, k_ptr, cs_ptr, qo_ptr, ko_ptr, Hq, Hk, Dh, stride_qt, stride_qh, stride_kt, stride_kh, stride_cs, HALF: tl.constexpr, BLOCK_HALF: tl.constexpr, PASS: tl.constexpr, BLOCK_PASS: tl.constexpr, HEADS: tl.constexpr):
    t = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1)
    nq = tl.cdiv(Hq, HEADS)
    pos = tl.load(pos_ptr + t)
    d = tl.arange(0, BLOCK_HALF)
    cmask = d < HALF
    cos = tl.load(cs_ptr + pos * stride_cs + d, mask=cmask, other=0.0).to(tl.float32)
    sin = tl.load(cs_ptr + pos * stride_cs + HALF + d, mask=cmask, other=0.0).to(tl.float32)
    if j < nq:
        _rope_heads(q_ptr, qo_ptr, j * HEADS, Hq, stride_qt, stride_qh, t, cos, sin, Dh, HALF, BLOCK_HALF, PASS, BLOCK_PASS, HEADS)
    else:
        _rope_heads(k_ptr, ko_ptr, (j - nq) * HEADS, Hk, stride_kt, stride_kh, t, cos, sin, Dh, HALF, BLOCK_HALF, PASS, BLOCK_PASS, HEADS)

def rotary_embedding_triton(positions, q, k, cos_sin_cache, rotary_dim):
    T, Hq, Dh = q.shape
    Hk = k.shape[1]
    if q.stride(-1) != 1:
        q = q.contiguous()
    if k.stride(-1) != 1:
        k = k.contiguous()
    cs = cos_sin_cache if cos_sin_cache.stride(-1) == 1 else cos_sin_cache.contiguous()
    qo = torch.empty((T, Hq, Dh), dtype=q.dtype, device=q.device)
    ko = torch.empty((T, Hk, Dh), dtype=k.dtype, device=k.device)
    half = rotary_dim // 2
    npass = Dh - rotary_dim
    if T > 0:
        grid = (T, triton.cdiv(Hq, ROPE_HEADS) + triton.cdiv(Hk, ROPE_HEADS))
        _rope_kernel[grid](positions, q, k, cs, qo, ko, Hq, Hk, Dh, q.stride(0), q.stride(1), k.stride(0), k.stride(1), cs.stride(0), HALF=half, BLOCK_HALF=triton.next_power_of_2(half), PASS=npass, BLOCK_PASS=triton.next_power_of_2(max(npass, 1)), HEADS=ROPE_HEADS, num_warps=ROPE_NUM_WARPS)
    return (qo, ko)
_c1_DESCRIPTION = 'rotary_embedding.triton{ROPE_HEADS=4,ROPE_NUM_WARPS=4}'
RMSN_BLOCK_D = 1024
RMSN_ROWS = 1
RMSN_NUM_WARPS = 4

@triton.jit
def _rmsn_kernel(x_ptr, w_ptr, out_ptr, M, D, stride_xm, stride_om, eps, BLOCK_D: tl.constexpr, ROWS: tl.constexpr, SINGLE: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    rmask = rows < M
    cols = tl.arange(0, BLOCK_D)
    if SINGLE:
        mask = rmask[:, None] & (cols[None, :] < D)
        x = tl.load(x_ptr + rows[:, None] * stride_xm + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        rstd = tl.rsqrt(tl.sum(x * x, axis=1) / D + eps)
        w = tl.load(w_ptr + cols, mask=cols < D, other=0.0).to(tl.float32)
        y = x * rstd[:, None] * w[None, :]
        tl.store(out_ptr + rows[:, None] * stride_om + cols[None, :], y.to(out_ptr.dtype.element_ty), mask=mask)
    else:
        acc = tl.zeros([ROWS, BLOCK_D], dtype=tl.float32)
        for d0 in range(0, D, BLOCK_D):
            c = d0 + cols
            mask = rmask[:, None] & (c[None, :] < D)
            x = tl.load(x_ptr + rows[:, None] * stride_xm + c[None, :], mask=mask, other=0.0).to(tl.float32)
            acc += x * x
        rstd = tl.rsqrt(tl.sum(acc, axis=1) / D + eps)
        for d0 in range(0, D, BLOCK_D):
            c = d0 + cols
            mask = rmask[:, None] & (c[None, :] < D)
            x = tl.load(x_ptr + rows[:, None] * stride_xm + c[None, :], mask=mask, other=0.0).to(tl.float32)
            w = tl.load(w_ptr + c, mask=c < D, other=0.0).to(tl.float32)
            y = x * rstd[:, None] * w[None, :]
            tl.store(out_ptr + rows[:, None] * stride_om + c[None, :], y.to(out_ptr.dtype.element_ty), mask=mask)

def rms_norm_triton(x, weight, eps):
    D = x.shape[-1]
    x2 = x.reshape(-1, D)
    if x2.stride(-1) != 1:
        x2 = x2.contiguous()
    M = x2.shape[0]
    out = torch.empty((M, D), dtype=x.dtype, device=x.device)
    if M > 0:
        _rmsn_kernel[triton.cdiv(M, RMSN_ROWS),](x2, weight, out, M, D, x2.stride(0), out.stride(0), float(eps), BLOCK_D=RMSN_BLOCK_D, ROWS=RMSN_ROWS, SINGLE=RMSN_BLOCK_D >= D, num_warps=RMSN_NUM_WARPS)
    return out.reshape(x.shape)
_c2_DESCRIPTION = 'rms_norm.triton_rows{RMSN_BLOCK_D=1024,RMSN_NUM_WARPS=4,RMSN_ROWS=1}'
OVERRIDES = {'attention_decode': attention_decode_triton, 'rotary_embedding': rotary_embedding_triton, 'rms_norm': rms_norm_triton}
DESCRIPTION = 'composed: offline-kernel-3-attention_decode-5; offline-kernel-1-rotary_embedding-11; offline-kernel-0-rms_norm-16'
