"""The attention templates' common steps, written once: the GQA query group, the paged K/V tile, the
online-softmax step, the tile product.

Not a template of its own: ``triton_attention_decode``, ``triton_attention_prefill``, ``triton_attention_window``
and ``triton_sparse_mla_decode`` import these names in their header, and ``render_candidate`` inlines the functions a
candidate's templates use once, after their sections. Each is a ``triton.jit`` function, inlined by the compiler
into the kernel that calls it.
"""

import triton
import triton.language as tl

# ---- section ----
@triton.jit
def _sa_group_q(q_ptr, b, hk, stride_qb, stride_qh, scale, DH, G: tl.constexpr, BLOCK_G: tl.constexpr,
                BLOCK_DH: tl.constexpr):
    """(heads [BLOCK_G], their mask, dh [BLOCK_DH], q [BLOCK_G, BLOCK_DH] in fp32 times ``scale``): the G query
    heads of sequence ``b`` that share KV head ``hk``."""
    offs_g = tl.arange(0, BLOCK_G)
    gmask = offs_g < G
    heads = hk * G + offs_g                                           # [BLOCK_G] query heads
    dh = tl.arange(0, BLOCK_DH)
    q = tl.load(q_ptr + b * stride_qb + heads[:, None] * stride_qh + dh[None, :],
                mask=gmask[:, None] & (dh[None, :] < DH), other=0.0).to(tl.float32) * scale
    return heads, gmask, dh, q


@triton.jit
def _sa_paged_kv(k_ptr, v_ptr, bt_ptr, b, hk, offs_t, tmask, dh, dv, stride_bt, stride_kn, stride_kt, stride_kh,
                 stride_vn, stride_vt, stride_vh, DH, DV, PAGE: tl.constexpr):
    """(K [BLOCK_T, BLOCK_DH], V [BLOCK_T, BLOCK_DV]) in fp32 of KV head ``hk`` at the sequence's tokens
    ``offs_t``, gathered through its block table (PAGE tokens a page)."""
    page = tl.load(bt_ptr + b * stride_bt + offs_t // PAGE, mask=tmask, other=0).to(tl.int64)
    slot = offs_t % PAGE
    kk = tl.load(k_ptr + page[:, None] * stride_kn + slot[:, None] * stride_kt + hk * stride_kh + dh[None, :],
                 mask=tmask[:, None] & (dh[None, :] < DH), other=0.0).to(tl.float32)
    vv = tl.load(v_ptr + page[:, None] * stride_vn + slot[:, None] * stride_vt + hk * stride_vh + dv[None, :],
                 mask=tmask[:, None] & (dv[None, :] < DV), other=0.0).to(tl.float32)
    return kk, vv


@triton.jit
def _sa_softmax_init(ROWS: tl.constexpr, COLS: tl.constexpr):
    """The online softmax's start: running max m = -1e30 and sum l = 0 [ROWS], output accumulator 0 [ROWS, COLS]."""
    return (tl.full([ROWS], -1e30, dtype=tl.float32), tl.zeros([ROWS], dtype=tl.float32),
            tl.zeros([ROWS, COLS], dtype=tl.float32))


@triton.jit
def _sa_softmax_step(sc, valid, m, l):
    """One tile of the online softmax: scores ``sc`` [rows, tokens] (-inf where not ``valid``), the running max
    ``m`` and sum ``l`` [rows] -> (p = exp(sc - m_new), alpha = exp(m - m_new), m_new, l * alpha + sum(p))."""
    sc = tl.where(valid[None, :], sc, float("-inf"))
    m_new = tl.maximum(m, tl.max(sc, axis=1))
    p = tl.exp(sc - m_new[:, None])
    alpha = tl.exp(m - m_new)
    return p, alpha, m_new, l * alpha + tl.sum(p, axis=1)


@triton.jit
def _sa_dot(a, b, kv_ptr, UPCAST: tl.constexpr, IEEE: tl.constexpr):
    """a @ b in fp32: operands in the cache dtype on tensor cores (fp32 in the CPU interpreter,
    whose 16-bit dot is wrong; full fp32 precision for fp32 caches)."""
    if UPCAST:
        return tl.dot(a.to(tl.float32), b.to(tl.float32))
    elif IEEE:
        return tl.dot(a, b, input_precision="ieee")
    else:
        return tl.dot(a.to(kv_ptr.dtype.element_ty), b.to(kv_ptr.dtype.element_ty))
