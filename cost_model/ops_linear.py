"""FLOPs and bytes of a gated delta rule (linear attention) layer's token mixer on one GPU (Qwen3.5 Gated
DeltaNet; ``persistent_engine/ops/linear_attention.py`` is the math). Value/key heads split over tp like
attention heads. Per value head the recurrent state S[Dk, Dv] is fp32 and lives per sequence:

  decode   read + write S once per sequence (2 Hv Dk Dv x 4 bytes); ~6 Dk Dv FLOPs per head (decay, k^T S,
           rank-1 update, q^T S)
  prefill  chunk-parallel, chunks of c = 64: per chunk and head ~c^2 (2 Dk + Dv) (the intra-chunk products and
           the triangular solve) + 4 c Dk Dv (reading and updating the state) FLOPs; S read and written once
           per chunk
The short causal conv (K taps over C = 2 Hk Dk + Hv Dv channels) and the gated RMSNorm are elementwise.
``per_channel_decay`` (Kimi delta attention) adds the Dk-wide decay to the intra-chunk products.
"""

from __future__ import annotations

from cost_model.layout import ACT_BYTES, Layout, _ceil_div

__all__ = ["gated_delta_ops", "CHUNK"]

CHUNK = 64
F32 = 4.0


def gated_delta_ops(spec, layout: Layout, seqs: int, n: int, per_channel_decay: bool = False) -> list:
    """Ops of one linear-attention layer's token mixer for ``seqs`` sequences of ``n`` new tokens each."""
    from cost_model.ops import OpCost, _elementwise, _gemm      # ops.py imports this module lazily

    h, wd, wb = spec.hidden_size, layout.dtype, layout.wbytes
    hk, hv = _ceil_div(spec.linear_num_k_heads, layout.tp), _ceil_div(spec.linear_num_v_heads, layout.tp)
    dk, dv, kk = spec.linear_k_dim, spec.linear_v_dim, spec.linear_conv_kernel
    t = seqs * n
    conv = 2 * hk * dk + hv * dv
    state = seqs * hv * dk * dv * F32
    ops = [_gemm("linear_in_proj", t, h, conv + hv * dv + 2 * hv, wd, wb),
           OpCost("causal_conv1d", "elementwise", flops=2.0 * t * conv * kk,
                  bytes=2 * t * conv * ACT_BYTES + 2 * seqs * conv * (kk - 1) * ACT_BYTES + conv * kk * ACT_BYTES),
           _elementwise("gdn_gating", 4 * t * hv)]
    if n == 1:
        ops.append(OpCost("gated_delta_decode", "attention", flops=6.0 * t * hv * dk * dv,
                          bytes=2 * state + t * (2 * hk * dk + 2 * hv * dv) * ACT_BYTES,
                          shape={"linear_attention": {"batch": seqs, "heads": hv, "dk": dk, "dv": dv, "n": 1}}))
    else:
        chunks = seqs * _ceil_div(n, CHUNK)
        c = min(n, CHUNK)
        intra = c * c * (2 * dk + dv) * (2 if per_channel_decay else 1)
        ops.append(OpCost("gated_delta_prefill", "attention", flops=2.0 * chunks * hv * (intra + 4 * c * dk * dv),
                          bytes=2 * state * _ceil_div(n, CHUNK) + t * (2 * hk * dk + 2 * hv * dv) * ACT_BYTES,
                          shape={"linear_attention": {"batch": seqs, "heads": hv, "dk": dk, "dv": dv, "n": n}}))
    ops.append(_elementwise("gated_rms_norm", 3 * t * hv * dv, kernels=2))
    ops.append(_gemm("linear_out_proj", t, hv * dv, h, wd, wb))
    return ops
