"""The paged KV cache: per layer a pool of NB blocks of BS tokens, and one block table per sequence.

GQA layers keep ``k[NB, BS, Hk, Dh]`` and ``v[NB, BS, Hk, Dv]`` (Dv = Dh but for MiMo-V2-Flash, whose windowed
layers also have their own Hk: ``spec.layer_kv_heads``; Gemma-4's layer kinds differ in Hk and Dh:
``spec.layer_head_dim``); MLA layers keep one latent pool ``k[NB, BS, kv_lora_rank + rope_dim]``; their ``v`` is
absent, except on layers that run a DSA lightning indexer, where ``v[NB, BS, index_head_dim]`` holds the indexer's
keys; MiniMax-M3's block-sparse layers keep their index keys in ``index_k[NB, BS, Di]``; DeepSeek-V4 layers keep
the K = V rows in ``k[NB, BS, D]``, their compressor's source rows in ``v`` / ``index_k`` and their compressed
entries per sequence in ``entries`` / ``index_entries`` (``models/deepseek_v4_decoder.py``). Blocks are handed out
in a seeded random order, so a kernel that assumes contiguous blocks fails verification.

Recurrent layers keep no per-token cache but a fixed state per sequence: Qwen3.5's Gated DeltaNet layers
``state[B, Hv, Dk, Dv]`` fp32 and ``conv[B, C, K-1]``, Kimi delta attention layers ``state[B, H, Dk, Dv]`` fp32
and ``conv[B, 3 H Dk, W - 1]`` (the short conv's last inputs), Nemotron-H's Mamba-2 layers ``state[B, Hm, P, N]``
fp32 and ``conv[B, I + 2 G N, K-1]`` (its MLP and MoE layers cache nothing), as they stand after the cached context. A step
reads ``state``/``conv`` and writes the states after its tokens to ``state_next``/``conv_next``, so a step can
run again on the same workload (as the K/V writes can: CUDA graph replay, verification, timing);
``commit_states()`` makes the written states current (after a real step). Bytes per token and layer:
``spec.kv_bytes_per_token_layer()``.

Every layer writes its step's rows with ``write_kv`` (pool, slots, rows): eagerly a plain
``index_copy_`` into the pool's flat [NB * BS, ...] view; under ``torch.compile`` the opaque custom op
``tkcc::kv_write``, which declares that it mutates the pool (as vLLM's ``reshape_and_cache``), so
inductor calls it in place. A traced ``index_copy_`` on a view of a graph input is functionalized into
an out-of-place copy of the whole pool and a ``copy_`` back (CUDA inductor: two full-pool kernels
per layer and step, 4 ms each at an 8 GiB pool).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch

from persistent_engine.ops.kv_write import kv_write, write_kv  # noqa: F401 - the models' KV writes
from persistent_engine.ops.opdef import DEFAULT_BLOCK_SIZE


@dataclass
class KVCache:
    block_size: int
    block_tables: torch.Tensor            # [B, MB] int32
    k: dict[int, torch.Tensor] = field(default_factory=dict)   # layer index -> pool
    v: dict[int, torch.Tensor] = field(default_factory=dict)   # layer index -> pool (GQA only)
    index_k: dict[int, torch.Tensor] = field(default_factory=dict)   # block-sparse layers: index keys [NB, BS, Di]
    state: dict[int, torch.Tensor] = field(default_factory=dict)     # recurrent layers: [B, H, Dk, Dv] fp32
    conv: dict[int, torch.Tensor] = field(default_factory=dict)      # recurrent layers: conv inputs [B, C, K-1]
    state_next: dict[int, torch.Tensor] = field(default_factory=dict)   # what the last step wrote (same shapes)
    conv_next: dict[int, torch.Tensor] = field(default_factory=dict)
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

    def commit_states(self) -> None:
        """The recurrent layers' states written by the last step become the states the next step reads."""
        for cur, new in ((self.state, self.state_next), (self.conv, self.conv_next)):
            for i, t in new.items():
                cur[i].copy_(t)

    def nbytes(self) -> int:
        pools = (self.k, self.v, self.index_k, self.entries, self.index_entries, self.state, self.conv, self.state_next,
                 self.conv_next)
        return sum(t.numel() * t.element_size() for p in pools for t in p.values())


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

    def pool(*shape, dt=dtype, std=1.0):
        if fill == "zeros":
            return torch.zeros(shape, device=device, dtype=dt)
        if dt is dtype and std == 1.0:
            return torch.randn(shape, device=device, dtype=dtype, generator=g)
        return (torch.randn(shape, device=device, dtype=torch.float32, generator=g) * std).to(dt)

    cache = KVCache(block_size=block_size, block_tables=tables)
    for i in layers:
        # recurrent layers: a synthetic context's states (fp32 N(0, std^2); Gated DeltaNet: std 1/sqrt(Dk), the state
        # of unit keys' sums), and the same again as the state a step writes
        if spec.is_linear(i):
            cache.state[i] = pool(batch, spec.linear_num_v_heads, spec.linear_k_dim, spec.linear_v_dim,
                                  dt=torch.float32, std=spec.linear_k_dim ** -0.5)
            cache.conv[i] = pool(batch, spec.linear_conv_dim, spec.linear_conv_kernel - 1)
        elif spec.is_kda_layer(i):
            n, d = spec.kda_num_heads, spec.kda_head_dim
            cache.state[i] = pool(batch, n, d, d, dt=torch.float32, std=0.3)
            cache.conv[i] = pool(batch, 3 * n * d, spec.kda_conv_size - 1)
        elif spec.is_mamba(i):                  # Nemotron-H Mamba-2: SSM [B, Hm, P, N] fp32, conv [B, I + 2 G N, K-1]
            cache.state[i] = pool(batch, spec.mamba_num_heads, spec.mamba_head_dim, spec.ssm_state_size,
                                  dt=torch.float32, std=0.3)
            cache.conv[i] = pool(batch, spec.mamba_conv_dim, spec.mamba_conv_kernel - 1)
        elif spec.layer_block(i) in ("mlp", "moe"):     # Nemotron-H MLP / MoE layers: nothing cached
            continue
        if i in cache.state:
            cache.state_next[i], cache.conv_next[i] = cache.state[i].clone(), cache.conv[i].clone()
            continue
        if spec.kv_source(i) != i:                  # Gemma-4: attends an earlier layer's pool, keeps none
            continue
        if spec.attention == "mla":
            cache.k[i] = pool(nb, block_size, spec.kv_lora_rank + spec.qk_rope_head_dim)
            if spec.indexer_kind(i) == "full":
                cache.v[i] = pool(nb, block_size, spec.index_head_dim)
        else:
            hk = spec.layer_kv_heads(i)
            cache.k[i] = pool(nb, block_size, hk, spec.layer_head_dim(i))         # Gemma-4: per layer kind
            cache.v[i] = pool(nb, block_size, hk, spec.layer_v_head_dim(i))
            if spec.block_sparse(i):
                cache.index_k[i] = pool(nb, block_size, spec.msa_index_dim)
    return cache
