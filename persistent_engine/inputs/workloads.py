"""Workloads: the inputs of one forward step at a workload point, with the paged KV cache filled.

A point is an ``io_struct.WorkloadPoint`` (phase "decode" | "prefill", batch, context, chunk, weight):
decode runs ``batch`` sequences with ``context`` cached tokens and one new token each; prefill runs a
chunk of ``chunk`` new tokens per sequence on top of ``context`` cached ones. ``model.step(wl)`` may
run any number of times on the same workload: it writes the new tokens' K/V to the same slots.

The cached context is synthetic N(0, 1) K/V by default (``fill="random"``: fast, the right shapes and
bytes), or produced by the model itself (``fill="model"``: a prefill over random tokens; realistic
values for the slow tier and for equivalence tests).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import torch

from persistent_engine.io_struct import WorkloadPoint
from persistent_engine.models.kv_cache import KVCache
from persistent_engine.ops.opdef import DEFAULT_BLOCK_SIZE

__all__ = ["Workload", "WorkloadError", "make_workload", "relayout_workload"]


class WorkloadError(ValueError):
    user_error = True


@dataclass
class Workload:
    phase: str
    batch: int
    context: int
    chunk: int
    token_ids: torch.Tensor          # [T] int64, T = batch * chunk, sequence-major
    positions: torch.Tensor          # [T] int64
    slot_mapping: torch.Tensor       # [T] int64: flat cache slot (block * BS + offset) of each new token
    context_lens: torch.Tensor       # [B] int32: cached tokens after this step (context + chunk)
    cu_seqlens_q: torch.Tensor       # [B + 1] int32
    last_token_index: torch.Tensor   # [B] int64: row of each sequence's last new token
    cache: KVCache
    point: WorkloadPoint = field(default_factory=WorkloadPoint)

    @property
    def block_tables(self) -> torch.Tensor:
        return self.cache.block_tables

    @property
    def num_tokens(self) -> int:
        return self.batch * self.chunk


def _draw_tokens(vocab: int, n: int, seed: int, dist: str) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    if dist == "uniform":
        return torch.randint(0, vocab, (n,), generator=g)
    if dist == "zipf":          # log-uniform ranks: P(rank r) ~ 1/r, a skewed, realistic token mix
        u = torch.rand(n, generator=g, dtype=torch.float64)
        return (torch.exp(u * torch.log(torch.tensor(float(vocab)))) - 1).long().clamp(0, vocab - 1)
    raise WorkloadError(f"unknown token distribution {dist!r}; use uniform or zipf")


def make_workload(model, point: WorkloadPoint, seed: int = 0, *, cache: KVCache | None = None,
                  token_ids: torch.Tensor | None = None, fill: str = "random", tokens: str = "uniform",
                  block_size: int | None = None, capacity: int | None = None) -> Workload:
    """The workload of ``point`` for ``model``. ``cache``: reuse a cache (e.g. one a previous prefill
    filled; ``fill`` is then ignored); ``token_ids``: the step's tokens [batch * chunk] instead of random
    ones; ``capacity``: tokens per sequence to allocate (default context + chunk)."""
    phase = point.phase
    if phase not in ("decode", "prefill"):
        raise WorkloadError(f"unknown phase {phase!r}; use decode or prefill")
    batch, context = int(point.batch), int(point.context)
    chunk = 1 if phase == "decode" else int(point.chunk)
    if batch < 1 or context < 0 or chunk < 1:
        raise WorkloadError(f"bad workload point {point}: need batch >= 1, context >= 0, chunk >= 1")
    total = context + chunk
    if total > model.max_positions:
        raise WorkloadError(f"context {context} + chunk {chunk} exceeds the model's {model.max_positions} positions")
    dev = model.device
    bs = int(block_size or DEFAULT_BLOCK_SIZE)
    if cache is None:
        cap = max(int(capacity or 0), total)
        cache = model.alloc_cache(batch, cap, block_size=bs, seed=seed, fill="zeros" if fill != "random" else "random")
        if fill == "model" and context > 0:
            pre = make_workload(model, WorkloadPoint("prefill", batch, 0, context), seed + 1,
                                cache=cache, tokens=tokens)
            model.step(pre)
            cache.commit_states()           # recurrent layers: the prefill's states are the context's
        elif fill not in ("random", "model", "zeros"):
            raise WorkloadError(f"unknown cache fill {fill!r}; use random, model or zeros")
    if cache.batch != batch or cache.capacity < total:
        raise WorkloadError(f"cache holds {cache.batch} sequences of {cache.capacity} tokens; point needs {batch} of {total}")
    n = batch * chunk
    ids = _draw_tokens(model.spec.vocab_size, n, seed, tokens) if token_ids is None else token_ids.long().flatten()
    if ids.numel() != n:
        raise WorkloadError(f"token_ids has {ids.numel()} tokens, the point needs {n}")
    seq = torch.arange(batch).repeat_interleave(chunk)
    pos = context + torch.arange(chunk).repeat(batch)
    slots = cache.slots(pos.to(dev), seq.to(dev))
    cu = torch.arange(batch + 1, dtype=torch.int32) * chunk
    return Workload(phase=phase, batch=batch, context=context, chunk=chunk, token_ids=ids.to(dev), positions=pos.to(dev),
                    slot_mapping=slots, context_lens=torch.full((batch,), total, dtype=torch.int32, device=dev),
                    cu_seqlens_q=cu.to(dev), last_token_index=(cu[1:] - 1).long().to(dev), cache=cache,
                    point=point)


def relayout_workload(model, wl, block_size: int, seed: int):
    """``wl`` with the same cached K/V paged in blocks of ``block_size`` (fresh random block order) and the same
    recurrent states; slot mapping and block tables follow. Memory: one more KV cache of the point."""
    from persistent_engine.ops.attention import gather_pages

    old = wl.cache
    batch, cap = old.batch, old.capacity
    new = model.alloc_cache(batch, cap, block_size=block_size, seed=seed, fill="zeros")
    seq = torch.arange(batch, device=old.block_tables.device).repeat_interleave(cap)
    pos = torch.arange(cap, device=old.block_tables.device).repeat(batch)
    slots = new.slots(pos, seq)                                   # [B*cap] where token (b, j) goes
    for pools_old, pools_new in ((old.state, new.state), (old.conv, new.conv), (old.state_next, new.state_next),
                                 (old.conv_next, new.conv_next)):
        for layer, src in pools_old.items():        # per sequence, not paged
            pools_new[layer].copy_(src)
    for pools_old, pools_new in ((old.k, new.k), (old.v, new.v), (old.index_k, new.index_k)):
        for layer, src in pools_old.items():
            flat = gather_pages(src, old.block_tables)[:, :cap].reshape(batch * cap, *src.shape[2:])
            pools_new[layer].view(-1, *src.shape[2:]).index_copy_(0, slots, flat)
    for ents_old, ents_new in ((old.entries, new.entries), (old.index_entries, new.index_entries)):
        for layer, src in ents_old.items():             # per sequence, not paged: copied as they are
            ents_new[layer].copy_(src)
    tok_seq = torch.arange(wl.batch, device=wl.positions.device).repeat_interleave(wl.chunk)
    return dataclasses.replace(wl, cache=new, slot_mapping=new.slots(wl.positions, tok_seq))
