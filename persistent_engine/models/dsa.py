"""MLA with DeepSeek sparse attention (DSA) of one layer: DeepSeek-V3.2, GLM-5.x.

The MLA projections and cache are ``MLAAttention``'s; the attention runs over the index_topk cached
tokens the layer's lightning indexer selects (the math, with its sources, in ``ops/dsa.py``):
  c_q            = q_a_layernorm(q_a_proj(h))                    (MLA's q latent, shared with the indexer)
  q_i            = wq_b_i(c_q)  [T, Hi, Di];  k_i = layer_norm(wk_i(h)) [T, Di]; rotary on the first R dims
  indexer cache  <- k_i at the step's slots (one [NB, BS, Di] pool per full layer: ``KVCache.v[layer]``)
  w              = weights_proj(h) * Hi^-1/2 * Di^-1/2  (fp32)
  sel            = indexer_topk(q_i, w, indexer cache, ...)     [T, index_topk] positions
  o              = sparse_mla_decode / sparse_mla_prefill(q_abs, q_pe, cache, ..., sel)
A "shared" layer (GLM-5.2's ``indexer_types``, HF's ``skip_topk``) runs no indexer: it attends with the
selection of the last full layer before it, which the decoder passes through ``selections``
(layer index -> the current step's selection). Each layer's projections are its own.
"""

from __future__ import annotations

import torch

from persistent_engine.models.kv_cache import write_kv
from persistent_engine.models.mla import MLAAttention
from persistent_engine.ops.registry import call

INDEXER_NORM_EPS = 1e-6        # HF GlmMoeDsaIndexer / DeepSeek-V3.2: nn.LayerNorm(index_head_dim, eps=1e-6)


class DSAAttention(MLAAttention):
    def __init__(self, spec, params: dict[str, torch.Tensor], prefix: str, cos_sin: torch.Tensor, scale: float,
                 index: int, selections: dict[int, torch.Tensor]):
        super().__init__(spec, params, prefix, cos_sin, scale)
        self.index, self.source, self.selections = index, spec.indexer_source(index), selections
        self.full = spec.indexer_kind(index) == "full"
        self.hi, self.di, self.topk = spec.index_n_heads, spec.index_head_dim, spec.index_topk
        self.weight_scale = (self.hi * self.di) ** -0.5
        if self.full:
            self.wq_i, self.wk_i = params[prefix + "idx_wq_b"], params[prefix + "idx_wk"]
            self.k_norm_w, self.k_norm_b = params[prefix + "idx_k_norm"], params[prefix + "idx_k_norm_b"]
            self.weights_w = params[prefix + "idx_weights"]

    def __call__(self, h: torch.Tensor, wl, cache: torch.Tensor, index_cache: torch.Tensor | None = None):
        q_abs, q_pe, cq = self.project(h, wl, cache)
        if self.full:
            self.selections[self.index] = self.select(h, cq, wl, index_cache)
        sel = self.selections[self.source]                                      # [T, index_topk] int32
        if wl.phase == "decode":
            o = call("sparse_mla_decode", q_abs, q_pe, cache, wl.block_tables, sel, self.scale)
        else:
            o = call("sparse_mla_prefill", q_abs, q_pe, cache, wl.block_tables, wl.cu_seqlens_q, sel, self.scale)
        return self.output(o)

    def select(self, h: torch.Tensor, cq: torch.Tensor, wl, index_cache: torch.Tensor) -> torch.Tensor:
        """The lightning indexer: writes the step's indexer keys, returns the top-k positions [T, K]."""
        t = h.shape[0]
        q = call("linear", cq, self.wq_i, None).view(t, self.hi, self.di)
        k = call("layer_norm", call("linear", h, self.wk_i, None), self.k_norm_w, self.k_norm_b, INDEXER_NORM_EPS)
        q, k = call("rotary_embedding", wl.positions, q, k.view(t, 1, self.di), self.cos_sin, self.r)
        write_kv(index_cache, wl.slot_mapping, k.view(t, self.di))
        w = call("linear", h, self.weights_w, None).float() * self.weight_scale    # [T, Hi] fp32
        return call("indexer_topk", q, w, index_cache, wl.block_tables, wl.cu_seqlens_q, wl.context_lens, self.topk)
