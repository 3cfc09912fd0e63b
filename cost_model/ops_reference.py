"""Per-op FLOPs, bytes and kernel launches of the engine's *reference* forward (impl "reference").

What ``persistent_engine.models.decoder.Decoder.step`` runs with no override: the plain-torch ops of
``persistent_engine/ops`` (one GPU, no parallelism). This is what the engine measures, so what the
calibration fits; the idealised serving kernels are costed in ``cost_model.ops`` (impl "fused").
Each figure below is counted from the torch ops the reference calls, one kernel per torch op and
the bytes each reads and writes (bf16 = 2, fp32 = 4 bytes per element); ops that touch O(T) or
O(B) elements (index arithmetic, eps, rsqrt of [T, 1]) count as kernels with no bytes.

The step (decoder.py): embedding; a zero residual; per layer the input norm (fused with the qkv
projection for GQA: ``add_rms_norm_linear``, whose default is ``fused_add_rms_norm`` + ``linear``,
the same kernels), attention, the post-attention norm (fused with gate_up for a dense MLP), the
MLP; the final ``fused_add_rms_norm``; for prefill the last token of each sequence; ``lm_head``
(bf16 GEMM, fp32 copy of the logits). The GQA q/k/v split takes strided views (no copies).

Notation: T tokens, S sequences, n new tokens per sequence, L cached context, Lp = L rounded up to
whole KV blocks (the gathered, padded length), H hidden, E experts, k experts per token.
"""

from __future__ import annotations

from cost_model.layout import ACT_BYTES, Layout, _ceil_div, heads_per_gpu
from cost_model.ops import OpCost, _gemm, expert_load, kda_attention_ops, token_mixer

REF_BLOCK_SIZE = 16                 # persistent_engine.ops.opdef.DEFAULT_BLOCK_SIZE (tokens per KV block)
REF_MOE_LOOP_MIN_TOKENS = 512       # persistent_engine.ops.moe.LOOP_MIN_TOKENS
REF_PREFILL_SCORE_BUDGET = 1 << 25  # persistent_engine.ops.attention.PREFILL_SCORE_BUDGET (scores per chunk)
F32 = 4.0                           # bytes of an fp32 element

# bytes per element of the fp32 chains (reads + writes of every torch op):
#   rms_norm           to 2+4, pow 4+4, mean 4, x*rsqrt 4+4, *w 4+4, to 4+2                      = 40; 9 kernels
#   fused_add_rms_norm to 2+4 (x), 2+4 (residual), add 8+4, pow 4+4, mean 4, x*rsqrt 4+4, *w 4+4,
#                      to 4+2 (normed), to 4+2 (new residual)                                     = 64; 12 kernels
RMS_NORM_BYTES, RMS_NORM_KERNELS = 40.0, 9
FUSED_ADD_RMS_NORM_BYTES, FUSED_ADD_RMS_NORM_KERNELS = 64.0, 12
# silu_and_mul per (token, I): to of [2I] 4+8, silu 4+4, mul 8+4, to 4+2                           = 38; 4 kernels
SILU_BYTES, SILU_KERNELS = 38.0, 4
# decode attention per score (s = [S, Hq, Lp]): bmm writes bf16 2, to fp32 2+4, *scale 4+4,
# masked_fill = clone 4+4 and masked_fill_ 4+4, softmax 8+4 (two reads), to bf16 4+2, bmm reads 2     = 52
DECODE_SCORE_BYTES = 52.0
# prefill attention per score (fp32 einsum): bmm writes 4, *scale 4+4, masked_fill clone 4+4 and
# fill 4+4, softmax 8+4, bmm reads 4                                                             = 44
PREFILL_SCORE_BYTES = 44.0
# A transposing copy (decode's K: [S, Lp, Hk, D] -> [S, Hk, D, Lp], written along Lp) reads 2-byte
# elements Hk*D*2 bytes apart: each 32-byte L2 sector serves one element to a warp (16x the sectors
# of a streaming read), caught by L2 (~2.5x the HBM bandwidth) rather than HBM: ~6 HBM-equivalent
# passes over the source. A physical estimate, not a fitted constant.
K_TRANSPOSE_READ = 6.0


def _chain(name: str, elems: float, bytes_per: float, kernels: int) -> OpCost:
    """A chain of ``kernels`` elementwise torch ops over ``elems`` elements, ``bytes_per`` bytes
    moved per element in all; ~1 FLOP per element per op."""
    return OpCost(name, "elementwise", flops=kernels * elems, bytes=bytes_per * elems, kernels=kernels)


def ref_rms_norm(name: str, elems: float, fused_add: bool) -> OpCost:
    if fused_add:
        return _chain(name, elems, FUSED_ADD_RMS_NORM_BYTES, FUSED_ADD_RMS_NORM_KERNELS)
    return _chain(name, elems, RMS_NORM_BYTES, RMS_NORM_KERNELS)


def ref_rotary(tokens: float, heads: float, dh: int, rot: int) -> OpCost:
    """rotary_embedding on ``heads`` heads (q and k together) of ``dh`` dims, the first ``rot``
    rotated: cos/sin gather [T, R] fp32 (1 kernel), then per tensor to fp32 (6 per dim), 4 products
    over R/2 (8 each per half dim), a sub and an add (12 per half dim), cat (8 per dim), to (6 per
    dim): 20 Dh + 28 R bytes per head and 9 kernels per tensor."""
    return OpCost("rotary_embedding", "elementwise", flops=6.0 * tokens * heads * rot,
                  bytes=tokens * heads * (20.0 * dh + 28.0 * rot) + 2 * tokens * rot * F32, kernels=19)


def ref_attention_decode(seqs: int, ctx: int, hq: int, hk: int, dk: int, dv: int, kb: float, dtype: str) -> OpCost:
    """ops.attention.attention_decode: block_tables.long and gather_pages of K and V ([S, Lp, Hk, D],
    read + write), bf16 einsums, each score 52 bytes. The first einsum's bmm wants K as
    [S*Hk, D, Lp]: a view when S == 1 or Hk == 1, else a transposing copy whose 2-byte reads are
    Hk*D*2 bytes apart (K_TRANSPOSE_READ passes, see there) plus a write; the second wants V as
    [S*Hk, Lp, Dv], a row-wise copy (read + write); then each bmm reads its operand. So K moves 3 or
    3 + K_TRANSPOSE_READ + 1 times, V 3 or 5 times. (CPU bmm copies strided operands itself: there
    the copies happen at every S.)"""
    lp = _ceil_div(ctx + 1, REF_BLOCK_SIZE) * REF_BLOCK_SIZE
    k_bytes, v_bytes = seqs * lp * hk * dk * kb, seqs * lp * hk * dv * kb
    copies = seqs > 1 and hk > 1
    scores = seqs * hq * lp
    kv_moves = 3 * (k_bytes + v_bytes) + (copies * ((K_TRANSPOSE_READ + 1) * k_bytes + 2 * v_bytes))
    return OpCost("attention_decode", "attention", flops=2.0 * scores * (dk + dv),
                  bytes=kv_moves + DECODE_SCORE_BYTES * scores + seqs * lp * 9 + seqs * hq * (dk + dv) * ACT_BYTES,
                  dtype=dtype,
                  # long x2, index x2, [copy K], bmm, to, mul, arange, ge, clone, masked_fill_,
                  # softmax, to, [copy V], bmm
                  kernels=16 if copies else 14)


def ref_attention_prefill(seqs: int, n: int, ctx: int, hq: int, hk: int, dk: int, dv: int, kb: float) -> OpCost:
    """ops.attention.attention_prefill (no host sync): per sequence, gather its Lp keys whole
    (read + write) and cast them to fp32 (read + write); the T = S n queries of the step are taken in
    chunks of REF_PREFILL_SCORE_BUDGET / (Hq Lp) and every chunk scores *all* Lp keys of the sequence
    in fp32 (no causal saving: S T Hq Lp scores, S times the exact count when S > 1), 44 bytes each;
    per chunk the fp32 q copy for the bmm (r+w), the fp32 K and V read, the output's permuted copy,
    cast, where and store."""
    t = seqs * n
    lp = _ceil_div(ctx + n, REF_BLOCK_SIZE) * REF_BLOCK_SIZE
    chunk = max(1, min(t, REF_PREFILL_SCORE_BUDGET // max(1, hq * lp)))
    chunks = _ceil_div(t, chunk)
    kv_elems = lp * hk * (dk + dv)
    scores = seqs * t * hq * lp
    q_out = t * hq * (6 * dk + seqs * (8 * dk + 24 * dv)) + 2 * t * hq * dv   # _acc(q), per seq copies, zeros
    masks = seqs * t * lp * 3                                                  # <=, &, ~ over [C, Lp] bool
    return OpCost("attention_prefill", "attention", flops=2.0 * scores * (dk + dv), dtype="fp32",
                  bytes=seqs * kv_elems * (2 * kb + kb + F32 + chunks * F32) + PREFILL_SCORE_BYTES * scores
                  + q_out + masks,
                  # ~16 index kernels (searchsorted, positions), _acc(q); per sequence long x2, index
                  # x2, to x2; per chunk eq, le, and, q copy, bmm, mul, not, clone, masked_fill_,
                  # softmax, bmm, copy, to, where, store
                  kernels=17 + seqs * (6 + 15 * chunks))


def _attention_core(seqs: int, n: int, ctx: int, hq: int, hk: int, dk: int, dv: int, kb: float,
                    dtype: str) -> OpCost:
    if n == 1:
        return ref_attention_decode(seqs, ctx, hq, hk, dk, dv, kb, dtype)
    return ref_attention_prefill(seqs, n, ctx, hq, hk, dk, dv, kb)


def _mla_ops(spec, layout: Layout, seqs: int, n: int, ctx: int) -> list[OpCost]:
    """MLA as persistent_engine.models.mla computes it: absorbed (latent-space MQA) for decode and
    prefill alike, the absorb einsums in fp32 on fp32 copies of W_UK / W_UV."""
    h, wd, wb, kb = spec.hidden_size, layout.dtype, layout.wbytes, layout.kvbytes
    t = seqs * n
    hq, _ = heads_per_gpu(spec, layout)
    lat, r, dn, dv = spec.kv_lora_rank, spec.qk_rope_head_dim, spec.qk_nope_head_dim, spec.v_head_dim
    ops: list[OpCost] = []
    if spec.q_lora_rank:
        ops += [_gemm("q_a_proj", t, h, spec.q_lora_rank, wd, wb), ref_rms_norm("q_a_norm", t * spec.q_lora_rank, False),
                _gemm("q_b_proj", t, spec.q_lora_rank, hq * (dn + r), wd, wb)]
    else:
        ops.append(_gemm("q_proj", t, h, hq * (dn + r), wd, wb))
    ops += [OpCost("q_split", "elementwise", bytes=2 * t * hq * (dn + r) * ACT_BYTES, kernels=2),
            _gemm("kv_a_proj", t, h, lat + r, wd, wb),
            OpCost("kv_split", "elementwise", bytes=2 * t * (lat + r) * ACT_BYTES, kernels=2),
            ref_rms_norm("kv_a_norm", t * lat, False),
            ref_rotary(t, hq + 1, r, r),
            OpCost("kv_cache_write", "elementwise", bytes=3 * t * (lat + r) * kb, kernels=2),
            # fp32 einsum on fp32 copies of q_nope and W_UK [Hq, Dn, lat], cast back
            OpCost("mla_q_absorb", "gemm", flops=2.0 * t * hq * dn * lat, dtype="fp32",
                   bytes=hq * dn * lat * (wb + 2 * F32) + t * hq * (dn * (2 + 2 * F32) + lat * (2 * F32 + 2)),
                   kernels=4),
            OpCost("mla_q_cat", "elementwise", bytes=2 * t * hq * (lat + r) * ACT_BYTES, kernels=1),
            _attention_core(seqs, n, ctx, hq, 1, lat + r, lat, kb, wd),
            OpCost("mla_v_up", "gemm", flops=2.0 * t * hq * lat * dv, dtype="fp32",
                   bytes=hq * dv * lat * (wb + 2 * F32) + t * hq * (lat * (2 + 2 * F32) + dv * (2 * F32 + 2)),
                   kernels=4),
            _gemm("o_proj", t, hq * dv, h, wd, wb)]
    return ops


def _gqa_ops(spec, layout: Layout, seqs: int, n: int, ctx: int) -> list[OpCost]:
    """models.attention.GQAAttention after its fused input norm: the qkv GEMM (of
    add_rms_norm_linear), q/k/v as strided views, QK-norm, rotary, K/V written into the cache
    (index_copy_, read + write), paged attention, o_proj."""
    h, wd, wb, kb = spec.hidden_size, layout.dtype, layout.wbytes, layout.kvbytes
    t, dh = seqs * n, spec.head_dim
    hq, hk = heads_per_gpu(spec, layout)
    ops = [_gemm("qkv_proj", t, h, (hq + 2 * hk) * dh, wd, wb)]
    if spec.qk_norm != "none":
        qk = ref_rms_norm("qk_norm", t * (hq + hk) * dh, False)
        ops.append(OpCost(qk.name, qk.cls, qk.flops, qk.bytes, kernels=2 * qk.kernels))    # q and k
    ops.append(ref_rotary(t, hq + hk, dh, spec.rotary_dim or dh))
    ops.append(OpCost("kv_cache_write", "elementwise", bytes=2 * t * 2 * hk * dh * kb, kernels=2))
    ops.append(_attention_core(seqs, n, ctx, hq, hk, dh, dh, kb, wd))
    ops.append(_gemm("o_proj", t, hq * dh, h, wd, wb))
    return ops


def _silu(name: str, tokens: float, inter: float) -> OpCost:
    return OpCost(name, "elementwise", flops=4.0 * tokens * inter, bytes=SILU_BYTES * tokens * inter,
                  kernels=SILU_KERNELS)


def ref_moe_experts(spec, layout: Layout, tokens: int, skew: float) -> OpCost:
    """ops.moe.moe_experts, whose path depends on shapes only:
    gather (3 T k < E): w13[ids], w2[ids] copied (read + write), then read by the batched GEMVs;
        per assignment 20 H bytes (bf16 out 2, to fp32 6, * weight 8, sum 4) and 44 I (GEMM out 4,
        silu 38, GEMM in 2); 13 kernels.
    dense (T < REF_MOE_LOOP_MIN_TOKENS): every expert on every token: each expert's weights read
        once, per (expert, token) 12 H (out 2, to fp32 6, einsum read 4) and 44 I; 12 kernels.
    loop (above): per used expert 13 kernels (gather x, GEMM, silu chain, GEMM, cast, scale,
        index_add_); per assignment 34 H (gather 4, GEMM in 2 and out 2, to 6, mul 8, index_add_ 12)
        and 44 I; 6 more kernels and a host sync (bincount read)."""
    h, e, k, wb, wd = spec.hidden_size, spec.num_experts, spec.num_experts_per_tok, layout.wbytes, layout.dtype
    i = spec.moe_intermediate_size / layout.moe_tp
    expert_w = 3 * h * i * wb                                   # w13 [2I, H] + w2 [H, I] of one expert
    if 3 * tokens * k < e:
        a = tokens * k
        return OpCost("moe_experts_gather", "moe", flops=6.0 * a * h * i, dtype=wd, kernels=13,
                      bytes=3 * a * expert_w + a * (20 * h + 44 * i) + tokens * h * 10)
    if tokens < REF_MOE_LOOP_MIN_TOKENS:
        et = e * tokens
        return OpCost("moe_experts_dense", "moe", flops=6.0 * et * h * i + 2.0 * et * h, dtype=wd, kernels=12,
                      bytes=e * expert_w + et * (12 * h + 44 * i) + tokens * (h * 10 + e * 8))
    assign, distinct = expert_load(spec, layout, tokens, skew)
    return OpCost("moe_experts_loop", "moe", flops=6.0 * assign * h * i, dtype=wd, kernels=6 + round(13 * distinct),
                  bytes=distinct * expert_w + assign * (34 * h + 44 * i) + tokens * h * 10)


def _moe_ops(spec, layout: Layout, tokens: int, skew: float) -> list[OpCost]:
    """models.moe.MoEMLP: router GEMM (bf16 logits) and its fp32 copy, moe_route (softmax or
    sigmoid, topk, gather, renormalise, scale: ~5 fp32 passes over [T, E]), the routed experts."""
    h, e = spec.hidden_size, spec.num_experts
    return [_gemm("router", tokens, h, e, "bf16", ACT_BYTES),
            OpCost("moe_route", "elementwise", flops=8.0 * tokens * e, bytes=tokens * e * (ACT_BYTES + 5 * F32),
                   kernels=9),
            ref_moe_experts(spec, layout, tokens, skew)]


def _layer_ops(spec, layout: Layout, kind: str, batch: int, n: int, ctx: int, skew: float,
               mixer: str = "attention") -> list[OpCost]:
    h, wd, wb = spec.hidden_size, layout.dtype, layout.wbytes
    t = batch * n
    if mixer.startswith("nemotron:"):   # Nemotron-H: the fused-kernel counts (no reference-specific model yet)
        from cost_model.ops_mamba import nemotron_layer_ops

        return nemotron_layer_ops(spec, layout, mixer[len("nemotron:"):], batch, n, ctx, skew)
    ops = [ref_rms_norm("fused_add_rms_norm", t * h, True)]
    if mixer == "linear":           # Qwen3.5 Gated DeltaNet (the reference runs the same math as the formulas)
        from cost_model.ops_linear import gated_delta_ops

        ops += gated_delta_ops(spec, layout, batch, n)
    elif mixer == "kda":            # Kimi delta attention: the fused-kernel counts (no reference-specific model yet)
        ops += kda_attention_ops(spec, layout, batch, n)
    else:
        ops += _mla_ops(spec, layout, batch, n, ctx) if spec.attention == "mla" else _gqa_ops(spec, layout, batch, n, ctx)
    ops.append(ref_rms_norm("fused_add_rms_norm", t * h, True))
    if kind == "dense":
        i = spec.intermediate_size / layout.mlp_group
        return ops + [_gemm("mlp_gate_up", t, h, 2 * i, wd, wb), _silu("silu_and_mul", t, i),
                      _gemm("mlp_down", t, i, h, wd, wb)]
    ops += _moe_ops(spec, layout, t, skew)
    if spec.num_shared_experts:
        i = spec.shared_intermediate_size * spec.num_shared_experts / layout.mlp_group
        ops += [_gemm("shared_gate_up", t, h, 2 * i, wd, wb), _silu("shared_silu", t, i),
                _gemm("shared_down", t, i, h, wd, wb),
                OpCost("shared_add", "elementwise", bytes=3 * t * h * ACT_BYTES)]
    return ops


def reference_step_ops(spec, layout: Layout, batch: int, n: int, ctx: int, idx: list[int],
                       skew: float) -> list[OpCost]:
    """One ``Decoder.step`` of the reference forward over layers ``idx`` (one GPU): embedding, the
    zero residual, the layers, the final fused_add_rms_norm, the last tokens (prefill), lm_head and
    the fp32 copy of its logits (no sampling)."""
    h, t, v = spec.hidden_size, batch * n, spec.vocab_size
    by_kind: dict[tuple[str, str], int] = {}
    for i in idx:
        key = (spec.layer_kind(i), token_mixer(spec, i))
        by_kind[key] = by_kind.get(key, 0) + 1
    ops = [OpCost("embedding", "elementwise", bytes=2 * t * h * ACT_BYTES),
           OpCost("residual_zeros", "elementwise", bytes=t * h * ACT_BYTES)]
    for (kind, mixer), count in sorted(by_kind.items()):
        ops += [o.scaled(count) for o in _layer_ops(spec, layout, kind, batch, n, ctx, skew, mixer)]
    ops.append(ref_rms_norm("final_norm", t * h, True))
    if n > 1:
        ops.append(OpCost("last_tokens", "elementwise", bytes=2 * batch * h * ACT_BYTES))
    ops.append(_gemm("lm_head", batch, h, v, "bf16", ACT_BYTES))
    ops.append(OpCost("logits_fp32", "elementwise", bytes=batch * v * (ACT_BYTES + F32)))
    return ops
