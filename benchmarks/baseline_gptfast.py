"""An independent decoder as a user writes one: gpt-fast's model.py (and its Mixtral MoE), from scratch.

    args = ModelArgs.from_name("persistent_engine/models/configs/llama-1b.json")
    model = build_from_tkcc(args, decoder.params, decoder.layers, batch=B, max_seq_length=S)
    load_paged_context(model, cache.k, cache.v, cache.block_tables, context)
    step = compile_decode(model)                      # torch.compile(mode="reduce-overhead", fullgraph=True)
    step = compile_decode(model, "max-autotune-no-cudagraphs")    # the caller captures it in a CUDA graph
    logits = step(idx, input_pos)                     # idx [B, 1] int64, input_pos [1] int64 -> [B, V]

The baseline ``benchmarks/e2e_decode.py`` measures tkcc against (issue 22): only torch is imported, no
code of tkcc runs. Families: Llama (``llama``; Llama-3 rope scaling), Qwen3 (``qwen3``, per-head QK-norm),
Qwen3-MoE (``qwen3_moe``) and Mixtral (``mixtral``), read from the same HF config.json fields tkcc reads.

  config      frozen ``ModelArgs``, ``from_name`` (a config.json path or directory) / ``from_hf_config``
  weights     ``nn.Linear`` modules (fused ``wqkv``; ``w1`` / ``w3`` / ``w2`` SwiGLU), ``RMSNorm``
  rope        gpt-fast's interleaved pairs (``freqs_cis[S, D/2, 2]``); the q/k rows of HF-layout weights are
              permuted into that order, as gpt-fast's checkpoint converter does (table kept in fp32,
              gpt-fast keeps bf16: the fp32 test compares the two models tightly)
  KV cache    static, contiguous ``[B, Hkv, S_max, D]`` per layer, ``index_copy_`` at ``input_pos``;
              ``S_max`` rounded up to a multiple of 8 as gpt-fast's ``setup_caches`` does
  attention   ``F.scaled_dot_product_attention(q, k, v, attn_mask=causal_mask[input_pos], enable_gqa=True)``
  MoE         gpt-fast's Mixtral: router softmax (fp32, as HF Qwen3-MoE) -> top-k -> renormalised when
              ``norm_topk_prob``; experts gathered ``w1[expert_indices]`` and applied by einsum (reads
              T * k experts' weights per step, materialised by the gather)

``state_dict_from_tkcc`` is the one place tkcc's tensors are read: its Decoder's params (internal names,
``persistent_engine/models/weights.py``) mapped to this model's, so both compute the same function;
``load_paged_context`` copies the cached context out of tkcc's paged cache into the static one.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

__all__ = ["ModelArgs", "Transformer", "Unsupported", "build_from_tkcc", "compile_decode", "load_paged_context",
           "state_dict_from_tkcc"]

FAMILIES = {"llama": (False, False), "qwen3": (True, False), "qwen3_moe": (True, True), "mixtral": (False, True)}


class Unsupported(ValueError):
    """A model this baseline does not implement (another family, attention bias, a sliding window, ...)."""


def find_multiple(n: int, k: int) -> int:
    return n if n % k == 0 else n + k - n % k


@dataclass(frozen=True)
class ModelArgs:
    name: str
    vocab_size: int
    dim: int
    n_layer: int
    n_head: int
    n_local_heads: int
    head_dim: int
    intermediate_size: int
    norm_eps: float
    rope_base: float
    rope_scaling: tuple[tuple[str, float], ...] | None   # Llama-3's (factor, low/high_freq_factor, original max)
    block_size: int                                      # max positions
    tie_embeddings: bool
    qk_norm: bool = False                                # Qwen3: RMSNorm over each q / k head before the rope
    num_experts: int = 0                                 # 0: dense
    num_activated_experts: int = 0
    moe_intermediate_size: int = 0
    norm_topk_prob: bool = True
    dense_layers: tuple[int, ...] = ()                   # MoE models: layers with a dense MLP instead

    @classmethod
    def from_name(cls, name: str | Path) -> "ModelArgs":
        """A config.json path (or its directory)."""
        path = Path(name)
        path = path / "config.json" if path.is_dir() else path
        try:
            cfg = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            raise Unsupported(f"cannot read config {path}: {e}") from None
        return cls.from_hf_config(cfg, path.stem)

    @classmethod
    def from_hf_config(cls, c: dict, name: str) -> "ModelArgs":
        family = c.get("model_type")
        if family not in FAMILIES:
            raise Unsupported(f"{name}: model_type {family!r} (this baseline implements {', '.join(FAMILIES)})")
        if c.get("attention_bias") or c.get("use_sliding_window") or (family == "mixtral" and c.get("sliding_window")):
            raise Unsupported(f"{name}: attention bias or sliding window")
        sc = c.get("rope_scaling")
        if sc and (sc.get("rope_type") or sc.get("type")) != "llama3":
            raise Unsupported(f"{name}: rope scaling {sc.get('rope_type') or sc.get('type')!r} (only llama3)")
        if c.get("partial_rotary_factor", 1.0) != 1.0:
            raise Unsupported(f"{name}: partial rotary")
        qk_norm, moe = FAMILIES[family]
        n_layer, dim, n_head = int(c["num_hidden_layers"]), int(c["hidden_size"]), int(c["num_attention_heads"])
        kw = {}
        if moe:
            step = int(c.get("decoder_sparse_step", 1))
            dense = set(c.get("mlp_only_layers") or ()) | {i for i in range(n_layer) if (i + 1) % step}
            kw = dict(num_experts=int(c.get("num_experts") or c["num_local_experts"]),
                      num_activated_experts=int(c["num_experts_per_tok"]),
                      moe_intermediate_size=int(c.get("moe_intermediate_size") or c["intermediate_size"]),
                      norm_topk_prob=bool(c.get("norm_topk_prob", True)), dense_layers=tuple(sorted(dense)))
        return cls(name=name, vocab_size=int(c["vocab_size"]), dim=dim, n_layer=n_layer, n_head=n_head,
                   n_local_heads=int(c.get("num_key_value_heads") or n_head),
                   head_dim=int(c.get("head_dim") or dim // n_head), intermediate_size=int(c["intermediate_size"]),
                   norm_eps=float(c.get("rms_norm_eps", 1e-5)), rope_base=float(c.get("rope_theta", 10000.0)),
                   rope_scaling=tuple(sorted((k, float(v)) for k, v in sc.items() if k not in ("rope_type", "type")))
                   if sc else None,
                   block_size=int(c.get("max_position_embeddings", 4096)),
                   tie_embeddings=bool(c.get("tie_word_embeddings", False)), qk_norm=qk_norm, **kw)

    def is_moe(self, layer: int) -> bool:
        return self.num_experts > 0 and layer not in self.dense_layers


# ----------------------------------------------------------------------------- the model
class KVCache(nn.Module):
    def __init__(self, batch: int, max_seq_length: int, n_heads: int, head_dim: int, dtype, device):
        super().__init__()
        shape = (batch, n_heads, max_seq_length, head_dim)
        self.register_buffer("k_cache", torch.zeros(shape, dtype=dtype, device=device))
        self.register_buffer("v_cache", torch.zeros(shape, dtype=dtype, device=device))

    def update(self, input_pos: Tensor, k_val: Tensor, v_val: Tensor) -> tuple[Tensor, Tensor]:
        """input_pos [S], k_val / v_val [B, H, S, D] -> the whole caches [B, H, S_max, D]."""
        self.k_cache.index_copy_(2, input_pos, k_val)
        self.v_cache.index_copy_(2, input_pos, v_val)
        return self.k_cache, self.v_cache


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: Tensor) -> Tensor:
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).type_as(x) * self.weight


class Attention(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.n_head, self.n_local_heads, self.head_dim = args.n_head, args.n_local_heads, args.head_dim
        total = (args.n_head + 2 * args.n_local_heads) * args.head_dim
        self.wqkv = nn.Linear(args.dim, total, bias=False)
        self.wo = nn.Linear(args.n_head * args.head_dim, args.dim, bias=False)
        self.q_norm = RMSNorm(args.head_dim, args.norm_eps) if args.qk_norm else None
        self.k_norm = RMSNorm(args.head_dim, args.norm_eps) if args.qk_norm else None
        self.kv_cache: KVCache | None = None

    def forward(self, x: Tensor, freqs_cis: Tensor, mask: Tensor, input_pos: Tensor) -> Tensor:
        bsz, seqlen, _ = x.shape
        q_size, kv_size = self.n_head * self.head_dim, self.n_local_heads * self.head_dim
        q, k, v = self.wqkv(x).split([q_size, kv_size, kv_size], dim=-1)
        q = q.view(bsz, seqlen, self.n_head, self.head_dim)
        k = k.view(bsz, seqlen, self.n_local_heads, self.head_dim)
        v = v.view(bsz, seqlen, self.n_local_heads, self.head_dim)
        if self.q_norm is not None:
            q, k = self.q_norm(q), self.k_norm(k)
        q, k = apply_rotary_emb(q, freqs_cis), apply_rotary_emb(k, freqs_cis)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))                   # [B, H, S, D]
        k, v = self.kv_cache.update(input_pos, k, v)
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, dropout_p=0.0, enable_gqa=True)
        return self.wo(y.transpose(1, 2).contiguous().view(bsz, seqlen, q_size))


class FeedForward(nn.Module):
    def __init__(self, dim: int, intermediate_size: int):
        super().__init__()
        self.w1 = nn.Linear(dim, intermediate_size, bias=False)
        self.w3 = nn.Linear(dim, intermediate_size, bias=False)
        self.w2 = nn.Linear(intermediate_size, dim, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class ConditionalFeedForward(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        e, i, d = args.num_experts, args.moe_intermediate_size, args.dim
        self.w1 = nn.Parameter(torch.empty(e, i, d))
        self.w2 = nn.Parameter(torch.empty(e, d, i))
        self.w3 = nn.Parameter(torch.empty(e, i, d))

    def forward(self, x: Tensor, expert_indices: Tensor) -> Tensor:
        """x [T, D], expert_indices [T, A] -> [T, A, D]; gathers T * A experts' weights."""
        w1, w3, w2 = self.w1[expert_indices], self.w3[expert_indices], self.w2[expert_indices]   # [T, A, ., .]
        x1 = F.silu(torch.einsum("ti,taoi -> tao", x, w1))
        x3 = torch.einsum("ti,taoi -> tao", x, w3)
        return torch.einsum("tao,taio -> tai", x1 * x3, w2)


class MOEFeedForward(nn.Module):
    def __init__(self, args: ModelArgs):
        super().__init__()
        self.gate = nn.Linear(args.dim, args.num_experts, bias=False)
        self.cond_ffn = ConditionalFeedForward(args)
        self.dim, self.top_k, self.norm_topk_prob = args.dim, args.num_activated_experts, args.norm_topk_prob

    def forward(self, x: Tensor) -> Tensor:
        shape = x.shape
        x = x.view(-1, self.dim)                                                  # [T, D]
        expert_weights = F.softmax(self.gate(x).float(), dim=-1)                  # [T, E]
        expert_weights, expert_indices = torch.topk(expert_weights, self.top_k, dim=-1)   # [T, A]
        if self.norm_topk_prob:
            expert_weights = expert_weights / expert_weights.sum(dim=-1, keepdim=True)
        out = self.cond_ffn(x, expert_indices)                                    # [T, A, D]
        return torch.einsum("tai,ta -> ti", out, expert_weights.to(x.dtype)).view(shape)


class TransformerBlock(nn.Module):
    def __init__(self, args: ModelArgs, layer: int):
        super().__init__()
        self.attention = Attention(args)
        self.feed_forward = (MOEFeedForward(args) if args.is_moe(layer)
                             else FeedForward(args.dim, args.intermediate_size))
        self.attention_norm = RMSNorm(args.dim, args.norm_eps)
        self.ffn_norm = RMSNorm(args.dim, args.norm_eps)

    def forward(self, x: Tensor, input_pos: Tensor, freqs_cis: Tensor, mask: Tensor) -> Tensor:
        h = x + self.attention(self.attention_norm(x), freqs_cis, mask, input_pos)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    """The decoder restricted to ``layers`` (original indices: a slice keeps each layer's MLP kind)."""

    def __init__(self, args: ModelArgs, layers: tuple[int, ...] | None = None):
        super().__init__()
        self.args = args
        self.layer_ids = tuple(range(args.n_layer)) if layers is None else tuple(layers)
        self.tok_embeddings = nn.Embedding(args.vocab_size, args.dim)
        self.layers = nn.ModuleList(TransformerBlock(args, i) for i in self.layer_ids)
        self.norm = RMSNorm(args.dim, args.norm_eps)
        self.output = nn.Linear(args.dim, args.vocab_size, bias=False)
        self.max_batch_size = self.max_seq_length = -1

    def setup_caches(self, max_batch_size: int, max_seq_length: int) -> "Transformer":
        max_seq_length = find_multiple(max_seq_length, 8)
        if max_seq_length > self.args.block_size:
            raise Unsupported(f"{max_seq_length} positions > the model's {self.args.block_size}")
        self.max_batch_size, self.max_seq_length = max_batch_size, max_seq_length
        w = self.output.weight
        for b in self.layers:
            b.attention.kv_cache = KVCache(max_batch_size, max_seq_length, self.args.n_local_heads, self.args.head_dim,
                                           w.dtype, w.device)
        freqs = precompute_freqs_cis(max_seq_length, self.args).to(w.device)
        self.register_buffer("freqs_cis", freqs, persistent=False)
        causal = torch.tril(torch.ones(max_seq_length, max_seq_length, dtype=torch.bool, device=w.device))
        self.register_buffer("causal_mask", causal, persistent=False)
        return self

    def forward(self, idx: Tensor, input_pos: Tensor) -> Tensor:
        """idx [B, S] tokens at positions input_pos [S] -> logits of the last position [B, V]."""
        mask = self.causal_mask[None, None, input_pos]                            # [1, 1, S, S_max]
        freqs_cis = self.freqs_cis[input_pos]                                     # [S, D/2, 2]
        x = self.tok_embeddings(idx)
        for layer in self.layers:
            x = layer(x, input_pos, freqs_cis, mask)
        return self.output(self.norm(x))[:, -1]


def precompute_freqs_cis(seq_len: int, args: ModelArgs) -> Tensor:
    """[seq_len, D/2, 2] (cos, sin) fp32 of position * freq, freqs with Llama-3 scaling when configured."""
    n = args.head_dim
    freqs = 1.0 / (args.rope_base ** (torch.arange(0, n, 2, dtype=torch.float64) / n))
    if args.rope_scaling is not None:
        freqs = apply_rope_scaling(freqs, dict(args.rope_scaling))
    angles = torch.outer(torch.arange(seq_len, dtype=torch.float64), freqs)
    return torch.stack([angles.cos(), angles.sin()], dim=-1).float()


def apply_rope_scaling(freqs: Tensor, sc: dict) -> Tensor:
    """Llama-3.1: long wavelengths slowed by ``factor``, short ones kept, a smooth ramp between."""
    factor, low, high = sc["factor"], sc.get("low_freq_factor", 1.0), sc.get("high_freq_factor", 4.0)
    old = sc["original_max_position_embeddings"]
    out = []
    for f in freqs.tolist():
        wavelen = 2 * math.pi / f
        if wavelen < old / high:
            out.append(f)
        elif wavelen > old / low:
            out.append(f / factor)
        else:
            smooth = (old / wavelen - low) / (high - low)
            out.append((1 - smooth) * f / factor + smooth * f)
    return torch.tensor(out, dtype=freqs.dtype)


def apply_rotary_emb(x: Tensor, freqs_cis: Tensor) -> Tensor:
    """x [B, S, H, D] with (2i, 2i+1) the rotated pairs; freqs_cis [S, D/2, 2]."""
    xs = x.float().reshape(*x.shape[:-1], -1, 2)
    fc = freqs_cis.view(1, xs.size(1), 1, xs.size(3), 2)
    out = torch.stack([xs[..., 0] * fc[..., 0] - xs[..., 1] * fc[..., 1],
                       xs[..., 1] * fc[..., 0] + xs[..., 0] * fc[..., 1]], -1)
    return out.flatten(3).type_as(x)


MODES = ("reduce-overhead", "max-autotune-no-cudagraphs")


def compile_decode(model: Transformer, mode: str = "reduce-overhead"):
    """gpt-fast's decode compile, ``fullgraph=True``. ``reduce-overhead``: inductor and its own CUDA graphs on
    a GPU, inductor's default mode on CPU (no CUDA graphs); ``max-autotune-no-cudagraphs``: inductor with
    autotuned GEMM and pointwise kernels and no graphs, on either device (the caller may capture the compiled
    step in a CUDA graph of its own)."""
    if mode not in MODES:
        raise ValueError(f"compile mode {mode!r} (one of {', '.join(MODES)})")
    cuda = model.output.weight.device.type == "cuda"
    return torch.compile(model, mode=None if mode == "reduce-overhead" and not cuda else mode, fullgraph=True)


# ----------------------------------------------------------------------------- tkcc's weights and cache
def _halves_to_pairs(d: int) -> Tensor:
    """Row order of one head: HF's rotate-half layout (i, i + D/2) -> interleaved pairs (2i, 2i + 1)."""
    return torch.stack([torch.arange(d // 2), torch.arange(d // 2) + d // 2], dim=1).flatten()


def state_dict_from_tkcc(args: ModelArgs, params: dict[str, Tensor], layers: tuple[int, ...]) -> dict[str, Tensor]:
    """This model's state dict from a tkcc Decoder's params (``layers.{i}.qkv_w [(Hq + 2 Hk) D, H]``, ``o_w``,
    ``q_norm`` / ``k_norm [D]``, ``gate_up_w [2I, H]`` (gate | up), ``down_w``, ``router_w [E, H]``,
    ``w13 [E, 2Im, H]``, ``w2 [E, H, Im]``, ``embed``, ``final_norm``, ``lm_head`` (absent when tied)).
    Copies every tensor (q / k rows permuted per head into rope pairs)."""
    unknown = {k.split(".", 2)[2] for k in params if k.startswith("layers.")} - {
        "input_norm", "post_norm", "qkv_w", "o_w", "q_norm", "k_norm", "gate_up_w", "down_w", "router_w", "w13", "w2"}
    if unknown:
        raise Unsupported(f"tkcc params this baseline has no place for: {', '.join(sorted(unknown))}")
    d, hq, hk = args.head_dim, args.n_head, args.n_local_heads
    pairs = _halves_to_pairs(d)
    heads = torch.cat([h * d + pairs for h in range(hq + hk)] + [torch.arange((hq + hk) * d, (hq + 2 * hk) * d)])
    embed = params["embed"].clone()
    sd = {"tok_embeddings.weight": embed, "norm.weight": params["final_norm"].clone(),
          "output.weight": embed if "lm_head" not in params else params["lm_head"].clone()}
    for j, i in enumerate(layers):
        p, q = f"layers.{i}.", f"layers.{j}."
        sd[q + "attention_norm.weight"] = params[p + "input_norm"].clone()
        sd[q + "ffn_norm.weight"] = params[p + "post_norm"].clone()
        sd[q + "attention.wqkv.weight"] = params[p + "qkv_w"][heads.to(params[p + "qkv_w"].device)].clone()
        sd[q + "attention.wo.weight"] = params[p + "o_w"].clone()
        if args.qk_norm:
            sd[q + "attention.q_norm.weight"] = params[p + "q_norm"][pairs.to(params[p + "q_norm"].device)].clone()
            sd[q + "attention.k_norm.weight"] = params[p + "k_norm"][pairs.to(params[p + "k_norm"].device)].clone()
        if args.is_moe(i):
            w13, im = params[p + "w13"], args.moe_intermediate_size
            f = q + "feed_forward."
            sd[f + "gate.weight"] = params[p + "router_w"].clone()
            sd[f + "cond_ffn.w1"], sd[f + "cond_ffn.w3"] = w13[:, :im].contiguous(), w13[:, im:].contiguous()
            sd[f + "cond_ffn.w2"] = params[p + "w2"].clone()
        else:
            gate_up, n = params[p + "gate_up_w"], args.intermediate_size
            sd[q + "feed_forward.w1.weight"] = gate_up[:n].clone()
            sd[q + "feed_forward.w3.weight"] = gate_up[n:].clone()
            sd[q + "feed_forward.w2.weight"] = params[p + "down_w"].clone()
    return sd


def build_from_tkcc(args: ModelArgs, params: dict[str, Tensor], layers, batch: int, max_seq_length: int) -> Transformer:
    """The baseline on tkcc's weights (their device and dtype), caches for ``batch`` x ``max_seq_length``."""
    layers = tuple(layers)
    with torch.device("meta"):
        model = Transformer(args, layers)
    model.load_state_dict(state_dict_from_tkcc(args, params, layers), assign=True, strict=True)
    return model.requires_grad_(False).eval().setup_caches(batch, max_seq_length)


@torch.no_grad()
def load_paged_context(model: Transformer, k_pools: dict[int, Tensor], v_pools: dict[int, Tensor],
                       block_tables: Tensor, context: int) -> None:
    """The first ``context`` tokens of each sequence from tkcc's paged pools (layer -> [NB, BS, Hk, D], rows
    of sequence b in blocks ``block_tables[b]``) into the static caches (K's head dim into rope pairs)."""
    pairs = _halves_to_pairs(model.args.head_dim).to(block_tables.device)
    b = block_tables.shape[0]
    for layer, i in zip(model.layers, model.layer_ids):
        cache = layer.attention.kv_cache
        for pool, dst, perm in ((k_pools[i], cache.k_cache, pairs), (v_pools[i], cache.v_cache, None)):
            rows = pool[block_tables.long()].reshape(b, -1, *pool.shape[2:])[:, :context]    # [B, ctx, Hk, D]
            rows = rows if perm is None else rows[..., perm]
            dst[:, :, :context] = rows.transpose(1, 2)
