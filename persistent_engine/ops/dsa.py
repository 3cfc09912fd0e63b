"""DeepSeek sparse attention (DSA: DeepSeek-V3.2, GLM-5.x): the lightning indexer's top-k selection and
MLA attention over the selected cached tokens only.

The math (HF transformers ``models/glm_moe_dsa/modeling_glm_moe_dsa.py``: ``GlmMoeDsaIndexer`` and
``GlmMoeDsaAttention``; vLLM ``model_executor/models/deepseek_v2.py``'s V3.2 indexer; DeepSeek's
``inference/model.py`` of V3.2-Exp), for a query token t at position p_t of its sequence:
  q_i[t]     = wq_b(c_q[t])               [Hi, Di]   (c_q: q_a_layernorm(q_a_proj(h)), the MLA q latent)
  k_i[j]     = LayerNorm(wk(h[j]))        [Di]       one key head, cached per token (the indexer's cache)
  rotary (neox) on the first R dims of q_i and k_i (the same positions and frequencies as the MLA rope)
  w[t]       = weights_proj(h[t]) * Hi^-1/2 * Di^-1/2          [Hi] (fp32)
  score[t,j] = sum_h w[t,h] * relu(q_i[t,h] . k_i[j])   for j <= p_t          (fp32)
  sel[t]     = the index_topk positions j of the highest scores (all of them when p_t + 1 <= index_topk)
  o[t]       = softmax over j in sel[t] of (q_abs[t] . c[j] + q_pe[t] . k_pe[j]) * scale, times c[j]
The reference's Hadamard rotation of q_i/k_i (orthogonal: dot products unchanged) and its fp8 scoring
are precision choices of its kernels, not part of the function; HF's bf16 port drops them too.

Ops (every phase without host syncs, so a decode step can be captured in a CUDA graph):
  layer_norm(x, weight, bias, eps)                               the indexer's k_norm
  indexer_topk(q, weights, k_cache, block_tables, cu_seqlens_q, context_lens, topk) -> [T, topk] int32
  sparse_mla_decode(q_nope, q_pe, kv_cache, block_tables, topk_indices, scale)        -> [B, H, L]
  sparse_mla_prefill(q_nope, q_pe, kv_cache, block_tables, cu_seqlens_q, topk_indices, scale) -> [T, H, L]
Selected positions are token positions within the query's sequence (-1: no token, when fewer than topk
are visible). Ties are broken toward the earlier position (stable sort), so the selection is a function.
Cost per decode token: the indexer reads Di elements per cached token (128 for GLM-5: a quarter of
MLA's 576), the attention K = index_topk latent rows instead of the whole context.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from persistent_engine.ops.attention import _ragged_lens
from persistent_engine.ops.basic import _acc
from persistent_engine.io_struct import WorkloadPoint
from persistent_engine.ops.opdef import (DEFAULT_BLOCK_SIZE, MATMUL_TOLERANCES, OpDef, generator,
                                         paged_layout, paged_shape, randn, tokens)

# elements gathered at once by the references ([C, L, Di] keys or [C, K, L + R] latent rows): 2^26 fp32
# values, 256 MiB, so a 2048-token prefill over an 8k context runs in bounded memory
GATHER_BUDGET = 1 << 26


# ----------------------------------------------------------------------------- layer_norm
def layer_norm(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float) -> torch.Tensor:
    xf = _acc(x)
    return F.layer_norm(xf, (x.shape[-1],), weight.to(xf.dtype), bias.to(xf.dtype), eps).to(x.dtype)


def _layer_norm_inputs(shape, dtype, device, seed):
    g = generator(device, seed)
    d = shape["x"][-1]
    return (randn(g, shape["x"], dtype, device, 3.0) + 0.5, 1.0 + randn(g, [d], dtype, device, 0.1),
            randn(g, [d], dtype, device, 0.1), 1e-6)


def _layer_norm_shapes(spec, point) -> list[dict]:
    if not spec.sparse_attention:
        return []
    return [{"x": [tokens(point), spec.index_head_dim]}]


# ----------------------------------------------------------------------------- helpers
def token_seq_pos(cu_seqlens_q: torch.Tensor, context_lens: torch.Tensor, t: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(sequence [T], position [T]) of each query token; sequence b's queries are its last
    cu[b+1] - cu[b] positions. No host sync."""
    b = context_lens.shape[0]
    cu, lens = cu_seqlens_q.long(), context_lens.long()
    tok = torch.arange(t, device=cu.device)
    seq = (torch.searchsorted(cu, tok, right=True) - 1).clamp_(max=b - 1)     # cu[0] = 0
    return seq, lens[seq] - (cu[seq + 1] - cu[seq]) + (tok - cu[seq])


def _rows(cache: torch.Tensor, block_tables: torch.Tensor, seq: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """cache[NB, BS, D] rows of token ``pos`` ([..., K], clamped >= 0) of sequence ``seq`` ([...]): [..., K, D]."""
    bs = cache.shape[1]
    p = pos.clamp(min=0).long()
    blocks = block_tables.long()[seq[..., None], p // bs]
    return cache.reshape(-1, cache.shape[-1])[blocks * bs + p % bs]


def _chunk_scores(q, k_cache, v_cache, block_tables, seq, c0: int, c1: int, key: torch.Tensor, scale: float):
    """Query tokens c0:c1 of ``q`` [T, Hq, Dh] against every key position ``key`` [L] of their sequences ``seq``
    (GQA, the paged caches [NB, BS, Hk, D]): (scores [C, Hk, G, L] in fp32 times ``scale``, V rows [C, L, Hk, Dv]).
    Gathers C*L rows of each cache: a caller bounds C by GATHER_BUDGET."""
    hq, dh = q.shape[1:]
    hk, n = k_cache.shape[2], c1 - c0
    idx = key.expand(n, key.shape[0])
    kk = _rows(k_cache.flatten(2), block_tables, seq[c0:c1], idx).view(n, -1, hk, dh)
    vv = _rows(v_cache.flatten(2), block_tables, seq[c0:c1], idx).view(n, key.shape[0], hk, -1)
    return _acc(torch.einsum("chgd,clhd->chgl", q[c0:c1].view(n, hk, hq // hk, dh), kk)) * scale, vv


def _chunk_out(p: torch.Tensor, vv: torch.Tensor, dtype) -> torch.Tensor:
    """Attention weights p [C, Hk, G, L] times the V rows [C, L, Hk, Dv]: [C, Hk * G, Dv] in ``dtype``."""
    return torch.einsum("chgl,clhd->chgd", p.to(vv.dtype), vv).reshape(p.shape[0], -1, vv.shape[-1]).to(dtype)


# ----------------------------------------------------------------------------- indexer_topk
def key_dots(q: torch.Tensor, k_cache: torch.Tensor, block_tables: torch.Tensor, cu_seqlens_q: torch.Tensor,
             context_lens: torch.Tensor):
    """Each query's dot products with every key position of its sequence (one key head), chunk by chunk: yields
    (c0, c1, dots [C, H, L] in the accumulation dtype, visible [C, L] bool: positions j <= the query's), for q
    [T, H, Di] and k_cache [NB, BS, Di], L = MB x BS the padded positions. Gathers C x L x Di keys a chunk, C
    bounded by GATHER_BUDGET. The indexers' scores (``indexer_scores``, ``msa.block_scores``) and the tie
    check's score units (``verify.score_unit``) are read off these."""
    t, h, di = q.shape
    length = block_tables.shape[1] * k_cache.shape[1]
    seq, pos = token_seq_pos(cu_seqlens_q, context_lens, t)
    key_pos = torch.arange(length, device=q.device)
    chunk = max(1, min(t, GATHER_BUDGET // max(1, length * max(di, h))))
    for c0 in range(0, t, chunk):
        c1 = min(t, c0 + chunk)
        keys = _acc(_rows(k_cache, block_tables, seq[c0:c1], key_pos.expand(c1 - c0, length)))  # [C, L, Di]
        yield c0, c1, torch.einsum("chd,cld->chl", _acc(q[c0:c1]), keys), key_pos[None, :] <= pos[c0:c1, None]


def _scored(q, weights, k_cache, block_tables, cu_seqlens_q, context_lens):
    """(c0, c1, score [C, L]) chunk by chunk: sum_h weights[t, h] relu(q[t, h] . k[j]), -inf where j > p_t."""
    for c0, c1, dots, visible in key_dots(q, k_cache, block_tables, cu_seqlens_q, context_lens):
        score = torch.einsum("chl,ch->cl", dots.relu_(), weights[c0:c1].to(dots.dtype))          # [C, L]
        yield c0, c1, score.masked_fill(~visible, float("-inf"))


def indexer_scores(q: torch.Tensor, weights: torch.Tensor, k_cache: torch.Tensor, block_tables: torch.Tensor,
                   cu_seqlens_q: torch.Tensor, context_lens: torch.Tensor) -> torch.Tensor:
    """[T, L] (fp32 for bf16 inputs): each query's indexer score of every key position of its sequence, -inf
    where not visible; ``indexer_topk`` picks by these. Cost: T x L x Hi x Di multiply-adds; holds all T x L."""
    length = block_tables.shape[1] * k_cache.shape[1]
    parts = [s for _, _, s in _scored(q, weights, k_cache, block_tables, cu_seqlens_q, context_lens)]
    return torch.cat(parts) if parts else torch.empty(0, length, dtype=_acc(q).dtype, device=q.device)


def indexer_topk(q: torch.Tensor, weights: torch.Tensor, k_cache: torch.Tensor, block_tables: torch.Tensor,
                 cu_seqlens_q: torch.Tensor, context_lens: torch.Tensor, topk: int) -> torch.Tensor:
    t = q.shape[0]
    k = min(int(topk), block_tables.shape[1] * k_cache.shape[1])
    out = torch.full((t, int(topk)), -1, dtype=torch.int32, device=q.device)
    for c0, c1, score in _scored(q, weights, k_cache, block_tables, cu_seqlens_q, context_lens):
        values, order = torch.sort(score, dim=-1, descending=True, stable=True)                   # earlier wins ties
        picked = torch.where(values[:, :k] > float("-inf"), order[:, :k], torch.full_like(order[:, :k], -1))
        out[c0:c1, :k] = picked.to(torch.int32)
    return out


def _topk_canonical(outs: tuple) -> tuple:
    """The order of the selected positions carries no meaning: compare them sorted."""
    return (outs[0].sort(dim=-1).values,)


# ----------------------------------------------------------------------------- sparse MLA
def _sparse_mla(q_nope, q_pe, kv_cache, block_tables, seq, topk_indices, scale) -> torch.Tensor:
    t, h, lat = q_nope.shape
    kk = topk_indices.shape[1]
    out = torch.empty(t, h, lat, dtype=q_nope.dtype, device=q_nope.device)
    q = torch.cat([q_nope, q_pe], dim=-1)                                    # [T, H, L + R]
    chunk = max(1, min(t, GATHER_BUDGET // max(1, kk * kv_cache.shape[-1])))
    for c0 in range(0, t, chunk):
        c1 = min(t, c0 + chunk)
        idx = topk_indices[c0:c1]
        rows = _rows(kv_cache, block_tables, seq[c0:c1], idx)                 # [C, K, L + R]
        s = _acc(torch.einsum("chd,ckd->chk", q[c0:c1], rows)) * scale
        s = s.masked_fill((idx < 0)[:, None, :], float("-inf"))
        p = torch.softmax(s, dim=-1)
        out[c0:c1] = torch.einsum("chk,ckl->chl", p.to(rows.dtype), rows[..., :lat]).to(q_nope.dtype)
    return out


def sparse_mla_decode(q_nope: torch.Tensor, q_pe: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor,
                      topk_indices: torch.Tensor, scale: float) -> torch.Tensor:
    seq = torch.arange(q_nope.shape[0], device=q_nope.device)
    return _sparse_mla(q_nope, q_pe, kv_cache, block_tables, seq, topk_indices, scale)


def sparse_mla_prefill(q_nope: torch.Tensor, q_pe: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor,
                       cu_seqlens_q: torch.Tensor, topk_indices: torch.Tensor, scale: float) -> torch.Tensor:
    t, b = q_nope.shape[0], block_tables.shape[0]
    cu = cu_seqlens_q.long()
    seq = (torch.searchsorted(cu, torch.arange(t, device=cu.device), right=True) - 1).clamp_(max=b - 1)
    return _sparse_mla(q_nope, q_pe, kv_cache, block_tables, seq, topk_indices, scale)


# ----------------------------------------------------------------------------- inputs and shapes
def _layout(g, shape, device):
    """(ragged context lens, block tables, context_lens, NB, cu_seqlens_q, chunk) of a shape dict."""
    b, chunk, bs = shape["B"], shape.get("chunk", 1), shape.get("BS", DEFAULT_BLOCK_SIZE)
    lens = _ragged_lens(g, b, shape["ctx"], chunk)
    bt, cl, nb = paged_layout(g, b, lens, bs, device)
    cu = torch.arange(0, b + 1, dtype=torch.int32, device=device) * chunk
    return lens, bt, cl, nb, cu, chunk


def draw_selection(g, lens: list[int], chunk: int, topk: int, device) -> torch.Tensor:
    """A valid selection [T, topk] int32: for each query, min(topk, p + 1) distinct visible positions
    (always including its own), the rest -1."""
    rows = []
    for n in lens:
        for i in range(chunk):
            p = n - chunk + i
            perm = torch.randperm(p, generator=torch.Generator().manual_seed(int(g.initial_seed()) + 7 * p + i))
            pick = torch.cat([torch.tensor([p]), perm[: max(0, min(topk, p + 1) - 1)]])
            rows.append(torch.cat([pick, torch.full((topk - pick.numel(),), -1)]))
    return torch.stack(rows).to(torch.int32).to(device)


def _indexer_inputs(shape, dtype, device, seed):
    g = generator(device, seed)
    lens, bt, cl, nb, cu, chunk = _layout(g, shape, device)
    t, hi, di = shape["B"] * chunk, shape["Hi"], shape["Di"]
    k_cache = randn(g, [nb, shape.get("BS", DEFAULT_BLOCK_SIZE), di], dtype, device)
    q = randn(g, [t, hi, di], dtype, device)
    # positive head weights (as trained indexers mostly are): exact-zero ties only where every head's
    # ReLU is zero, which random draws make rare
    w = torch.rand((t, hi), generator=g, device=device) + 0.1
    return q, w, k_cache, bt, cu, cl, int(shape["topk"])


def _sparse_inputs(phase: str):
    def make(shape, dtype, device, seed):
        g = generator(device, seed)
        lens, bt, cl, nb, cu, chunk = _layout(g, shape, device)
        b, h, lat, r = shape["B"], shape["H"], shape["L"], shape["R"]
        cache = randn(g, [nb, shape.get("BS", DEFAULT_BLOCK_SIZE), lat + r], dtype, device)
        t = b * chunk
        qn, qp = randn(g, [t, h, lat], dtype, device, 0.2), randn(g, [t, h, r], dtype, device)
        sel = draw_selection(g, lens, chunk, int(shape["topk"]), device)
        scale = shape.get("Dqk", lat + r) ** -0.5
        if phase == "decode":
            return qn, qp, cache, bt, sel, scale
        return qn, qp, cache, bt, cu, sel, scale
    return make


def _base_shape(spec, point: WorkloadPoint) -> dict:
    return {**paged_shape(point), "topk": spec.index_topk}


def _indexer_shapes(spec, point) -> list[dict]:
    if not spec.sparse_attention:
        return []
    return [{**_base_shape(spec, point), "Hi": spec.index_n_heads, "Di": spec.index_head_dim}]


def _sparse_shapes(phase: str):
    def shapes(spec, point) -> list[dict]:
        if not spec.sparse_attention or point.phase != phase:
            return []
        return [{**_base_shape(spec, point), "H": spec.num_heads, "L": spec.kv_lora_rank, "R": spec.qk_rope_head_dim,
                 "Dqk": spec.qk_nope_head_dim + spec.qk_rope_head_dim}]
    return shapes


_PAGED = "block_tables[B, MB] int32"
OPS = [
    OpDef("layer_norm", layer_norm,
          "layer_norm(x[..., D], weight[D], bias[D], eps) -> [..., D] (x.dtype) = (x - mean) / sqrt(var + eps) * "
          "weight + bias, in fp32 (the DSA indexer's k_norm). shape dict: {'x': [..., D]}",
          _layer_norm_inputs, _layer_norm_shapes, ({"x": [5, 16]}, {"x": [3, 128]}, {"x": [1, 37]})),
    OpDef("indexer_topk", indexer_topk,
          "indexer_topk(q[T, Hi, Di] (rotated), weights[T, Hi] fp32 (weights_proj * Hi^-1/2 * Di^-1/2), "
          "k_cache[NB, BS, Di] (the indexer's rotated keys), " + _PAGED + ", cu_seqlens_q[B+1] int32, "
          "context_lens[B] int32, topk: int) -> [T, topk] int32: for query t (position p of its sequence, as "
          "in attention_prefill) the positions j <= p of the topk highest sum_h weights[t,h] * relu(q[t,h] . "
          "k[j]) (fp32), ties to the earlier position, -1 where fewer than topk are visible. Order free "
          "(compared sorted). shape dict: {'B', 'chunk', 'Hi', 'Di', 'ctx', 'BS', 'topk'}",
          _indexer_inputs, _indexer_shapes,
          ({"B": 3, "Hi": 4, "Di": 16, "ctx": 37, "BS": 16, "topk": 8},
           {"B": 2, "chunk": 5, "Hi": 4, "Di": 24, "ctx": 21, "BS": 8, "topk": 6},
           {"B": 1, "Hi": 8, "Di": 32, "ctx": 5, "BS": 4, "topk": 16}),
          canonicalize=_topk_canonical),
    OpDef("sparse_mla_decode", sparse_mla_decode,
          "sparse_mla_decode(q_nope[B, H, L] (absorbed), q_pe[B, H, R], kv_cache[NB, BS, L + R], " + _PAGED + ", "
          "topk_indices[B, K] int32 (positions, -1 none), scale) -> [B, H, L]: mla_decode restricted to the "
          "selected positions of each sequence. shape dict: {'B', 'H', 'L', 'R', 'ctx', 'BS', 'topk', 'Dqk'}",
          _sparse_inputs("decode"), _sparse_shapes("decode"),
          ({"B": 3, "H": 4, "L": 32, "R": 8, "ctx": 37, "BS": 16, "topk": 8},
           {"B": 2, "H": 2, "L": 64, "R": 16, "ctx": 3, "BS": 4, "topk": 8}),
          tolerances=dict(MATMUL_TOLERANCES)),
    OpDef("sparse_mla_prefill", sparse_mla_prefill,
          "sparse_mla_prefill(q_nope[T, H, L] (absorbed), q_pe[T, H, R], kv_cache[NB, BS, L + R], " + _PAGED + ", "
          "cu_seqlens_q[B+1] int32, topk_indices[T, K] int32, scale) -> [T, H, L]: each query over its own "
          "selected positions (causality is in the selection). shape dict: {'B', 'chunk', 'H', 'L', 'R', 'ctx', "
          "'BS', 'topk'}",
          _sparse_inputs("prefill"), _sparse_shapes("prefill"),
          ({"B": 2, "chunk": 4, "H": 4, "L": 32, "R": 8, "ctx": 19, "BS": 8, "topk": 6},),
          tolerances=dict(MATMUL_TOLERANCES)),
]
