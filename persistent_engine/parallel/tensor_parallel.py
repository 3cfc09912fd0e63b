"""Tensor- and expert-parallel slices of the generic decoder (Megatron-style), one rank per process.

    cfg = ParallelConfig(tp=4, ep=4)                    # inside a process group of 4 ranks
    model = build_sharded(spec, cfg, rank, layers=[0, 1], device="cuda:0", dtype=torch.bfloat16, seed=0)
    wl = make_workload(model, point, seed)               # allocates this rank's KV heads only
    logits = model.step(wl)                              # [B, V] fp32, identical on every rank

What each rank r of tp holds (Hq query heads, Hk KV heads, I dense width, E experts of width Im):
  attention  qkv_w rows of its Hq/tp query heads and their KV heads (Hk/tp of them; when tp > Hk
             each KV head is replicated on tp/Hk ranks), o_w columns of those heads -> partial
             [T, H], all-reduce (2 (tp-1)/tp T H bytes on the wire per rank)
  dense MLP  gate/up rows and down columns of I/tp -> partial, all-reduce
  MoE        router replicated (every rank routes every token the same way); experts split over
             ep groups of tp/ep ranks, rank r holds experts [g E/ep, (g+1) E/ep) of group g = r // (tp/ep)
             and the (r mod tp/ep)-th 1/(tp/ep) slice of their width; shared experts split by width
             over all tp ranks; every rank computes its part for all tokens -> one all-reduce
             (simple EP: the all-to-all dispatch of DeepEP-style EP is not used)
  KV cache   [NB, BS, Hk_local, Dh] per layer: the same block tables and slots as the reference
  embed      replicated; lm_head vocab-parallel (ceil(V/tp) rows, zero-padded) + all-gather of
             the fp32 logits [B, V]
Every op still goes through the registry, so a candidate's override reaches the sharded model too.
Norms, the residual stream and the embedding are replicated (every rank holds the full [T, H]).
MLA attention and MiniMax's per-layer QK-norm (a norm over all heads) are not sharded yet.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch

from persistent_engine.models.decoder import Decoder, _resolve_layers
from persistent_engine.models.kv_cache import KVCache
from persistent_engine.models.moe import MoEMLP, swiglu
from persistent_engine.models.spec import ModelSpec
from persistent_engine.models.weights import init_params, param_specs
from persistent_engine.ops.registry import call
from persistent_engine.parallel.group import ParallelError, all_gather_last, all_reduce

__all__ = ["ParallelConfig", "TPDecoder", "build_sharded", "check_supported", "kv_head_range", "local_spec",
           "shard_cache", "shard_model", "shard_params", "shard_tensor", "shard_workload"]


@dataclass(frozen=True)
class ParallelConfig:
    tp: int = 1          # ranks in the group: heads, dense width and vocab split tp ways
    ep: int = 1          # MoE: experts split over ep groups of tp/ep ranks (ep == 1: experts split by width)

    def __post_init__(self):
        if self.tp < 1 or self.ep < 1 or self.tp % self.ep:
            raise ParallelError(f"need tp >= 1 and ep dividing tp, got tp={self.tp} ep={self.ep}")

    @property
    def moe_tp(self) -> int:
        """Ranks that share one expert group (each holds 1/moe_tp of every expert's width)."""
        return self.tp // self.ep

    def label(self) -> str:
        return f"tp{self.tp}" + (f"-ep{self.ep}" if self.ep > 1 else "")


def check_supported(spec: ModelSpec, cfg: ParallelConfig) -> None:
    """Raise ParallelError when ``spec`` cannot be sharded as ``cfg`` says."""
    tp, why = cfg.tp, None
    if spec.hybrid_pattern:
        why = "Nemotron-H's blocks (Mamba-2, relu2 MLP and MoE) are not sharded yet"
    elif spec.attention == "mla":
        why = "MLA attention is not sharded yet"
    elif spec.moe_input_scaled:
        why = "Llama-4's input-scaled experts are not sharded yet"
    elif spec.final_softcap:
        why = "final logit soft-capping (Gemma) is not sharded yet"
    elif spec.window_kv_heads or spec.gqa_v_head_dim != spec.head_dim:
        why = "per-layer KV head counts and V heads narrower than Q/K (MiMo-V2-Flash) are not sharded yet"
    elif spec.o_bias or spec.moe_bias:
        why = "gpt-oss's o-projection and expert biases (and its MXFP4 packs) are not sharded yet"
    elif spec.qk_norm == "per_layer":
        why = "a per-layer QK-norm (over all heads) is not sharded yet"
    elif spec.num_heads % tp:
        why = f"tp={tp} does not divide {spec.num_heads} query heads"
    elif (spec.num_kv_heads % tp) if tp <= spec.num_kv_heads else (tp % spec.num_kv_heads):
        why = f"tp={tp} and {spec.num_kv_heads} KV heads: one must divide the other"
    elif spec.intermediate_size % tp:
        why = f"tp={tp} does not divide the dense width {spec.intermediate_size}"
    elif spec.is_moe and spec.num_experts % cfg.ep:
        why = f"ep={cfg.ep} does not divide {spec.num_experts} experts"
    elif spec.is_moe and spec.moe_intermediate_size % cfg.moe_tp:
        why = f"tp/ep={cfg.moe_tp} does not divide the expert width {spec.moe_intermediate_size}"
    elif spec.num_shared_experts and (spec.shared_intermediate_size * spec.num_shared_experts) % tp:
        why = f"tp={tp} does not divide the shared-expert width"
    if why:
        raise ParallelError(f"cannot shard {spec.name} as {cfg.label()}: {why}")


def kv_head_range(spec: ModelSpec, cfg: ParallelConfig, rank: int) -> tuple[int, int]:
    """[first, end) KV heads rank ``rank`` holds (one replicated head when tp > Hk)."""
    hk = spec.num_kv_heads
    if cfg.tp <= hk:
        n = hk // cfg.tp
        return rank * n, (rank + 1) * n
    first = rank * hk // cfg.tp
    return first, first + 1


def local_spec(spec: ModelSpec, cfg: ParallelConfig) -> ModelSpec:
    """The per-rank shapes the decoder classes read (heads, KV heads, dense width); vocab, expert
    count and layer kinds stay those of the full model."""
    first, end = kv_head_range(spec, cfg, 0)
    return spec.replace(num_heads=spec.num_heads // cfg.tp, num_kv_heads=end - first,
                        intermediate_size=spec.intermediate_size // cfg.tp)


def _rows(t: torch.Tensor, first: int, n: int, dim: int = 0) -> torch.Tensor:
    return t.narrow(dim, first, n)


def _split_gate_up(t: torch.Tensor, parts: int, j: int, dim: int) -> torch.Tensor:
    """The j-th of ``parts`` slices of both halves (gate, up) of a [.., 2I, ..] tensor along ``dim``."""
    gate, up = t.chunk(2, dim=dim)
    n = gate.shape[dim] // parts
    return torch.cat([_rows(gate, j * n, n, dim), _rows(up, j * n, n, dim)], dim=dim)


def vocab_shard(t: torch.Tensor, cfg: ParallelConfig, rank: int) -> torch.Tensor:
    """Rows [r ceil(V/tp), ...) of a [V, H] matrix, zero-padded to ceil(V/tp) rows."""
    v = t.shape[0]
    n = -(-v // cfg.tp)
    first = min(rank * n, v)
    part = t[first:min(first + n, v)]
    if part.shape[0] < n:
        part = torch.cat([part, part.new_zeros(n - part.shape[0], *t.shape[1:])])
    return part


def shard_tensor(spec: ModelSpec, cfg: ParallelConfig, rank: int, name: str, t: torch.Tensor) -> torch.Tensor:
    """Rank ``rank``'s part of the internal tensor ``name`` (weights.py layout); a fresh tensor."""
    tp, key = cfg.tp, name.rsplit(".", 1)[-1]
    hq, dh = spec.num_heads, spec.head_dim
    if key == "lm_head":
        return vocab_shard(t, cfg, rank).clone()
    if key in ("qkv_w", "qkv_b"):
        nq, hk = hq // tp, spec.num_kv_heads
        k0, k1 = kv_head_range(spec, cfg, rank)
        q, k, v = t.split([hq * dh, hk * dh, hk * dh])
        return torch.cat([_rows(q, rank * nq * dh, nq * dh), _rows(k, k0 * dh, (k1 - k0) * dh),
                          _rows(v, k0 * dh, (k1 - k0) * dh)]).clone()
    if key == "o_w":
        nq = hq // tp
        return _rows(t, rank * nq * dh, nq * dh, dim=1).clone()
    if key in ("gate_up_w", "shared_gate_up_w"):
        return _split_gate_up(t, tp, rank, dim=0).clone()
    if key in ("down_w", "shared_down_w"):
        n = t.shape[1] // tp
        return _rows(t, rank * n, n, dim=1).clone()
    if key in ("w13", "w2"):
        g, j, ne = rank // cfg.moe_tp, rank % cfg.moe_tp, spec.num_experts // cfg.ep
        experts = _rows(t, g * ne, ne)                                  # [E/ep, ...]
        if key == "w13":
            return _split_gate_up(experts, cfg.moe_tp, j, dim=1).clone()
        n = t.shape[2] // cfg.moe_tp
        return _rows(experts, j * n, n, dim=2).clone()
    return t                   # norms, embedding, router: replicated (shared, not copied)


def shard_params(spec: ModelSpec, cfg: ParallelConfig, rank: int, params: dict[str, torch.Tensor]) -> dict:
    """Rank ``rank``'s tensors of a full model's ``params``; a tied lm_head gets its own vocab shard."""
    check_supported(spec, cfg)
    out = {name: shard_tensor(spec, cfg, rank, name, t) for name, t in params.items()}
    if "lm_head" not in out:
        out["lm_head"] = shard_tensor(spec, cfg, rank, "lm_head", params["embed"])
    return out


def shard_cache(cache: KVCache, spec: ModelSpec, cfg: ParallelConfig, rank: int) -> KVCache:
    """This rank's KV heads of a full cache (copies; block tables shared)."""
    k0, k1 = kv_head_range(spec, cfg, rank)
    return KVCache(block_size=cache.block_size, block_tables=cache.block_tables,
                   k={i: t[:, :, k0:k1].clone() for i, t in cache.k.items()},
                   v={i: t[:, :, k0:k1].clone() for i, t in cache.v.items()})


def shard_workload(wl, spec: ModelSpec, cfg: ParallelConfig, rank: int):
    """The same step (tokens, positions, slots) over this rank's shard of the workload's cache."""
    return dataclasses.replace(wl, cache=shard_cache(wl.cache, spec, cfg, rank))


class _AllReduced:
    """Wraps a row-parallel block (attention or MLP) whose output is a partial sum [T, H]."""

    def __init__(self, inner, group):
        self.inner, self.group = inner, group

    def __call__(self, *args):
        return all_reduce(self.inner(*args), self.group)


class ExpertShardMLP:
    """Routes every token with the replicated router, runs only this rank's experts (assignments to
    other ranks' experts get weight 0 on local expert 0: no host sync, CUDA-graph safe), adds this
    rank's slice of the shared experts. The output is a partial sum [T, H]."""

    def __init__(self, mlp: MoEMLP, first_expert: int):
        self.mlp, self.first = mlp, first_expert
        self.count = mlp.w13.shape[0]

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        weights, ids = self.mlp.route(h)                                         # [T, k] fp32, int64
        local = ids - self.first
        mine = (local >= 0) & (local < self.count)
        out = call("moe_experts", h, self.mlp.w13, self.mlp.w2, weights.masked_fill(~mine, 0.0),
                   local.masked_fill(~mine, 0))
        if self.mlp.shared is not None:
            out = out + swiglu(h, *self.mlp.shared)
        return out


class TPDecoder(Decoder):
    """One rank's shard of a decoder; ``step`` returns the full logits [B, V] fp32 on every rank."""

    def __init__(self, spec: ModelSpec, cfg: ParallelConfig, rank: int, layers: list[int],
                 params: dict[str, torch.Tensor], device, dtype, group=None):
        check_supported(spec, cfg)
        self.full_spec, self.cfg, self.rank, self.group = spec, cfg, rank, group
        super().__init__(local_spec(spec, cfg), layers, params, device, dtype)
        self.lm_head_w = params["lm_head"]                                     # [ceil(V/tp), H]
        first_expert = (rank // cfg.moe_tp) * (spec.num_experts // cfg.ep) if spec.is_moe else 0
        for layer in self.blocks:
            if layer.kind == "moe":
                layer.mlp = ExpertShardMLP(layer.mlp, first_expert)
            if cfg.tp > 1:
                layer.attn, layer.mlp = _AllReduced(layer.attn, group), _AllReduced(layer.mlp, group)

    @torch.no_grad()
    def step(self, wl) -> torch.Tensor:
        h = self.hidden(wl)
        if wl.phase != "decode":
            h = h[wl.last_token_index]                                          # [B, H]
        local = call("lm_head", h, self.lm_head_w)                              # [B, ceil(V/tp)] fp32
        return all_gather_last(local, self.group)[:, :self.full_spec.vocab_size]


def shard_model(model: Decoder, cfg: ParallelConfig, rank: int, group=None) -> TPDecoder:
    """Rank ``rank``'s shard of a built reference decoder (same weights, same layers)."""
    params = shard_params(model.spec, cfg, rank, model.params)
    return TPDecoder(model.spec, cfg, rank, model.layers, params, model.device, model.dtype, group)


def build_sharded(spec: ModelSpec | str, cfg: ParallelConfig, rank: int, layers=None, device="cpu",
                  dtype=torch.bfloat16, seed: int = 0, group=None) -> TPDecoder:
    """Rank ``rank``'s shard of ``build_model(spec, layers, device, dtype, seed)`` without holding the
    full model: each tensor is drawn whole (same generator as the reference), sharded, then freed, so
    peak memory is the shard plus the largest single tensor."""
    if isinstance(spec, str):
        spec = ModelSpec.from_name(spec)
    check_supported(spec, cfg)
    idx = _resolve_layers(spec, layers)
    params: dict[str, torch.Tensor] = {}
    for name in param_specs(spec, idx):
        full = init_params(spec, idx, device=device, dtype=dtype, seed=seed, names={name})[name]
        params[name] = shard_tensor(spec, cfg, rank, name, full)
        if name == "embed" and spec.tie_word_embeddings:
            params["lm_head"] = shard_tensor(spec, cfg, rank, "lm_head", full)
        del full
    return TPDecoder(spec, cfg, rank, idx, params, device, dtype, group)
