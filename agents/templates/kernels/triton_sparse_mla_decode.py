"""sparse_mla_decode (DeepSeek sparse attention: GLM-5.x, DeepSeek-V3.2) as one Triton kernel over the
indexer's selected tokens.

Grid (B, cdiv(H, BLOCK_H)): a program takes one sequence and BLOCK_H query heads (MLA decode is MQA over
the latent, so every head reads the same rows: one program per head block reads each selected row once
for BLOCK_H heads), walks the K selected positions in BLOCK_K tiles, gathers their latent rows
[c (L) | k_pe (R)] through the block table, and runs an online softmax with tl.dot for the scores
(q_nope . c + q_pe . k_pe) and for p @ c. Position -1 (no token) is masked. Reads: K rows of (L + R)
elements per sequence and head block (GLM-5: 2048 x 576 x 2 bytes = 2.4 MB per head block), q and the
output once. On CPU (TRITON_INTERPRET=1) the dots run in fp32 (the interpreter's 16-bit dot is wrong).
"""

import torch
import triton
import triton.language as tl

from agents.templates.kernels.shared_attention import _sa_softmax_init, _sa_softmax_step

# ---- section ----
SMLA_BLOCK_H = 16
SMLA_BLOCK_K = 32
SMLA_NUM_WARPS = 8
SMLA_NUM_STAGES = 2


@triton.jit
def _smla_kernel(qn_ptr, qp_ptr, kv_ptr, bt_ptr, idx_ptr, out_ptr, scale,
                 stride_qnb, stride_qnh, stride_qpb, stride_qph, stride_kvn, stride_kvt, stride_bt, stride_ib,
                 stride_ob, stride_oh, H, K,
                 L: tl.constexpr, R: tl.constexpr, PAGE: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_K: tl.constexpr,
                 BLOCK_L: tl.constexpr, BLOCK_R: tl.constexpr, UPCAST: tl.constexpr):
    b = tl.program_id(0)
    heads = tl.program_id(1) * BLOCK_H + tl.arange(0, BLOCK_H)
    hmask = heads < H
    dl = tl.arange(0, BLOCK_L)
    dr = tl.arange(0, BLOCK_R)
    qn = tl.load(qn_ptr + b * stride_qnb + heads[:, None] * stride_qnh + dl[None, :],
                 mask=hmask[:, None] & (dl[None, :] < L), other=0.0)
    qp = tl.load(qp_ptr + b * stride_qpb + heads[:, None] * stride_qph + dr[None, :],
                 mask=hmask[:, None] & (dr[None, :] < R), other=0.0)
    if UPCAST:
        qn = qn.to(tl.float32)
        qp = qp.to(tl.float32)
    m, l, acc = _sa_softmax_init(BLOCK_H, BLOCK_L)
    for k0 in range(0, K, BLOCK_K):
        offs = k0 + tl.arange(0, BLOCK_K)
        pos = tl.load(idx_ptr + b * stride_ib + offs, mask=offs < K, other=-1)
        valid = pos >= 0
        p_ = tl.where(valid, pos, 0)
        page = tl.load(bt_ptr + b * stride_bt + p_ // PAGE, mask=valid, other=0).to(tl.int64)
        row = page * stride_kvn + (p_ % PAGE) * stride_kvt                        # [BLOCK_K]
        c = tl.load(kv_ptr + row[:, None] + dl[None, :], mask=valid[:, None] & (dl[None, :] < L), other=0.0)
        kp = tl.load(kv_ptr + row[:, None] + L + dr[None, :], mask=valid[:, None] & (dr[None, :] < R), other=0.0)
        if UPCAST:
            c = c.to(tl.float32)
            kp = kp.to(tl.float32)
        if UPCAST:                        # fp32 in: IEEE dots (TF32's 10-bit mantissa misses fp32 tolerances)
            sc = (tl.dot(qn, tl.trans(c), input_precision="ieee")
                  + tl.dot(qp, tl.trans(kp), input_precision="ieee")) * scale     # [BLOCK_H, BLOCK_K] fp32
        else:
            sc = (tl.dot(qn, tl.trans(c)) + tl.dot(qp, tl.trans(kp))) * scale     # [BLOCK_H, BLOCK_K] fp32
        p, alpha, m_new, l = _sa_softmax_step(sc, valid, m, l)
        if UPCAST:
            acc = acc * alpha[:, None] + tl.dot(p, c, input_precision="ieee")      # [BLOCK_H, BLOCK_L]
        else:
            acc = acc * alpha[:, None] + tl.dot(p.to(c.dtype), c)
        m = m_new
    o = acc / tl.where(l > 0, l, 1.0)[:, None]
    tl.store(out_ptr + b * stride_ob + heads[:, None] * stride_oh + dl[None, :], o.to(out_ptr.dtype.element_ty),
             mask=hmask[:, None] & (dl[None, :] < L))


def sparse_mla_decode_triton(q_nope, q_pe, kv_cache, block_tables, topk_indices, scale):
    B, H, L = q_nope.shape
    R = q_pe.shape[-1]
    K = topk_indices.shape[1]
    out = torch.empty((B, H, L), dtype=q_nope.dtype, device=q_nope.device)
    if B == 0:
        return out
    q_nope = q_nope if q_nope.stride(-1) == 1 else q_nope.contiguous()
    q_pe = q_pe if q_pe.stride(-1) == 1 else q_pe.contiguous()
    kv = kv_cache if kv_cache.stride(-1) == 1 else kv_cache.contiguous()
    idx = topk_indices if topk_indices.stride(-1) == 1 else topk_indices.contiguous()
    grid = (B, triton.cdiv(H, SMLA_BLOCK_H))
    _smla_kernel[grid](
        q_nope, q_pe, kv, block_tables, idx, out, float(scale),
        q_nope.stride(0), q_nope.stride(1), q_pe.stride(0), q_pe.stride(1), kv.stride(0), kv.stride(1),
        block_tables.stride(0), idx.stride(0), out.stride(0), out.stride(1), H, K,
        L=L, R=R, PAGE=kv.shape[1], BLOCK_H=SMLA_BLOCK_H, BLOCK_K=SMLA_BLOCK_K,
        BLOCK_L=max(16, triton.next_power_of_2(L)), BLOCK_R=max(16, triton.next_power_of_2(R)),
        UPCAST=q_nope.device.type != "cuda" or q_nope.dtype == torch.float32,
        num_warps=SMLA_NUM_WARPS, num_stages=SMLA_NUM_STAGES)
    return out
