"""DeepSeek-V4's reference forward (one sequence, a whole prefill, no cache) over the registry's ops, reading
the checkpoint's own tensor names. The math is Hugging Face transformers' ``modeling_deepseek_v4.py``
(Apache-2.0; ``DeepseekV4Model``, ``DeepseekV4DecoderLayer``, ``DeepseekV4Attention``, the compressors, the
routers) and is tested against it end to end (tests/persistent_engine/test_dsv4_vs_hf.py). Per layer, with the
residual as N = ``hc_mult`` streams x[S, N, H]:

    a, post, comb = hc_pre(x, attn_hc)          block input  = rms_norm(a)        (ops/hc.py)
    q  = rope(rms(q_b(rms_norm(q_a(a)))))       kv = rope(rms_norm(kv_proj(a)))    one shared K = V head
    entries = rope(kv_compress(...)) (CSA / HCA layers), picks = csa_indexer(...) (CSA)
    o  = compressed_attention(q, kv, entries, picks, window, sinks) -> rope^-1 -> grouped_linear -> linear
    x  = hc_post(o, x, post, comb);  then the MoE block likewise: hash or sqrtsoftplus top-k routing,
    moe_experts_clamp (swiglu_limit) + the clamped shared expert
    logits = lm_head(rms_norm(hc_head(x)))

RoPE is DeepSeek-V4's: interleaved pairs on the trailing ``qk_rope_head_dim`` channels of each head; window-
only layers use ``rope_theta`` unscaled, compressed layers ``compress_rope_theta`` with YaRN (no mscale).
Not yet here: the paged-cache decode path (the compressors' running state), FP4 expert dequantization.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from persistent_engine.models.rope import _yarn_inv_freq
from persistent_engine.ops.registry import call


@dataclass(frozen=True)
class V4Config:
    hidden: int
    heads: int
    head_dim: int
    rope_dim: int
    layer_ratios: tuple[int, ...]       # per layer: 0 window-only, csa_ratio (CSA), else HCA
    csa_ratio: int
    num_hash_layers: int
    hc_mult: int
    hc_iters: int
    hc_eps: float
    eps: float
    window: int
    o_groups: int
    index_heads: int
    index_dim: int
    index_topk: int
    top_k: int
    scoring: str
    scale: float
    swiglu_limit: float
    rope_theta: float
    compress_theta: float
    rope_scaling: dict | None

    @classmethod
    def from_hf(cls, c: dict) -> "V4Config":
        """From a DeepSeek-V4 ``config.json`` (``compress_ratios`` per layer, or HF's ``layer_types``)."""
        rates = c.get("compress_rates") or {"compressed_sparse_attention": 4, "heavily_compressed_attention": 128}
        if c.get("compress_ratios") is not None:
            ratios = tuple(int(r) for r in c["compress_ratios"][: c["num_hidden_layers"]])
        else:
            ratios = tuple(0 if t == "sliding_attention" else rates[t] for t in c["layer_types"])
        return cls(hidden=c["hidden_size"], heads=c["num_attention_heads"], head_dim=c["head_dim"],
                   rope_dim=int(c.get("qk_rope_head_dim") or c["head_dim"] * c["partial_rotary_factor"]),
                   layer_ratios=ratios, csa_ratio=int(rates["compressed_sparse_attention"]),
                   num_hash_layers=int(c.get("num_hash_layers", 0)), hc_mult=c["hc_mult"],
                   hc_iters=c["hc_sinkhorn_iters"], hc_eps=c["hc_eps"], eps=c["rms_norm_eps"],
                   window=c["sliding_window"], o_groups=c["o_groups"], index_heads=c["index_n_heads"],
                   index_dim=c["index_head_dim"], index_topk=c["index_topk"], top_k=c["num_experts_per_tok"],
                   scoring=c.get("scoring_func", "sqrtsoftplus"), scale=float(c.get("routed_scaling_factor", 1.0)),
                   swiglu_limit=float(c.get("swiglu_limit", 0.0)), rope_theta=float(c.get("rope_theta", 1e4)),
                   compress_theta=float(c.get("compress_rope_theta", 160000)), rope_scaling=c.get("rope_scaling"))


# ----------------------------------------------------------------------------- rope (interleaved, trailing dims)
def rope_angles(cfg: V4Config, positions: torch.Tensor, compressed: bool) -> torch.Tensor:
    """[P, R/2] fp64 angles: position * inv_freq (compressed layers: compress_rope_theta with YaRN)."""
    r = cfg.rope_dim
    sc = cfg.rope_scaling or {}
    if compressed and (sc.get("rope_type") or sc.get("type")) == "yarn":
        inv = _yarn_inv_freq(r, cfg.compress_theta, sc)
    else:
        base = cfg.compress_theta if compressed else cfg.rope_theta
        inv = 1.0 / base ** (torch.arange(0, r, 2, dtype=torch.float64) / r)
    return positions.double()[:, None] * inv[None, :]


def rope(x: torch.Tensor, ang: torch.Tensor, inverse: bool = False) -> torch.Tensor:
    """Rotate consecutive pairs of the last R channels of x[P, ..., D] by ang[P, R/2] (inverse: by -ang)."""
    r = 2 * ang.shape[-1]
    shape = (ang.shape[0],) + (1,) * (x.dim() - 2) + (ang.shape[-1],)
    cos, sin = (f().float().view(shape).to(x.device) for f in (ang.cos, ang.sin))
    if inverse:
        sin = -sin
    nope, pe = x[..., :-r], x[..., -r:].float()
    a, b = pe[..., 0::2], pe[..., 1::2]
    rot = torch.stack([a * cos - b * sin, b * cos + a * sin], dim=-1).flatten(-2)
    return torch.cat([nope, rot.to(x.dtype)], dim=-1)


# ----------------------------------------------------------------------------- blocks
def _unit_rms(x: torch.Tensor, eps: float) -> torch.Tensor:
    return x * torch.rsqrt(x.float().square().mean(-1, keepdim=True) + eps).to(x.dtype)


def _compress(cfg, w, p, h, ratio: int, overlap: bool, dim: int) -> torch.Tensor:
    e = call("kv_compress", call("linear", h, w[p + "kv_proj.weight"], None),
             call("linear", h, w[p + "gate_proj.weight"], None), w[p + "position_bias"], w[p + "kv_norm.weight"],
             ratio, overlap, cfg.eps)
    return rope(e, rope_angles(cfg, torch.arange(e.shape[0]) * ratio, True))


def attention(cfg: V4Config, w: dict, p: str, a: torch.Tensor, ratio: int) -> torch.Tensor:
    s, hq, d = a.shape[0], cfg.heads, cfg.head_dim
    ang = rope_angles(cfg, torch.arange(s), ratio > 0)
    q_res = call("rms_norm", call("linear", a, w[p + "q_a_proj.weight"], None), w[p + "q_a_norm.weight"], cfg.eps)
    q = rope(_unit_rms(call("linear", q_res, w[p + "q_b_proj.weight"], None).view(s, hq, d), cfg.eps), ang)
    kv = rope(call("rms_norm", call("linear", a, w[p + "kv_proj.weight"], None), w[p + "kv_norm.weight"], cfg.eps), ang)
    dev = a.device
    entries, n_entries, picks = a.new_zeros(1, 1, d), torch.zeros(1, dtype=torch.long, device=dev), None
    one = (torch.tensor([0, s], dtype=torch.int32, device=dev), torch.tensor([s], dtype=torch.int32, device=dev))  # cu, lens
    if ratio:
        overlap = ratio == cfg.csa_ratio
        ent = _compress(cfg, w, p + "compressor.", a, ratio, overlap, d)
        entries, n_entries = (ent if ent.shape[0] else a.new_zeros(1, d))[None], torch.tensor([ent.shape[0]], device=dev)
        if overlap:
            ip = p + "compressor.indexer."
            keys = _compress(cfg, w, ip, a, ratio, True, cfg.index_dim)
            iq = rope(call("linear", q_res, w[ip + "q_b_proj.weight"], None).view(s, cfg.index_heads, cfg.index_dim),
                      ang)
            iw = call("linear", a, w[ip + "scorer.weights_proj.weight"], None).float() * cfg.index_heads ** -0.5
            keys = keys if keys.shape[0] else a.new_zeros(1, cfg.index_dim)
            picks = call("csa_indexer", iq, iw, keys[None], n_entries, *one, ratio, cfg.index_topk)
    bs = 16
    nb = (s + bs - 1) // bs
    cache = a.new_zeros(nb * bs, d)
    cache[:s] = kv
    o = call("compressed_attention", q, cache.view(nb, bs, d), torch.arange(nb, dtype=torch.int32, device=dev)[None], *one,
             entries, n_entries, picks, ratio, cfg.window, w[p + "sinks"], d ** -0.5)
    o = rope(o, ang, inverse=True)
    grouped = call("grouped_linear", o.reshape(s, cfg.o_groups, -1), w[p + "o_a_proj.weight"])
    return call("linear", grouped.reshape(s, -1), w[p + "o_b_proj.weight"], None)


def moe(cfg: V4Config, w: dict, p: str, a: torch.Tensor, token_ids: torch.Tensor, layer: int) -> torch.Tensor:
    logits = call("linear", a, w[p + "gate.weight"], None).float()
    if layer < cfg.num_hash_layers:
        tw, ids = call("moe_route_hash", logits, w[p + "gate.tid2eid"], token_ids, cfg.scoring, True, cfg.scale)
    else:
        tw, ids = call("moe_route", logits, w[p + "gate.e_score_correction_bias"], cfg.top_k, cfg.scoring, 1, 1,
                       True, cfg.scale)
    routed = call("moe_experts_clamp", a, w[p + "experts.gate_up_proj"], w[p + "experts.down_proj"], tw, ids,
                  cfg.swiglu_limit)
    sp = p + "shared_experts."
    gate_up = torch.cat([w[sp + "gate_proj.weight"], w[sp + "up_proj.weight"]])
    shared = call("linear", call("swiglu_clamp_and_mul", call("linear", a, gate_up, None), cfg.swiglu_limit),
                  w[sp + "down_proj.weight"], None)
    return routed + shared


def _hc(w, p):
    return w[p + "fn"], w[p + "scale"], w[p + "base"]


@torch.no_grad()
def forward(cfg: V4Config, w: dict[str, torch.Tensor], token_ids: torch.Tensor,
            layers: list[int] | None = None) -> torch.Tensor:
    """Logits [S, V] fp32 of every token of one sequence; ``w``: the checkpoint's tensors by HF name; ``layers``:
    a slice (each layer keeps its index: its kind and weights), None for all."""
    x = call("embedding", token_ids, w["model.embed_tokens.weight"])
    x = x[:, None, :].expand(-1, cfg.hc_mult, -1).contiguous()                 # [S, N, H]
    for i in range(len(cfg.layer_ratios)) if layers is None else layers:
        p, ratio = f"model.layers.{i}.", cfg.layer_ratios[i]
        a, post, comb = call("hc_pre", x, *_hc(w, p + "attn_hc."), cfg.hc_iters, cfg.hc_eps, cfg.eps)
        o = attention(cfg, w, p + "self_attn.", call("rms_norm", a, w[p + "input_layernorm.weight"], cfg.eps), ratio)
        x = call("hc_post", o, x, post, comb)
        a, post, comb = call("hc_pre", x, *_hc(w, p + "ffn_hc."), cfg.hc_iters, cfg.hc_eps, cfg.eps)
        o = moe(cfg, w, p + "mlp.", call("rms_norm", a, w[p + "post_attention_layernorm.weight"], cfg.eps), token_ids, i)
        x = call("hc_post", o, x, post, comb)
    hp = "model.hc_head."
    h = call("hc_head", x, w[hp + "hc_fn"], w[hp + "hc_scale"], w[hp + "hc_base"], cfg.hc_eps, cfg.eps)
    return call("lm_head", call("rms_norm", h, w["model.norm.weight"], cfg.eps), w["lm_head.weight"])


# ----------------------------------------------------------------------------- seeded random weights
def param_shapes(c: dict, layers: list[int]) -> dict[str, tuple[int, ...]]:
    """HF name -> shape of DeepSeek-V4's tensors for ``layers`` of config ``c`` (plus embedding, head, norms)."""
    cfg = V4Config.from_hf(c)
    h, v, hq, d, n = c["hidden_size"], c["vocab_size"], cfg.heads, cfg.head_dim, cfg.hc_mult
    lq, e, im, di = c["q_lora_rank"], c["n_routed_experts"], c["moe_intermediate_size"], cfg.index_dim
    g, rank = cfg.o_groups, c["o_lora_rank"]
    out = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,), "lm_head.weight": (v, h),
           "model.hc_head.hc_fn": (n, n * h), "model.hc_head.hc_base": (n,), "model.hc_head.hc_scale": (1,)}
    for i in layers:
        p, r = f"model.layers.{i}.", cfg.layer_ratios[i]
        for hc in ("attn_hc.", "ffn_hc."):
            out.update({p + hc + "fn": ((2 + n) * n, n * h), p + hc + "base": ((2 + n) * n,), p + hc + "scale": (3,)})
        a = p + "self_attn."
        out.update({p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
                    a + "q_a_proj.weight": (lq, h), a + "q_a_norm.weight": (lq,), a + "q_b_proj.weight": (hq * d, lq),
                    a + "kv_proj.weight": (d, h), a + "kv_norm.weight": (d,), a + "sinks": (hq,),
                    a + "o_a_proj.weight": (g * rank, hq * d // g), a + "o_b_proj.weight": (h, g * rank)})
        if r:
            wide = 2 if r == cfg.csa_ratio else 1
            cp = a + "compressor."
            out.update({cp + "kv_proj.weight": (wide * d, h), cp + "gate_proj.weight": (wide * d, h),
                        cp + "position_bias": (r, wide * d), cp + "kv_norm.weight": (d,)})
            if wide == 2:
                ip = cp + "indexer."
                out.update({ip + "kv_proj.weight": (2 * di, h), ip + "gate_proj.weight": (2 * di, h),
                            ip + "position_bias": (r, 2 * di), ip + "kv_norm.weight": (di,),
                            ip + "q_b_proj.weight": (cfg.index_heads * di, lq),
                            ip + "scorer.weights_proj.weight": (cfg.index_heads, h)})
        m = p + "mlp."
        out.update({m + "gate.weight": (e, h), m + "experts.gate_up_proj": (e, 2 * im, h),
                    m + "experts.down_proj": (e, h, im), m + "shared_experts.gate_proj.weight": (im, h),
                    m + "shared_experts.up_proj.weight": (im, h), m + "shared_experts.down_proj.weight": (h, im)})
        out[m + ("gate.tid2eid" if i < cfg.num_hash_layers else "gate.e_score_correction_bias")] = \
            (v, cfg.top_k) if i < cfg.num_hash_layers else (e,)
    return out


def init_weights(c: dict, layers: list[int], device="cpu", dtype=torch.bfloat16, seed: int = 0) -> dict:
    """Seeded random weights by HF name: projections N(0, 1/fan_in), norms ~1, hc / routing tensors fp32, the hash
    table k distinct experts per token id."""
    g = torch.Generator(device=torch.device(device)).manual_seed(seed)     # drawn on the device: 6.6 B per layer

    def randn(shape):
        return torch.randn(shape, generator=g, device=device)
    out = {}
    for name, shape in param_shapes(c, layers).items():
        if name.endswith("tid2eid"):
            t = torch.rand(shape[0], c["n_routed_experts"], generator=g, device=device).argsort(-1)[:, :shape[1]]
        elif name.endswith(("norm.weight", "layernorm.weight")):
            t = (1.0 + 0.05 * randn(shape)).to(dtype)
        elif name.endswith(("hc_scale", ".scale")):
            t = torch.ones(shape, device=device)
        elif name.endswith(("base", "bias", "sinks", "position_bias")):
            t = 0.1 * randn(shape)
        elif name.endswith(".fn") or name.endswith("hc_fn"):
            t = randn(shape) * shape[-1] ** -0.5
        else:
            t = (randn(shape) * shape[-1] ** -0.5).to(dtype)
        out[name] = t
    return out
