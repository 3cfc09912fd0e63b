"""MiniMax-M3's block-sparse attention of one layer (the math and its sources in ``ops/msa.py``).

The layer's input projection is fused with its norm like every GQA layer, and carries the indexer's
projections too (vLLM's MiniMax-M3 fuses them the same way):
  a        = add_rms_norm_linear(...)           [T, (Hq + 2 Hk) Dh + Hk Di + Di] = [q | k | v | index_q | index_k]
  q, k     = per-head QK-norm, partial neox rotary (GQAAttention);  K/V -> the paged cache
  iq, ik   = per-head rms_norm (index_q_norm / index_k_norm), the same partial rotary;  ik -> the index cache
  blocks   = block_topk(iq, index cache, ...)  [T, Hk, topk_blocks]
  o        = block_sparse_decode / block_sparse_prefill(q, K/V cache, ..., blocks);  out = o_proj(o)
The index cache is ``KVCache.index_k[layer]`` ([NB, BS, Di]).
"""

from __future__ import annotations

import torch

from persistent_engine.models.attention import GQAAttention
from persistent_engine.models.kv_cache import write_kv
from persistent_engine.ops.registry import call


class BlockSparseAttention(GQAAttention):
    def __init__(self, spec, params: dict[str, torch.Tensor], prefix: str, cos_sin: torch.Tensor, scale: float,
                 index: int):
        super().__init__(spec, params, prefix, cos_sin, scale)
        self.index, self.di = index, spec.msa_index_dim
        self.iq_norm, self.ik_norm = params[prefix + "idx_q_norm"], params[prefix + "idx_k_norm"]
        self.select_args = (spec.msa_block_size, spec.msa_topk_blocks, spec.msa_init_blocks, spec.msa_local_blocks)
        self.fused_rotary = None                                  # the split below needs the raw projection

    def __call__(self, a: torch.Tensor, wl, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
        t, hq, hk, dh, di = a.shape[0], self.hq, self.hk, self.dh, self.di
        n = (hq + 2 * hk) * dh
        q, k, v = self._qk_norm_rotary(a[:, :n], wl)
        iq = call("rms_norm", a[:, n:n + hk * di].view(t, hk, di), self.iq_norm, self.eps)
        ik = call("rms_norm", a[:, n + hk * di:].view(t, 1, di), self.ik_norm, self.eps)
        iq, ik = call("rotary_embedding", wl.positions, iq, ik, self.cos_sin, self.rotary_dim)
        write_kv(k_cache, wl.slot_mapping, k)
        write_kv(v_cache, wl.slot_mapping, v)
        index_cache = wl.cache.index_k[self.index]
        write_kv(index_cache, wl.slot_mapping, ik.view(t, di))
        blocks = call("block_topk", iq, index_cache, wl.block_tables, wl.cu_seqlens_q, wl.context_lens, *self.select_args)
        mb = self.select_args[0]
        if wl.phase == "decode":
            o = call("block_sparse_decode", q, k_cache, v_cache, wl.block_tables, wl.context_lens, blocks, mb, self.scale)
        else:
            o = call("block_sparse_prefill", q, k_cache, v_cache, wl.block_tables, wl.cu_seqlens_q, wl.context_lens,
                     blocks, mb, self.scale)
        return call("linear", o.reshape(t, hq * dh), self.o_w, None)
