"""A correct add_rms_norm_qkv_rotary_kv_write whose rotary and K/V write are ONE Triton kernel: the norm and
the qkv GEMM in torch, then one program per (token, head) of the projected qkv row that rotates a q or k head
(neox halves on the first R dims) and stores it — q heads into the returned q, k heads straight into their
cache row, v heads copied into theirs. Replaces the rotary launch and the two K/V ``index_copy_`` launches
of the default by one. Reads qkv[T, (Hq + 2 Hk) Dh], cos_sin[max_pos, R], positions[T], slot_mapping[T];
writes q[T, Hq, Dh] and rows slot_mapping of k_cache / v_cache (the declared in-place outputs) only.
Runs under TRITON_INTERPRET=1 on CPU."""
import torch
import triton
import triton.language as tl

DESCRIPTION = "qkv rotary + K/V cache write fused in one Triton kernel"


@triton.jit
def _rotary_kv_kernel(qkv_ptr, cos_sin_ptr, pos_ptr, slot_ptr, q_ptr, kc_ptr, vc_ptr, HQ, HK, DH, R,
                      BLOCK: tl.constexpr):
    t, h = tl.program_id(0), tl.program_id(1)
    d = tl.arange(0, BLOCK)
    inside = d < DH
    row = qkv_ptr + t * (HQ + 2 * HK) * DH + h * DH
    x = tl.load(row + d, mask=inside, other=0.0).to(tl.float32)
    half = R // 2
    first = d < half
    partner = tl.where(first, d + half, d - half)
    rotated = d < R
    xp = tl.load(row + partner, mask=inside & rotated, other=0.0).to(tl.float32)
    pos = tl.load(pos_ptr + t)
    j = tl.where(first, d, d - half)
    c = tl.load(cos_sin_ptr + pos * R + j, mask=inside & rotated, other=1.0)
    s = tl.load(cos_sin_ptr + pos * R + half + j, mask=inside & rotated, other=0.0)
    y = tl.where(rotated, x * c + tl.where(first, -xp, xp) * s, x)
    slot = tl.load(slot_ptr + t)
    if h < HQ:
        tl.store(q_ptr + (t * HQ + h) * DH + d, y.to(q_ptr.dtype.element_ty), mask=inside)
    elif h < HQ + HK:
        tl.store(kc_ptr + (slot * HK + h - HQ) * DH + d, y.to(kc_ptr.dtype.element_ty), mask=inside)
    else:
        tl.store(vc_ptr + (slot * HK + h - HQ - HK) * DH + d, x.to(vc_ptr.dtype.element_ty), mask=inside)


def add_rms_norm_qkv_rotary_kv_write(x, residual, norm_weight, eps, qkv_weight, qkv_bias, positions, cos_sin_cache,
                                     rotary_dim, num_heads, num_kv_heads, k_cache, v_cache, slot_mapping):
    r = x.float() + residual.float()
    new_residual = r.to(x.dtype)
    rf = new_residual.float()
    normed = (rf * torch.rsqrt(rf.pow(2).mean(-1, keepdim=True) + eps) * norm_weight.float()).to(x.dtype)
    qkv = (normed.float() @ qkv_weight.float().t())
    if qkv_bias is not None:
        qkv = qkv + qkv_bias.float()
    qkv = qkv.to(x.dtype).contiguous()                                     # [T, (Hq + 2 Hk) Dh]
    t, dh = x.shape[0], k_cache.shape[-1]
    q = torch.empty(t, num_heads, dh, dtype=x.dtype, device=x.device)
    if t:
        _rotary_kv_kernel[(t, num_heads + 2 * num_kv_heads)](
            qkv, cos_sin_cache.contiguous(), positions.contiguous(), slot_mapping.contiguous(), q, k_cache, v_cache,
            num_heads, num_kv_heads, dh, rotary_dim, BLOCK=triton.next_power_of_2(dh))
    return q, new_residual


OVERRIDES = {"add_rms_norm_qkv_rotary_kv_write": add_rms_norm_qkv_rotary_kv_write}
