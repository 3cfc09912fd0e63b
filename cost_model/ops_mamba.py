"""FLOPs, bytes and memory of Nemotron-H's layers on one GPU (``persistent_engine/models/nemotron.py``; the math in
``persistent_engine/ops/mamba.py`` and ``ops/relu2.py``). Each layer is one block (``spec.layer_block``): the
block's norm, then

  mamba      in_proj [H -> 2 I + 2 G N + Hm], the short conv (K taps over C = I + 2 G N channels, its K - 1 inputs
             per sequence read and written), the SSD recurrence, the group-wise gated norm, out_proj [I -> H].
             Heads split over tp (I = Hm P / tp; the G groups too while tp <= G, else replicated). Per head the
             state S[P, N] is fp32 and lives per sequence:
               decode   S read + written once (8 P N bytes); ~6 P N FLOPs per token (decay, write, readout)
               prefill  the chunked scan, chunks of c = SSD_CHUNK: per token and head 2 c (N + P) (the intra-chunk
                        C.B scores and their product with dt x) + 4 P N (state readout and update) FLOPs; S read and
                        written once per sequence
  attention  qkv_proj, attention over the paged cache, o_proj (GQA without rotary)
  mlp        up [H -> I], relu2, down [I -> H]: 4 H I FLOPs per token (not gated)
  moe        router, moe_route, (latent down [H -> L]), relu2 experts (2 L Im weights each), (latent up), the relu2
             shared expert; dispatch / combine over EP as ``cost_model.ops.layer_ops``
Memory (``nemotron_layer_weight_bytes_gpu``, ``nemotron_seq_bytes_gpu``): K/V only on attention layers; each
Mamba layer's state per sequence (Hm P N x 4 + C (K - 1) x 2 bytes, over tp).
"""

from __future__ import annotations

from cost_model.layout import ACT_BYTES, Layout, _ceil_div, mean_kv_heads_gpu, stage_layers

__all__ = ["nemotron_layer_ops", "nemotron_layer_weight_bytes_gpu", "nemotron_seq_bytes_gpu", "SSD_CHUNK"]

SSD_CHUNK = 128     # tokens per chunk of the SSD scan kernels (mamba_chunk_scan_combined; config chunk_size)
F32 = 4.0


def _mamba_dims(spec, layout: Layout) -> tuple[int, int, int]:
    """(heads, groups, conv channels) on one GPU."""
    hm = _ceil_div(spec.mamba_num_heads, layout.tp)
    g = max(1, spec.mamba_n_groups // layout.tp)
    return hm, g, hm * spec.mamba_head_dim + 2 * g * spec.ssm_state_size


def mamba_ops(spec, layout: Layout, seqs: int, n: int) -> list:
    from cost_model.ops import OpCost, _elementwise, _gemm      # ops.py imports this module lazily

    h, wd, wb = spec.hidden_size, layout.dtype, layout.wbytes
    hm, g, conv = _mamba_dims(spec, layout)
    p, ns, kk = spec.mamba_head_dim, spec.ssm_state_size, spec.mamba_conv_kernel
    t, inner = seqs * n, hm * p
    state = seqs * hm * p * ns * F32
    per_token = 6.0 * p * ns if n == 1 else 2.0 * min(n, SSD_CHUNK) * (ns + p) + 4.0 * p * ns
    return [_gemm("mamba_in_proj", t, h, inner + conv + hm, wd, wb),
            OpCost("mamba_conv", "elementwise", flops=2.0 * t * conv * kk,
                   bytes=(2 * t * conv + 2 * seqs * conv * (kk - 1) + conv * (kk + 1)) * ACT_BYTES),
            OpCost("ssd_decode" if n == 1 else "ssd_prefill", "attention", flops=t * hm * per_token,
                   bytes=2 * state + t * (2 * inner + 2 * g * ns + hm) * ACT_BYTES, kernels=1 if n == 1 else 5),
            _elementwise("mamba_gated_norm", 3 * t * inner),
            _gemm("mamba_out_proj", t, inner, h, wd, wb)]


def _moe_ops(spec, layout: Layout, ta: int, tm: int, skew: float) -> list:
    from cost_model.ops import OpCost, _comm, _gemm, expert_load

    h, wd, wb = spec.hidden_size, layout.dtype, layout.wbytes
    k, e, lat = spec.num_experts_per_tok, spec.num_experts, spec.latent_moe_size
    he, i_loc = lat or h, spec.moe_intermediate_size / layout.moe_tp
    ops = [_gemm("router", ta, h, e, "bf16", ACT_BYTES),
           OpCost("moe_route", "elementwise", flops=8.0 * ta * e, bytes=ta * e * 4 + ta * k * 12)]
    if lat:
        ops += [_gemm("latent_down", ta, h, lat, wd, wb), _gemm("latent_up", ta, lat, h, wd, wb)]
    assign, distinct = expert_load(spec, layout, tm, skew)
    shared_tokens, shared_group = tm, layout.mlp_group
    if layout.ep > 1:
        src = _ceil_div(ta, layout.tp)
        remote = (layout.ep - 1) / layout.ep
        for name in ("moe_dispatch", "moe_combine"):
            ops.append(_comm(name, "all_to_all", layout.ep, max(src * k, assign) * he * ACT_BYTES * remote))
        shared_tokens, shared_group = src, 1
    ops.append(OpCost("moe_experts_relu2", "moe", flops=2.0 * 2 * he * i_loc * assign,
                      bytes=distinct * 2 * he * i_loc * wb + assign * (2 * he + 2 * i_loc) * ACT_BYTES, dtype=wd,
                      kernels=3, shape={"moe": {"tokens": tm, "hidden": he, "inter": spec.moe_intermediate_size,
                                                "topk": k, "experts": e, "tp": layout.moe_tp, "ep": layout.ep,
                                                "skew": skew}}))
    if spec.num_shared_experts:
        ops += _relu2_mlp(spec, layout, shared_tokens, spec.shared_intermediate_size * spec.num_shared_experts,
                          shared_group, "shared")
    if layout.ep == 1:
        ops.append(_comm("moe_all_reduce", "all_reduce", layout.mlp_group, tm * h * ACT_BYTES))
    else:
        ops.append(_comm("moe_all_gather", "all_gather", layout.tp, ta * h * ACT_BYTES))
    return ops


def _relu2_mlp(spec, layout: Layout, tokens: int, inter: int, group: int, prefix: str) -> list:
    from cost_model.ops import _elementwise, _gemm

    h, wd, wb, i_loc = spec.hidden_size, layout.dtype, layout.wbytes, inter / group
    return [_gemm(f"{prefix}_up", tokens, h, i_loc, wd, wb), _elementwise("relu2", 2 * tokens * i_loc),
            _gemm(f"{prefix}_down", tokens, i_loc, h, wd, wb)]


def nemotron_layer_ops(spec, layout: Layout, block: str, batch: int, n: int, ctx: int, skew: float) -> list:
    """Ops of one Nemotron-H layer of ``block`` ('mamba' | 'attention' | 'mlp' | 'moe') on one GPU, ``batch``
    sequences per instance (split over DP-attention groups) of ``n`` new tokens over ``ctx`` cached ones."""
    from cost_model.ops import _attention_ops, _comm, _elementwise

    h = spec.hidden_size
    seqs = _ceil_div(batch, layout.dp)
    ta, tm = seqs * n, batch * n
    ops = [_elementwise("fused_add_rms_norm", 4 * ta * h)]
    if block == "mamba":
        ops += mamba_ops(spec, layout, seqs, n)
    elif block == "attention":                   # no rotary on Nemotron-H's attention
        ops += [o for o in _attention_ops(spec, layout, seqs, n, ctx) if o.name != "rotary_embedding"]
    elif block == "mlp":
        ops += _relu2_mlp(spec, layout, tm, spec.intermediate_size, layout.mlp_group, "mlp")
        ops.append(_comm("mlp_all_reduce", "all_reduce", layout.mlp_group, tm * h * ACT_BYTES))
    else:
        ops += _moe_ops(spec, layout, ta, tm, skew)
    if block in ("mamba", "attention"):
        ops.append(_comm("mixer_all_reduce", "all_reduce", layout.tp, ta * h * ACT_BYTES))
    return [o for o in ops if o is not None]


def nemotron_layer_weight_bytes_gpu(spec, layout: Layout, i: int) -> float:
    """Weight bytes of layer i on one GPU: mixers split over tp, MLPs, experts and shared experts as
    ``layout.sharding`` says."""
    from cost_model.layout import attention_weight_bytes_gpu

    h, wb, block = spec.hidden_size, layout.wbytes, spec.layer_block(i)
    norm = h * ACT_BYTES
    if block == "mamba":
        hm, _, conv = _mamba_dims(spec, layout)
        inner = hm * spec.mamba_head_dim
        return (h * (inner + conv + hm) + inner * h) * wb + (conv * (spec.mamba_conv_kernel + 1) + inner) * ACT_BYTES \
            + 3 * hm * F32 + norm
    if block == "attention":
        return attention_weight_bytes_gpu(spec, layout) + norm
    sh = layout.sharding                                   # cost_model.sharding: one definition per framework
    if block == "mlp":
        return 2 * h * spec.intermediate_size * wb / sh.dense_mlp + norm
    he = spec.latent_moe_size or h
    experts = _ceil_div(spec.num_experts, sh.experts) * 2 * he * spec.moe_intermediate_size / sh.expert_tp
    shared = 2 * h * spec.shared_intermediate_size * spec.num_shared_experts / sh.shared
    latent = 2 * h * spec.latent_moe_size if spec.latent_moe_size else 0
    return (experts + shared + latent) * wb + h * spec.num_experts * ACT_BYTES + spec.num_experts * F32 + norm


def nemotron_seq_bytes_gpu(spec, layout: Layout, context: int, layers: list[int] | None = None) -> float:
    """Bytes one sequence of ``context`` tokens puts on each GPU of its group (fullest stage): K/V of its
    attention layers, the recurrent state of its Mamba layers."""
    hm, _, conv = _mamba_dims(spec, layout)
    kv_token = mean_kv_heads_gpu(spec, layout) * 2 * spec.head_dim * layout.kvbytes
    state = hm * spec.mamba_head_dim * spec.ssm_state_size * F32 + conv * (spec.mamba_conv_kernel - 1) * ACT_BYTES
    best = 0.0
    for s in range(layout.pp):
        blocks = [spec.layer_block(i) for i in stage_layers(spec, layout, s, layers)]
        best = max(best, context * blocks.count("attention") * kv_token + blocks.count("mamba") * state)
    return best
