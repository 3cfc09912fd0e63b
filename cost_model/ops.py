"""Per-op FLOPs and bytes for one forward step on one GPU.

``step_ops(spec, layout, point)`` lists the work one GPU of the fullest pipeline stage does for a
workload point (docs/internals.md): a decode batch (``batch`` sequences, one new token each over
``context`` cached tokens) or a prefill chunk (``chunk`` new tokens per sequence on top of
``context`` cached ones). The point's ``batch`` is per instance; DP-attention groups split it.

Every op carries an op class, the unit the calibration fits an efficiency factor for:
    gemm         projections, dense MLP, shared experts, router, lm_head
    attention    the attention kernel over the KV cache (GQA or MLA, decode or prefill)
    moe          the routed-expert grouped GEMMs (weights of the experts actually touched)
    elementwise  norms, rotary, activation, routing, embedding, sampling
    comm         collectives (all-reduce, all-gather, all-to-all, point-to-point)

Two implementations are costed (``impl``): "fused" (serving kernels: flash attention over the
causal half, grouped expert GEMMs; what the parallelism search assumes) and "reference" (the
engine's plain-torch ops, ``persistent_engine/ops``: what the engine measures, so what calibration
fits; ``cost_model.ops_reference`` counts its torch ops one by one). The reference formulas cover
one GPU (the engine's reference forward); with parallelism the fused formulas are used.

Notation in the comments: H hidden, T tokens per attention group, S sequences per group,
L cached context, n new tokens per sequence, E experts, k experts per token.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from traffic_profiles import TrafficPoint

from cost_model.layout import ACT_BYTES, Layout, _ceil_div, expert_wbytes, heads_per_gpu, stage_layers
from persistent_engine.models.spec import layer_kind_specs

OP_CLASSES = ("gemm", "attention", "moe", "elementwise", "comm")
IMPLS = ("fused", "reference")
DEFAULT_EXPERT_SKEW = 0.0      # Zipf exponent of expert popularity; 0 = uniform routing


@dataclass(frozen=True)
class OpCost:
    name: str
    cls: str                # one of OP_CLASSES
    flops: float = 0.0
    bytes: float = 0.0      # memory traffic; for comm ops: bytes the busiest GPU sends or receives
    dtype: str = "bf16"     # operand dtype of the FLOPs (selects the peak)
    kernels: int = 1        # kernel launches (fixed cost each)
    collective: str = ""    # comm ops: all_reduce | all_gather | all_to_all | p2p
    group: int = 1          # comm ops: GPUs taking part
    count: int = 1          # identical ops (layers of one kind)
    shape: dict = field(default_factory=dict, compare=False)   # family -> dims, for cost_model.efficiency

    def scaled(self, count: int) -> "OpCost":
        return OpCost(self.name, self.cls, self.flops, self.bytes, self.dtype, self.kernels,
                      self.collective, self.group, self.count * count, self.shape)


def _gemm(name: str, m: float, k: float, n: float, wdtype: str, wbytes: float, weights: float | None = None,
          cls: str = "gemm") -> OpCost:
    """[m, k] @ [k, n]: 2mkn FLOPs; reads the weights once plus activations in and out."""
    w = k * n if weights is None else weights
    return OpCost(name, cls, flops=2.0 * m * k * n, bytes=w * wbytes + m * (k + n) * ACT_BYTES, dtype=wdtype,
                  shape={"gemm": {"m": m, "n": n, "k": k}})


def _elementwise(name: str, elems_moved: float, kernels: int = 1, flops_per: float = 2.0) -> OpCost:
    return OpCost(name, "elementwise", flops=flops_per * elems_moved, bytes=elems_moved * ACT_BYTES,
                  kernels=kernels)


def _comm(name: str, collective: str, group: int, nbytes: float) -> OpCost | None:
    if group <= 1 or nbytes <= 0:
        return None
    return OpCost(name, "comm", bytes=nbytes, collective=collective, group=group, kernels=0)


def expert_popularity(num_experts: int, skew: float) -> list[float]:
    """Routing probability of each expert, most popular first (Zipf with exponent ``skew``)."""
    raw = [(i + 1) ** -skew for i in range(num_experts)]
    s = sum(raw)
    return [r / s for r in raw]


def expert_load(spec, layout: Layout, tokens: int, skew: float) -> tuple[float, float]:
    """(assignments, distinct experts touched) on the busiest EP rank for ``tokens`` tokens in the
    MoE layer. Experts are placed round-robin by popularity (EPLB-like balanced placement);
    expert e is touched by a token with probability min(1, k p_e), so by at least one of T tokens
    with probability 1 - (1 - k p_e)^T."""
    k, ep = spec.num_experts_per_tok, layout.ep
    p = expert_popularity(spec.num_experts, skew)
    ranks = [p[r::ep] for r in range(ep)]
    hot = max(ranks, key=sum)
    assignments = tokens * k * sum(hot)
    distinct = sum(1.0 - (1.0 - min(1.0, k * pe)) ** tokens for pe in hot)
    return assignments, distinct


def _attention_shape(seqs: int, n: int, ctx: int, hq: int, hk: int, dh: int, kv_dtype: str) -> dict:
    """The measured attention kernel's shape closest to this one (cost_model.efficiency): decode over
    ctx + 1 keys; a prefill chunk of n tokens over ctx cached ones as a from-scratch prefill of the
    length with the same causal key count, sqrt(2 n (ctx + (n + 1) / 2))."""
    dims = {"batch": seqs, "heads": hq, "kv_heads": hk, "head_dim": dh, "kv_dtype": kv_dtype}
    if n == 1:
        return {"attention_decode": {**dims, "ctx": ctx + 1}}
    return {"attention_prefill": {**dims, "isl": max(n, round((2 * n * (ctx + (n + 1) / 2)) ** 0.5))}}


# ----------------------------------------------------------------------------- sparse and windowed attention
# (DeepSeek sparse attention of GLM-5.x / DeepSeek-V3.2, MiniMax-M3's block-sparse attention, sliding windows,
# Llama-4's chunks):
# how many cached tokens a query's attention reads, and the indexers' own cost. Per-layer patterns (shared
# indexer layers, windowed and full layers, M3's dense first layers) are averaged over the model's layers.
def attended_keys(spec, keys: float) -> float:
    """Mean keys a query attends when ``keys`` are visible: the DSA top-k, M3's top blocks, the window, Llama-4's
    chunk (at most ``attention_chunk_size`` keys on its rope layers)."""
    n = max(spec.num_layers, 1)
    if getattr(spec, "index_topk", 0):
        return min(keys, spec.index_topk)
    if getattr(spec, "msa_layers", ()):
        frac = sum(spec.msa_layers) / n
        return frac * min(keys, spec.msa_topk_blocks * spec.msa_block_size) + (1 - frac) * keys
    windows = getattr(spec, "layer_windows", ())
    if windows and any(windows):
        return sum(min(keys, w) if w else keys for w in windows) / n
    chunk, rope = getattr(spec, "attention_chunk_size", 0), getattr(spec, "rope_layers", ())
    if chunk and rope:                  # Llama-4: rope layers attend within their chunk, NoPE layers everything
        return sum(min(keys, chunk) if r else keys for r in rope) / n
    return keys


def _kv_read_elems(spec, layout: Layout, keys: float) -> float:
    """K and V elements one sequence's attention reads per layer (mean over layers) with ``keys`` visible: the
    attended keys times the GPU's KV heads times Dh + Dv; MiMo-V2-Flash's windowed and full layers differ in both
    the keys and the heads, so the mean is over the layers' products."""
    dh, dv = spec.head_dim, spec.gqa_v_head_dim
    if not getattr(spec, "window_kv_heads", 0):
        return attended_keys(spec, keys) * heads_per_gpu(spec, layout)[1] * (dh + dv)
    reads = (min(keys, spec.layer_window(i)) if spec.layer_window(i) else keys
             for i in range(spec.num_layers))
    heads = (r * _ceil_div(spec.layer_kv_heads(i), layout.tp) for i, r in enumerate(reads))
    return sum(heads) / spec.num_layers * (dh + dv)


def indexer_ops(spec, layout: Layout, seqs: int, n: int, ctx: int) -> list[OpCost]:
    """The lightning indexer (DSA, on its full layers) or M3's block indexer: projections, scores over every
    visible cached token (Hi x Di per token pair), the top-k; the indexer key cache read once per query."""
    h, wd, wb, kb = spec.hidden_size, layout.dtype, layout.wbytes, layout.kvbytes
    t = seqs * n
    keys = ctx + (n + 1) / 2 if n > 1 else ctx + 1
    if getattr(spec, "index_topk", 0):
        frac = sum(spec.indexer_kind(i) == "full" for i in range(spec.num_layers)) / max(spec.num_layers, 1)
        hi, di, src = spec.index_n_heads, spec.index_head_dim, spec.q_lora_rank
        proj = [_gemm("indexer_q_proj", t, src, hi * di, wd, wb), _gemm("indexer_k_proj", t, h, di, wd, wb),
                _gemm("indexer_weights_proj", t, h, hi, wd, wb)]
    elif getattr(spec, "msa_layers", ()):
        frac = sum(spec.msa_layers) / max(spec.num_layers, 1)
        hi, di = spec.num_kv_heads, spec.msa_index_dim
        proj = []                                   # fused into the qkv projection (its extra rows)
    else:
        return []
    score = OpCost("indexer_topk", "attention", flops=2.0 * t * hi * di * keys + 4.0 * t * keys,
                   bytes=seqs * (ctx + n) * di * kb + t * keys * 4.0)
    # the share of layers that run an indexer (GLM-5.2: 21 of 78; M3: 57 of 60)
    return [OpCost(o.name, o.cls, o.flops * frac, o.bytes * frac, o.dtype, o.kernels) for o in proj + [score]]


def _attention_ops(spec, layout: Layout, seqs: int, n: int, ctx: int) -> list[OpCost]:
    h, wd, wb, kb = spec.hidden_size, layout.dtype, layout.wbytes, layout.kvbytes
    t = seqs * n
    hq, hk = heads_per_gpu(spec, layout)
    if spec.attention == "v4":
        return v4_attention_ops(spec, layout, seqs, n, ctx)
    if getattr(spec, "global_head_dim", 0):     # Gemma-4: each layer kind's ops (Dh, Hk, window, K = V), weighted
        return _weighted([(f, _attention_ops(s, layout, seqs, n, ctx)) for f, s in layer_kind_specs(spec)])
    ops: list[OpCost] = indexer_ops(spec, layout, seqs, n, ctx)
    if spec.attention == "gqa":
        dh, dv = spec.head_dim, spec.gqa_v_head_dim                          # dv < dh: MiMo-V2-Flash
        gate = hq * dh if getattr(spec, "attn_output_gate", False) else 0        # Qwen3.5: gate rows
        shared = 0 < spec.num_layers <= getattr(spec, "kv_shared_layers", 0)   # Gemma-4: q only, an earlier cache
        k_rows = 0 if shared else hk * dh
        v_rows = 0 if shared or getattr(spec, "k_eq_v", False) else hk * dv     # Gemma-4 full layers: V = K
        ops.append(_gemm("qkv_proj", t, h, hq * dh + k_rows + v_rows + gate, wd, wb))
        ops.append(_elementwise("rotary_embedding", 2 * t * (hq + hk) * dh, kernels=1 + (spec.qk_norm != "none")))
        keys = attended_keys(spec, ctx + (n + 1) / 2 if n > 1 else ctx + 1)   # mean keys per new query (causal)
        ops.append(OpCost("attention_prefill" if n > 1 else "attention_decode", "attention",
                          flops=2.0 * seqs * n * hq * (dh + dv) * keys,
                          bytes=seqs * _kv_read_elems(spec, layout, ctx + n) * kb + t * hq * (dh + dv) * ACT_BYTES
                          + (0 if shared else t * hk * (dh + dv) * kb),
                          shape=_attention_shape(seqs, n, int(attended_keys(spec, ctx + 1)) - 1 if n == 1 else ctx,
                                                 hq, hk, dh, layout.kv_dtype)))
        ops.append(_gemm("o_proj", t, hq * dv, h, wd, wb))
        return ops
    # MLA (DeepSeek-V3 / Kimi-K2): r latent rank, R rope dims
    r, rr, nope, v = spec.kv_lora_rank, spec.qk_rope_head_dim, spec.qk_nope_head_dim, spec.v_head_dim
    qk = nope + rr
    if spec.q_lora_rank:
        ops.append(_gemm("q_a_proj", t, h, spec.q_lora_rank, wd, wb))
        ops.append(_gemm("q_b_proj", t, spec.q_lora_rank, hq * qk, wd, wb))
    else:
        ops.append(_gemm("q_proj", t, h, hq * qk, wd, wb))
    ops.append(_gemm("kv_a_proj", t, h, r + rr, wd, wb))
    ops.append(_elementwise("mla_norm_rotary", 2 * t * (spec.q_lora_rank + r + hq * rr), kernels=3))
    if n == 1:
        # absorbed decode: q_nope @ W_UK per head -> latent query; attention over the latent cache
        # (split over dcp GPUs); latent output @ W_UV per head
        local = _ceil_div(int(attended_keys(spec, ctx + 1)), layout.dcp)
        ops.append(_gemm("mla_absorb_q", t, hq * nope, r, wd, wb))
        ops.append(OpCost("mla_decode", "attention", flops=2.0 * seqs * hq * local * (2 * r + rr),
                          bytes=seqs * local * (r + rr) * kb + t * hq * (2 * r + rr) * ACT_BYTES,
                          shape={"mla_decode": {"batch": seqs, "ctx": local, "heads": min(hq, 128),
                                                "kv_dtype": layout.kv_dtype}}))
        ops.append(_gemm("mla_absorb_v", t, hq * r, v, wd, wb))
        c = _comm("dcp_combine", "all_reduce", layout.dcp, t * hq * (r + 1) * 4.0)
        if c:
            ops.append(c)
    else:
        # prefill: expand the latent of context + chunk into per-head K (nope) and V, then MHA
        kv_tokens = seqs * (ctx + n)
        ops.append(_gemm("mla_kv_b_proj", kv_tokens, r, hq * (nope + v), wd, wb))
        keys = attended_keys(spec, ctx + (n + 1) / 2)
        ops.append(OpCost("mla_prefill", "attention", flops=2.0 * seqs * n * hq * keys * (qk + v),
                          bytes=kv_tokens * hq * (qk + v) * ACT_BYTES + t * hq * (qk + v) * ACT_BYTES,
                          shape=_attention_shape(seqs, n, ctx, hq, hq, qk, "bf16")))
    ops.append(_gemm("o_proj", t, hq * v, h, wd, wb))
    return ops


KDA_CHUNK = 64     # tokens per chunk of the chunked (WY) KDA prefill kernels (FLA, vLLM)


def _weighted(parts: list[tuple[float, list[OpCost]]]) -> list[OpCost]:
    """Ops of layer kinds making up shares f of the layers: each op's (the j-th of its name's) FLOPs and bytes the
    f-weighted sum over the kinds (kernel launches and the efficiency shape: the first kind's)."""
    out: dict[tuple[str, int], OpCost] = {}
    for f, ops in parts:
        seen: dict[str, int] = {}
        for o in ops:
            key = (o.name, seen.setdefault(o.name, 0))
            seen[o.name] += 1
            p = out.get(key)
            flops, nbytes = o.flops * f + (p.flops if p else 0.0), o.bytes * f + (p.bytes if p else 0.0)
            base = p or o
            out[key] = OpCost(o.name, o.cls, flops, nbytes, o.dtype, base.kernels, o.collective, o.group, o.count,
                              base.shape)
    return list(out.values())


def kda_attention_ops(spec, layout: Layout, seqs: int, n: int) -> list[OpCost]:
    """One Kimi delta attention layer (persistent_engine/ops/kda.py) on one GPU, heads split over TP: the fused
    input projection [q k v | output gate | beta | f_a], f_b, the short conv, the delta rule and the gated norm,
    o_proj. The delta rule keeps an fp32 state [Dk, Dv] per sequence and head: decode reads and writes it once
    (8 Dk Dv bytes) for ~7 Dk Dv FLOPs per token; chunked prefill costs ~6 Dk Dv + 4 C (Dk + Dv) FLOPs per token
    (C = KDA_CHUNK) and one state read and write per sequence. No per-token KV cache."""
    h, wd, wb = spec.hidden_size, layout.dtype, layout.wbytes
    nh, d = _ceil_div(spec.kda_num_heads, layout.tp), spec.kda_head_dim
    t = seqs * n
    gate = nh * d if spec.kda_full_rank_gate else d
    ops = [_gemm("kda_in_proj", t, h, 3 * nh * d + gate + nh + d, wd, wb), _gemm("kda_f_b", t, d, nh * d, wd, wb)]
    if not spec.kda_full_rank_gate:
        ops.append(_gemm("kda_g_b", t, d, nh * d, wd, wb))
    ops.append(_elementwise("short_conv", 2 * t * 3 * nh * d + seqs * 6 * nh * d * (spec.kda_conv_size - 1),
                            flops_per=spec.kda_conv_size))
    per_token = 7.0 * d * d if n == 1 else 6.0 * d * d + 4.0 * KDA_CHUNK * 2 * d
    ops.append(OpCost("kda_decode" if n == 1 else "kda_prefill", "attention", flops=t * nh * per_token,
                      bytes=seqs * nh * 8.0 * d * d + t * nh * 6 * d * ACT_BYTES, kernels=1 if n == 1 else 6))
    ops.append(_elementwise("rms_norm_gated", 3 * t * nh * d))
    ops.append(_gemm("o_proj", t, nh * d, h, wd, wb))
    return ops


def _dense_mlp_ops(spec, layout: Layout, tokens: int, inter: int, group: int, prefix: str = "mlp") -> list[OpCost]:
    h, wd, wb = spec.hidden_size, layout.dtype, layout.wbytes
    i_loc = inter / group
    return [_gemm(f"{prefix}_gate_up", tokens, h, 2 * i_loc, wd, wb),
            _elementwise("silu_and_mul", 3 * tokens * i_loc),
            _gemm(f"{prefix}_down", tokens, i_loc, h, wd, wb)]


def token_mixer(spec, i: int) -> str:
    """Layer i's token mixer: 'linear' (Qwen3.5 Gated DeltaNet), 'kda' (Kimi delta attention), 'attention', or
    'nemotron:<block>' (Nemotron-H's one block per layer, cost_model.ops_mamba)."""
    if getattr(spec, "hybrid_pattern", ""):
        return "nemotron:" + spec.layer_block(i)
    if getattr(spec, "linear_layers", ()) and spec.is_linear(i):
        return "linear"
    if getattr(spec, "kda_layers", ()) and spec.is_kda_layer(i):
        return "kda"
    return "attention"


def layer_ops(spec, layout: Layout, kind: str, batch: int, n: int, ctx: int, skew: float,
              mixer: str = "attention") -> list[OpCost]:
    """Ops of one decoder layer of ``kind`` ('dense' | 'moe') on one GPU; ``batch`` sequences per
    instance (split over the DP-attention groups), ``n`` new tokens each over ``ctx`` cached tokens. ``mixer``
    (``token_mixer``): 'linear' costs gated delta rule linear attention (cost_model.ops_linear), 'kda' Kimi delta
    attention (``kda_attention_ops``), 'attention' the model's attention, 'nemotron:*' a Nemotron-H block."""
    if mixer.startswith("nemotron:"):
        from cost_model.ops_mamba import nemotron_layer_ops

        return nemotron_layer_ops(spec, layout, mixer[len("nemotron:"):], batch, n, ctx, skew)
    if getattr(spec, "global_head_dim", 0):    # Gemma-4: each layer kind's ops, weighted by its share of the layers
        return _weighted([(f, layer_ops(s, layout, kind, batch, n, ctx, skew, mixer))
                          for f, s in layer_kind_specs(spec)])
    h = spec.hidden_size
    seqs = _ceil_div(batch, layout.dp)     # sequences in the busiest attention group
    ta = seqs * n                          # tokens per attention group
    tm = batch * n                         # tokens in the MLP / MoE layer of the stage
    ops = [_elementwise("fused_add_rms_norm", 4 * ta * h)]
    if mixer == "linear":
        from cost_model.ops_linear import gated_delta_ops

        ops += gated_delta_ops(spec, layout, seqs, n)
    elif mixer == "kda":
        ops += kda_attention_ops(spec, layout, seqs, n)
    else:
        ops += _attention_ops(spec, layout, seqs, n, ctx)
        if getattr(spec, "mla_output_gate", False):       # Kimi-K3: o * sigmoid(g_proj(h))
            gated = heads_per_gpu(spec, layout)[0] * spec.v_head_dim
            ops.append(_gemm("g_proj", ta, h, gated, layout.dtype, layout.wbytes))
    c = _comm("attn_all_reduce", "all_reduce", layout.tp, ta * h * ACT_BYTES)
    if c:
        ops.append(c)
    ops.append(_elementwise("fused_add_rms_norm", 4 * ta * h))
    sh = layout.sharding
    if getattr(spec, "per_layer_input", 0):   # Gemma-4 per-layer inputs: this layer's share of the L P projection,
        p = spec.per_layer_input              # its gate and output projections (replicated: not split over TP)
        ops += [_gemm("ple_proj", ta, h, p, layout.dtype, layout.wbytes),
                _gemm("ple_gate", ta, h, p, layout.dtype, layout.wbytes),
                _gemm("ple_out", ta, p, h, layout.dtype, layout.wbytes), _elementwise("ple_norm_gelu", 8 * ta * h)]
    if kind == "dense":
        # split over the stage (SGLang): all groups' tokens, all-gather + reduce-scatter (one all-reduce's
        # bytes); split over tp (vLLM): each group its own tokens and an all-reduce over tp
        dense_tokens = tm if sh.dense_mlp == layout.mlp_group else ta
        ops += _dense_mlp_ops(spec, layout, dense_tokens, spec.intermediate_size, sh.dense_mlp)
        c = _comm("mlp_all_reduce", "all_reduce", sh.dense_mlp, dense_tokens * h * ACT_BYTES)
        if c:
            ops.append(c)
        return ops
    return ops + _moe_layer_ops(spec, layout, ta, tm, skew)


def _moe_layer_ops(spec, layout: Layout, ta: int, tm: int, skew: float) -> list[OpCost]:
    """The MoE half of a layer: router, expert dispatch/combine (EP), the grouped expert GEMMs, shared experts and
    the closing collective; ``ta`` tokens per attention group, ``tm`` tokens of the stage."""
    h, sh = spec.hidden_size, layout.sharding
    ops: list[OpCost] = []
    k, e = spec.num_experts_per_tok, spec.num_experts
    if getattr(spec, "family", "") == "gemma4":   # Gemma-4 26B-A4B: four RMS norms of [T, H] (the router's input, the
        ops.append(_elementwise("gemma4_moe_norms", 8 * ta * h, kernels=4))   # experts' in / out, the MLP's out)
    ops.append(_gemm("router", ta, h, e, "bf16", ACT_BYTES))
    ops.append(OpCost("moe_route", "elementwise", flops=8.0 * ta * e, bytes=ta * e * 4 + ta * k * 12))
    i_loc = spec.moe_intermediate_size / layout.moe_tp
    lat = getattr(spec, "latent_moe_size", 0)
    if lat:                                   # Kimi-K3 latent MoE: the routed experts run at width lat
        ops += [_gemm("latent_down", ta, h, lat, layout.dtype, layout.wbytes),
                _gemm("latent_up", ta, lat, h, layout.dtype, layout.wbytes)]
    he = lat or h                             # the routed experts' input/output width
    if layout.ep > 1:
        # DeepEP-style: each GPU dispatches its share (T/tp) of its group's tokens to k experts
        src = _ceil_div(ta, layout.tp)
        assign, distinct = expert_load(spec, layout, tm, skew)
        remote = (layout.ep - 1) / layout.ep
        send = src * k * he * ACT_BYTES * remote
        recv = assign * he * ACT_BYTES * remote
        for name in ("moe_dispatch", "moe_combine"):
            ops.append(_comm(name, "all_to_all", layout.ep, max(send, recv)))
    else:
        assign, distinct = expert_load(spec, layout, tm, skew)
    # shared experts: replicated on a GPU's token share (sequence-parallel MoE), over tp on its group's
    # tokens (vLLM), or over the stage on all of them (SGLang)
    shared_group = sh.shared
    shared_tokens = (_ceil_div(ta, layout.tp) if shared_group == 1 and layout.ep > 1 else
                     tm if shared_group == layout.mlp_group else ta)
    # grouped GEMMs over the experts this GPU holds: w13 [2I, H] and w2 [H, I] per touched expert (MXFP4 experts:
    # 4.25 bits a weight); gpt-oss's fp32 biases b13 [2I], b2 [H] per touched expert, added to each row's outputs
    bias = (2 * i_loc + he) if getattr(spec, "moe_bias", False) else 0
    ops.append(OpCost("moe_experts", "moe", flops=2.0 * 3 * he * i_loc * assign + assign * bias,
                      bytes=distinct * (3 * he * i_loc * expert_wbytes(spec, layout) + bias * 4)
                      + assign * (2 * he + 3 * i_loc) * ACT_BYTES,
                      dtype=layout.dtype, kernels=3,
                      shape={"moe": {"tokens": tm, "hidden": h, "inter": spec.moe_intermediate_size, "topk": k,
                                     "experts": e, "tp": layout.moe_tp, "ep": layout.ep, "skew": skew}}))
    if spec.num_shared_experts:
        ops += _dense_mlp_ops(spec, layout, shared_tokens, spec.shared_intermediate_size * spec.num_shared_experts,
                              shared_group, prefix="shared")
        if getattr(spec, "shared_expert_gate", False):
            ops.append(_gemm("shared_expert_gate", shared_tokens, h, 1, layout.dtype, layout.wbytes))
    if layout.ep == 1:
        c = _comm("moe_all_reduce", "all_reduce", layout.mlp_group, tm * h * ACT_BYTES)
    else:
        c = _comm("moe_all_gather", "all_gather", layout.tp, ta * h * ACT_BYTES)
    if c:
        ops.append(c)
    return ops


def point_shape(point: TrafficPoint) -> tuple[str, int, int, int]:
    """(phase, batch, context, new tokens per sequence) of a workload point. ``point``: a
    ``traffic_profiles.TrafficPoint`` or anything with its fields (the engine's ``io_struct.WorkloadPoint``,
    which cost_model may not import, has the same five)."""
    batch, ctx = max(1, int(point.batch)), max(0, int(point.context))
    n = 1 if point.phase == "decode" else max(1, int(point.chunk))
    return point.phase, batch, ctx, n


def step_ops(spec, layout: Layout, point: TrafficPoint, layers: list[int] | None = None,
             skew: float = DEFAULT_EXPERT_SKEW, stage: int | None = None, impl: str = "fused") -> list[OpCost]:
    """All ops one GPU runs for one step of ``point`` (the fullest stage unless ``stage`` is
    given); ``layers`` selects layer indices of a sliced model (embeddings, final norm and
    lm_head are always included, as in the engine). ``impl``: "fused" or "reference" (the
    engine's plain-torch ops; one GPU, else the fused formulas)."""
    if impl not in IMPLS:
        raise ValueError(f"impl {impl!r}: one of {IMPLS}")
    _, batch, ctx, n = point_shape(point)
    if impl == "reference" and layout.gpus == 1:
        from cost_model.ops_reference import reference_step_ops   # it builds on this module's OpCost

        return reference_step_ops(spec, layout, batch, n, ctx, stage_layers(spec, layout, 0, layers), skew)
    seqs = _ceil_div(batch, layout.dp)
    if stage is None:
        sizes = [len(stage_layers(spec, layout, s, layers)) for s in range(layout.pp)]
        stage = sizes.index(max(sizes))
    idx = stage_layers(spec, layout, stage, layers)
    by_kind: dict[tuple[str, str], int] = {}
    for i in idx:
        kind = (spec.layer_kind(i), token_mixer(spec, i))
        by_kind[kind] = by_kind.get(kind, 0) + 1
    h, ta = spec.hidden_size, seqs * n
    ops: list[OpCost] = []
    if stage == 0:
        ops.append(_elementwise("embedding", 2 * ta * h, flops_per=0.0))
    for (kind, mixer), count in sorted(by_kind.items()):
        ops += [o.scaled(count) for o in layer_ops(spec, layout, kind, batch, n, ctx, skew, mixer)]
    if layout.pp > 1:
        ops.append(OpCost("pp_send", "comm", bytes=ta * h * ACT_BYTES, collective="p2p", group=2, kernels=0))
    if stage == layout.pp - 1:
        v = spec.vocab_size / layout.tp
        ops.append(_elementwise("rms_norm", 2 * seqs * h))
        ops.append(_gemm("lm_head", seqs, h, v, "bf16", ACT_BYTES))
        c = _comm("logits_all_gather", "all_gather", layout.tp, seqs * spec.vocab_size * 4.0)
        if c:
            ops.append(c)
        ops.append(OpCost("sample", "elementwise", flops=4.0 * seqs * spec.vocab_size,
                          bytes=seqs * spec.vocab_size * 4.0))
    return [o for o in ops if o is not None]


def summarize(ops: list[OpCost]) -> dict[str, dict[str, float]]:
    """FLOPs, bytes and kernel launches per op class."""
    out = {c: {"flops": 0.0, "bytes": 0.0, "kernels": 0.0} for c in OP_CLASSES}
    for o in ops:
        d = out[o.cls]
        d["flops"] += o.flops * o.count
        d["bytes"] += o.bytes * o.count
        d["kernels"] += o.kernels * o.count
    return out


# ----------------------------------------------------------------------------- DeepSeek-V4 pieces
# (persistent_engine/ops/hc.py and ops/dsv4.py): manifold-constrained hyper-connections around each block,
# the KV compressor and its attended keys, the grouped low-rank output projection. Plain numbers in, so the
# figures stand on their own until ModelSpec carries DeepSeek-V4's fields. N = hc_mult streams, D = hidden.
def hc_ops(tokens: float, hc_mult: int, hidden: int, sinkhorn_iters: int) -> list[OpCost]:
    """One block's hc_pre (streams' RMS, [N*D] -> [(2+N)*N] projection in fp32, Sinkhorn on N x N, collapse)
    and hc_post (expand the block output to N streams plus comb^T @ streams). Per layer: two of each."""
    n, d, t = hc_mult, hidden, tokens
    rows = (2 + n) * n
    pre = OpCost("hc_pre", "elementwise",
                 flops=2.0 * t * n * d * rows + 3.0 * t * n * d + 2.0 * t * n * d + 4.0 * t * sinkhorn_iters * n * n,
                 bytes=t * n * d * ACT_BYTES + rows * n * d * 4.0 + t * d * ACT_BYTES + t * (n + n * n) * 4.0)
    post = OpCost("hc_post", "elementwise", flops=t * n * d * (2.0 + 2.0 * n),
                  bytes=t * (d + 2 * n * d) * ACT_BYTES + t * (n + n * n) * 4.0)
    return [pre, post]


def compressed_attended_keys(context: float, window: int, ratio: int, index_topk: int) -> float:
    """Keys one query of a DeepSeek-V4 layer attends: the sliding window plus the compressed entries, all of
    them (HCA, ratio 128) or the indexer's top-k (CSA, ratio 4); ratio 0 is a window-only layer."""
    keys = min(context, window)
    if ratio:
        entries = context // ratio
        keys += min(entries, index_topk) if index_topk else entries
    return keys


def kv_compress_ops(tokens: float, hidden: int, head_dim: int, ratio: int, overlap: bool, wbytes: float,
                    wdtype: str = "bf16") -> list[OpCost]:
    """The compressor's kv / gate projections of the new tokens ([H] -> C each, C = 2 head_dim when the
    windows overlap) and the pooling of the windows they close (tokens / ratio entries, 2 r or r slots)."""
    c = (2 if overlap else 1) * head_dim
    slots = (2 if overlap else 1) * ratio
    entries = tokens / ratio
    return [_gemm("compressor_kv_gate_proj", tokens, hidden, 2 * c, wdtype, wbytes),
            OpCost("kv_compress", "elementwise", flops=entries * slots * head_dim * 6.0,
                   bytes=entries * (2 * slots * head_dim + head_dim) * ACT_BYTES)]


def grouped_o_proj_ops(tokens: float, heads: int, head_dim: int, groups: int, rank: int, hidden: int,
                       wbytes: float, wdtype: str = "bf16") -> list[OpCost]:
    """o_a (G blocks of [Hq*Dh/G -> R]: grouped_linear) then o_b ([G*R -> H])."""
    k = heads * head_dim // groups
    o_a = OpCost("grouped_o_a_proj", "gemm", flops=2.0 * tokens * groups * k * rank,
                 bytes=groups * k * rank * wbytes + tokens * groups * (k + rank) * ACT_BYTES, dtype=wdtype)
    return [o_a, _gemm("o_b_proj", tokens, groups * rank, hidden, wdtype, wbytes)]


def _share(ops: list[OpCost], frac: float) -> list[OpCost]:
    return [OpCost(o.name, o.cls, o.flops * frac, o.bytes * frac, o.dtype, o.kernels, shape=o.shape) for o in ops]


def v4_attention_ops(spec, layout: Layout, seqs: int, n: int, ctx: int) -> list[OpCost]:
    """A DeepSeek-V4 layer's attention on one GPU, averaged over its layer kinds (window-only, CSA, HCA by
    their share of compress_ratios), plus both blocks' hyper-connection mixing: q_a / q_b, kv_proj, the
    compressors and the CSA indexer (q_b, weights_proj, scores over the compressed keys), attention over
    the window plus the entries (``compressed_attended_keys``), the grouped o-projection."""
    h, wd, wb, kb = spec.hidden_size, layout.dtype, layout.wbytes, layout.kvbytes
    t = seqs * n
    hq, _ = heads_per_gpu(spec, layout)
    d, lq, di, hi = spec.head_dim, spec.q_lora_rank, spec.index_head_dim, spec.index_n_heads
    ops = 2 * hc_ops(t, spec.hc_mult, h, spec.hc_sinkhorn_iters)
    ops += [_gemm("q_a_proj", t, h, lq, wd, wb), _gemm("q_b_proj", t, lq, hq * d, wd, wb),
            _gemm("kv_proj", t, h, d, wd, wb),
            _elementwise("v4_norm_rotary", 2 * t * (lq + hq * d + d), kernels=4)]
    ratios = list(spec.compress_ratios) or [0]
    mean_keys = ctx + (n + 1) / 2 if n > 1 else ctx + 1
    for r in sorted(set(ratios)):
        csa = bool(r) and r == spec.csa_ratio
        sub: list[OpCost] = []
        if r:
            sub += kv_compress_ops(t, h, d, r, csa, wb, wd)
        if csa:
            sub += kv_compress_ops(t, h, di, r, True, wb, wd)
            sub += [_gemm("indexer_q_b_proj", t, lq, hi * di, wd, wb), _gemm("indexer_weights_proj", t, h, hi, wd, wb)]
            entries = (ctx + n) / r
            sub.append(OpCost("csa_indexer", "attention", flops=2.0 * t * hi * di * entries,
                              bytes=seqs * entries * di * kb + t * hi * di * ACT_BYTES))
        keys = compressed_attended_keys(mean_keys, spec.sliding_window, r, spec.index_topk if csa else 0)
        sub.append(OpCost("compressed_attention", "attention", flops=4.0 * t * hq * d * keys,
                          bytes=seqs * compressed_attended_keys(ctx + n, spec.sliding_window, r,
                                                                spec.index_topk if csa else 0) * d * kb
                          + 2 * t * hq * d * ACT_BYTES + t * d * kb))
        ops += _share(sub, ratios.count(r) / len(ratios))
    groups = max(1, spec.o_groups * hq // spec.num_heads)
    return ops + grouped_o_proj_ops(t, hq, d, groups, spec.o_lora_rank, h, wb, wd)
