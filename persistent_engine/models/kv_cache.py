"""The paged KV cache: per layer a pool of NB blocks of BS tokens, and one block table per sequence.

GQA layers keep ``k[NB, BS, Hk, Dh]`` and ``v[NB, BS, Hk, Dh]``; MLA layers keep one latent pool
``k[NB, BS, kv_lora_rank + rope_dim]``; their ``v`` is absent, except on layers that run a DSA
lightning indexer, where ``v[NB, BS, index_head_dim]`` holds the indexer's keys; MiniMax-M3's block-sparse layers keep
their index keys in ``index_k[NB, BS, Di]``; DeepSeek-V4 layers keep the K = V rows in ``k[NB, BS, D]``, their
compressor's source rows in ``v`` / ``index_k`` and their compressed entries per sequence in ``entries`` /
``index_entries`` (``models/deepseek_v4_decoder.py``). Blocks are handed out in a seeded random
order, so a kernel that assumes contiguous blocks fails verification. Bytes per token and layer:
``spec.kv_bytes_per_token_layer()``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from persistent_engine.ops.opdef import DEFAULT_BLOCK_SIZE


@dataclass
class KVCache:
    block_size: int
    block_tables: torch.Tensor            # [B, MB] int32
    k: dict[int, torch.Tensor] = field(default_factory=dict)   # layer index -> pool
    v: dict[int, torch.Tensor] = field(default_factory=dict)   # layer index -> pool (GQA only)
    index_k: dict[int, torch.Tensor] = field(default_factory=dict)   # block-sparse layers: index keys [NB, BS, Di]
    entries: dict[int, torch.Tensor] = field(default_factory=dict)        # DeepSeek-V4: [B, NE, D] per sequence
    index_entries: dict[int, torch.Tensor] = field(default_factory=dict)  # DeepSeek-V4 CSA: [B, NE, Di]

    @property
    def batch(self) -> int:
        return self.block_tables.shape[0]

    @property
    def capacity(self) -> int:
        """Tokens each sequence can hold."""
        return self.block_tables.shape[1] * self.block_size

    def slots(self, positions: torch.Tensor, seq_index: torch.Tensor) -> torch.Tensor:
        """Flat slot (block * BS + offset) of token ``positions[t]`` of sequence ``seq_index[t]``: [T] int64."""
        blocks = self.block_tables[seq_index, positions // self.block_size].long()
        return blocks * self.block_size + positions % self.block_size

    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in (*self.k.values(), *self.v.values(), *self.index_k.values(),
                                                         *self.entries.values(), *self.index_entries.values()))


def alloc_kv_cache(spec, layers: list[int], batch: int, tokens_per_seq: int, *, device="cpu",
                   dtype=torch.bfloat16, block_size: int = DEFAULT_BLOCK_SIZE, seed: int = 0,
                   fill: str = "random") -> KVCache:
    """A cache for ``batch`` sequences of up to ``tokens_per_seq`` tokens in each of ``layers``.
    ``fill``: "random" (N(0, 1) everywhere: a synthetic cached context) or "zeros"."""
    if spec.attention == "v4":
        from persistent_engine.models.deepseek_v4_decoder import alloc_v4_cache

        return alloc_v4_cache(spec, layers, batch, tokens_per_seq, device=device, dtype=dtype, block_size=block_size,
                              seed=seed, fill=fill)
    mb = max(1, -(-tokens_per_seq // block_size))
    nb = batch * mb
    perm = torch.randperm(nb, generator=torch.Generator().manual_seed(seed))
    tables = perm.view(batch, mb).to(torch.int32).to(device)
    g = torch.Generator(device=torch.device(device))
    g.manual_seed(seed)

    def pool(*shape):
        if fill == "zeros":
            return torch.zeros(shape, device=device, dtype=dtype)
        return torch.randn(shape, device=device, dtype=dtype, generator=g)

    cache = KVCache(block_size=block_size, block_tables=tables)
    for i in layers:
        if spec.attention == "mla":
            cache.k[i] = pool(nb, block_size, spec.kv_lora_rank + spec.qk_rope_head_dim)
            if spec.indexer_kind(i) == "full":
                cache.v[i] = pool(nb, block_size, spec.index_head_dim)
        else:
            cache.k[i] = pool(nb, block_size, spec.num_kv_heads, spec.head_dim)
            cache.v[i] = pool(nb, block_size, spec.num_kv_heads, spec.head_dim)
            if spec.block_sparse(i):
                cache.index_k[i] = pool(nb, block_size, spec.msa_index_dim)
    return cache
