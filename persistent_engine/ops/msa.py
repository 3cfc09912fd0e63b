"""MiniMax-M3's ops: block-sparse attention (its "MSA") and the swigluoai activation.

Sources: the MiniMax-M3 config fields (``sparse_attention_config``) and the vLLM-family serving code for
``minimax_m3`` (baidu/vLLM-Kunlun ``vllm/model_executor/models/minimax_m3.py``: the fused
``[q | k | v | index_q | index_k]`` projection, per-head norms and the shared index key head; and the
semantics its authors pin against vLLM: one index head per KV head, block score = max over the block of
``index_q . index_k``, causal, no scale; the newest ``local_blocks`` (and first ``init_blocks``) blocks
always selected). swigluoai is vLLM's ``SwigluOAIAndMul`` (gpt-oss), on tkcc's gate | up halves layout.

For query t at position p (sequence s) and KV head g, with index blocks of MB tokens:
  score[b]   = max_{j in block b, j <= p} q_i[t, g] . k_i[j]          (blocks past p's: none)
  forced     = blocks b < init_blocks, and p // MB - local_blocks < b <= p // MB   (score +inf)
  sel[t, g]  = the topk_blocks best blocks (ties: the earlier block), -1 where fewer are visible
  o[t, h]    = softmax over j <= p with j // MB in sel[t, g(h)] of (q[t, h] . k[j, g]) * scale, of v[j, g]
  swigluoai(x) = (clamp(up, -limit, limit) + 1) * g * sigmoid(alpha * g),  g = clamp(gate, max=limit)
Ops: ``swigluoai_and_mul``, ``moe_experts_oai`` (moe_experts with swigluoai), ``block_topk``,
``block_sparse_decode``, ``block_sparse_prefill``. Per decode token the attention reads
topk_blocks * MB tokens of K/V per KV head (2048 for M3) instead of the whole context, and the index
reads Di elements per cached token.
"""

from __future__ import annotations

import torch

from persistent_engine.ops.basic import _acc
from persistent_engine.ops.dsa import GATHER_BUDGET, _chunk_out, _chunk_scores, _layout, key_dots, token_seq_pos
from persistent_engine.ops.moe import _experts_inputs, _experts_shapes, experts_forward
from persistent_engine.io_struct import WorkloadPoint
from persistent_engine.ops.opdef import (DEFAULT_BLOCK_SIZE, MATMUL_TOLERANCES, OpDef, generator,
                                         paged_shape, randn, tokens)


# ----------------------------------------------------------------------------- swigluoai
def swigluoai_and_mul(x: torch.Tensor, alpha: float, limit: float) -> torch.Tensor:
    xf = _acc(x)
    i = x.shape[-1] // 2
    gate, up = xf[..., :i].clamp(max=limit), xf[..., i:].clamp(-limit, limit)
    return ((up + 1) * gate * torch.sigmoid(gate * alpha)).to(x.dtype)


def moe_experts_oai(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                    topk_ids: torch.Tensor, alpha: float, limit: float) -> torch.Tensor:
    return experts_forward(x, w13, w2, topk_weights, topk_ids, lambda h: swigluoai_and_mul(h, alpha, limit))


def _oai_inputs(shape, dtype, device, seed):
    g = generator(device, seed)
    return randn(g, shape["x"], dtype, device, 4.0), float(shape.get("alpha", 1.702)), float(shape.get("limit", 7.0))


def _oai_shapes(spec, point) -> list[dict]:
    if spec.mlp_act != "swigluoai":
        return []
    t, a = tokens(point), {"alpha": spec.swiglu_alpha, "limit": spec.swiglu_limit}
    out = [{"x": [t, 2 * spec.intermediate_size], **a}]
    if spec.num_shared_experts:
        out.append({"x": [t, 2 * spec.shared_intermediate_size * spec.num_shared_experts], **a})
    return out


def _oai_experts_inputs(shape, dtype, device, seed):
    return (*_experts_inputs(shape, dtype, device, seed), float(shape.get("alpha", 1.702)),
            float(shape.get("limit", 7.0)))


def _oai_experts_shapes(spec, point) -> list[dict]:
    if spec.mlp_act != "swigluoai" or spec.moe_bias:        # gpt-oss's biased experts: moe_experts_bias
        return []
    return [{**s, "alpha": spec.swiglu_alpha, "limit": spec.swiglu_limit} for s in _experts_shapes(spec, point)]


# ----------------------------------------------------------------------------- block_topk
def _block_scored(q, k_cache, block_tables, cu_seqlens_q, context_lens, block_size: int, init_blocks: int,
                  local_blocks: int):
    """(c0, c1, score [C, Hk, nblk]) chunk by chunk: each KV head's max over a block's visible positions of
    q . k, +inf for the forced (init and local) blocks, -inf for blocks past the query's."""
    t = q.shape[0]
    length = block_tables.shape[1] * k_cache.shape[1]
    nblk = -(-length // block_size)
    _, pos = token_seq_pos(cu_seqlens_q, context_lens, t)
    blk = torch.arange(nblk, device=q.device)
    for c0, c1, s, visible in key_dots(q, k_cache, block_tables, cu_seqlens_q, context_lens):   # [C, Hk, L]
        s = s.masked_fill(~visible[:, None, :], float("-inf"))
        s = torch.nn.functional.pad(s, (0, nblk * block_size - length), value=float("-inf"))
        score = s.view(c1 - c0, s.shape[1], nblk, block_size).amax(-1)                         # [C, Hk, nblk]
        own = (pos[c0:c1] // block_size)[:, None]
        forced = (blk[None, :] <= own) & ((blk[None, :] < init_blocks) | (blk[None, :] > own - local_blocks))
        yield c0, c1, score.masked_fill(forced[:, None, :], float("inf"))


def block_scores(q: torch.Tensor, k_cache: torch.Tensor, block_tables: torch.Tensor, cu_seqlens_q: torch.Tensor,
                 context_lens: torch.Tensor, block_size: int, init_blocks: int, local_blocks: int) -> torch.Tensor:
    """[T, Hk, nblk] (fp32 for bf16 inputs): the block scores ``block_topk`` picks by (+inf forced, -inf past
    the query's block). Cost: T x L x Hk x Di multiply-adds."""
    nblk = -(-block_tables.shape[1] * k_cache.shape[1] // block_size)
    parts = [s for _, _, s in _block_scored(q, k_cache, block_tables, cu_seqlens_q, context_lens, block_size,
                                            init_blocks, local_blocks)]
    return torch.cat(parts) if parts else torch.empty(0, q.shape[1], nblk, dtype=_acc(q).dtype, device=q.device)


def block_topk(q: torch.Tensor, k_cache: torch.Tensor, block_tables: torch.Tensor, cu_seqlens_q: torch.Tensor,
               context_lens: torch.Tensor, block_size: int, topk_blocks: int, init_blocks: int,
               local_blocks: int) -> torch.Tensor:
    t, hk = q.shape[:2]
    k = min(int(topk_blocks), -(-block_tables.shape[1] * k_cache.shape[1] // block_size))
    out = torch.full((t, hk, int(topk_blocks)), -1, dtype=torch.int32, device=q.device)
    for c0, c1, score in _block_scored(q, k_cache, block_tables, cu_seqlens_q, context_lens, block_size,
                                       init_blocks, local_blocks):
        values, order = torch.sort(score, dim=-1, descending=True, stable=True)                  # earlier wins ties
        picked = torch.where(values[..., :k] > float("-inf"), order[..., :k], torch.full_like(order[..., :k], -1))
        out[c0:c1, :, :k] = picked.to(torch.int32)
    return out


def _blocks_canonical(outs: tuple) -> tuple:
    return (outs[0].sort(dim=-1).values,)


# ----------------------------------------------------------------------------- block-sparse attention
def _block_sparse(q, k_cache, v_cache, block_tables, seq, pos, blocks, block_size, scale) -> torch.Tensor:
    t, hq, dh = q.shape
    hk = k_cache.shape[2]
    length = block_tables.shape[1] * k_cache.shape[1]
    out = torch.empty(t, hq, v_cache.shape[-1], dtype=q.dtype, device=q.device)
    key_pos = torch.arange(length, device=q.device)
    chunk = max(1, min(t, GATHER_BUDGET // max(1, length * hk * max(dh, blocks.shape[-1]))))
    for c0 in range(0, t, chunk):
        c1 = min(t, c0 + chunk)
        s, vv = _chunk_scores(q, k_cache, v_cache, block_tables, seq, c0, c1, key_pos, scale)   # [C, Hk, G, L]
        chosen = (blocks[c0:c1, :, :, None].long() == (key_pos // block_size)[None, None, None, :]).any(2)  # [C, Hk, L]
        keep = chosen & (key_pos[None, None, :] <= pos[c0:c1, None, None])                # [C, Hk, L]
        p = torch.softmax(s.masked_fill(~keep[:, :, None, :], float("-inf")), dim=-1)
        out[c0:c1] = _chunk_out(p, vv, q.dtype)
    return out


def block_sparse_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                        context_lens: torch.Tensor, blocks: torch.Tensor, block_size: int, scale: float) -> torch.Tensor:
    b = q.shape[0]
    seq = torch.arange(b, device=q.device)
    return _block_sparse(q, k_cache, v_cache, block_tables, seq, context_lens.long() - 1, blocks, block_size, scale)


def block_sparse_prefill(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                         cu_seqlens_q: torch.Tensor, context_lens: torch.Tensor, blocks: torch.Tensor, block_size: int,
                         scale: float) -> torch.Tensor:
    seq, pos = token_seq_pos(cu_seqlens_q, context_lens, q.shape[0])
    return _block_sparse(q, k_cache, v_cache, block_tables, seq, pos, blocks, block_size, scale)


# ----------------------------------------------------------------------------- inputs and shapes
def draw_blocks(g, lens: list[int], chunk: int, hk: int, block_size: int, topk: int, device) -> torch.Tensor:
    """A valid block selection [T, Hk, topk]: the query's own block and distinct earlier ones, -1 padded."""
    rows = []
    for n in lens:
        for i in range(chunk):
            own = (n - chunk + i) // block_size
            heads = []
            for h in range(hk):
                perm = torch.randperm(own, generator=torch.Generator().manual_seed(int(g.initial_seed()) + 31 * own + h))
                pick = torch.cat([torch.tensor([own]), perm[: max(0, min(topk, own + 1) - 1)]])
                heads.append(torch.cat([pick, torch.full((topk - pick.numel(),), -1)]))
            rows.append(torch.stack(heads))
    return torch.stack(rows).to(torch.int32).to(device)


def _topk_inputs(shape, dtype, device, seed):
    g = generator(device, seed)
    lens, bt, cl, nb, cu, chunk = _layout(g, shape, device)
    t = shape["B"] * chunk
    k_cache = randn(g, [nb, shape.get("BS", DEFAULT_BLOCK_SIZE), shape["Di"]], dtype, device)
    q = randn(g, [t, shape["Hk"], shape["Di"]], dtype, device)
    return (q, k_cache, bt, cu, cl, int(shape["MB"]), int(shape["topk"]), int(shape.get("init", 0)),
            int(shape.get("local", 1)))


def _attn_inputs(phase: str):
    def make(shape, dtype, device, seed):
        g = generator(device, seed)
        lens, bt, cl, nb, cu, chunk = _layout(g, shape, device)
        bs, hk, dh = shape.get("BS", DEFAULT_BLOCK_SIZE), shape["Hk"], shape["Dh"]
        kc, vc = randn(g, [nb, bs, hk, dh], dtype, device), randn(g, [nb, bs, hk, dh], dtype, device)
        q = randn(g, [shape["B"] * chunk, shape["Hq"], dh], dtype, device)
        sel = draw_blocks(g, lens, chunk, hk, int(shape["MB"]), int(shape["topk"]), device)
        if phase == "decode":
            return q, kc, vc, bt, cl, sel, int(shape["MB"]), dh ** -0.5
        return q, kc, vc, bt, cu, cl, sel, int(shape["MB"]), dh ** -0.5
    return make


def _shape(spec, point: WorkloadPoint) -> dict:
    return {**paged_shape(point), "Hk": spec.num_kv_heads, "MB": spec.msa_block_size, "topk": spec.msa_topk_blocks}


def _topk_shapes(spec, point) -> list[dict]:
    if not spec.msa_block_size:
        return []
    return [{**_shape(spec, point), "Di": spec.msa_index_dim, "init": spec.msa_init_blocks,
             "local": spec.msa_local_blocks}]


def _attn_shapes(phase: str):
    def shapes(spec, point) -> list[dict]:
        if not spec.msa_block_size or point.phase != phase:
            return []
        return [{**_shape(spec, point), "Hq": spec.num_heads, "Dh": spec.head_dim}]
    return shapes


_KV = ("k_cache[NB, BS, Hk, Dh], v_cache[NB, BS, Hk, Dh], block_tables[B, MB] int32")
OPS = [
    OpDef("swigluoai_and_mul", swigluoai_and_mul,
          "swigluoai_and_mul(x[..., 2I], alpha, limit) -> [..., I] = (clamp(up, -limit, limit) + 1) * g * "
          "sigmoid(alpha * g), g = clamp(gate, max=limit); gate = x[..., :I], up = x[..., I:], in fp32. "
          "shape dict: {'x', 'alpha', 'limit'}",
          _oai_inputs, _oai_shapes, ({"x": [5, 64]}, {"x": [3, 2 * 37], "alpha": 1.0, "limit": 3.0})),
    OpDef("moe_experts_oai", moe_experts_oai,
          "moe_experts_oai(x[T, H], w13[E, 2I, H], w2[E, H, I], topk_weights[T, k] fp32, topk_ids[T, k] int64, alpha, "
          "limit) -> [T, H]: moe_experts with swigluoai_and_mul for silu_and_mul. shape dict: {'T', 'E', 'k', 'H', "
          "'I', 'alpha', 'limit'}",
          _oai_experts_inputs, _oai_experts_shapes,
          ({"T": 1, "E": 16, "k": 2, "H": 32, "I": 24}, {"T": 6, "E": 8, "k": 2, "H": 48, "I": 16}),
          tolerances=dict(MATMUL_TOLERANCES)),
    OpDef("block_topk", block_topk,
          "block_topk(q[T, Hk, Di] (normed, rotated index queries), k_cache[NB, BS, Di] (index keys), block_tables"
          "[B, MB] int32, cu_seqlens_q[B+1] int32, context_lens[B] int32, block_size, topk_blocks, init_blocks, "
          "local_blocks) -> [T, Hk, topk_blocks] int32 block numbers (positions // block_size): per KV head the "
          "blocks with the highest max_j q . k[j] over visible positions, the init and local blocks forced, ties "
          "to the earlier block, -1 padded. Order free. shape dict: {'B', 'chunk', 'Hk', 'Di', 'ctx', 'BS', 'MB', "
          "'topk', 'init', 'local'}",
          _topk_inputs, _topk_shapes,
          ({"B": 3, "Hk": 2, "Di": 16, "ctx": 37, "BS": 16, "MB": 4, "topk": 3},
           {"B": 2, "chunk": 5, "Hk": 2, "Di": 8, "ctx": 23, "BS": 8, "MB": 4, "topk": 2, "init": 1},
           {"B": 1, "Hk": 1, "Di": 16, "ctx": 5, "BS": 4, "MB": 8, "topk": 4}),
          canonicalize=_blocks_canonical),
    OpDef("block_sparse_decode", block_sparse_decode,
          "block_sparse_decode(q[B, Hq, Dh], " + _KV + ", context_lens[B] int32, blocks[B, Hk, K] int32, block_size, "
          "scale) -> [B, Hq, Dh]: attention_decode restricted to each KV head's selected blocks (q head h reads kv "
          "head h // (Hq / Hk)). shape dict: {'B', 'Hq', 'Hk', 'Dh', 'ctx', 'BS', 'MB', 'topk'}",
          _attn_inputs("decode"), _attn_shapes("decode"),
          ({"B": 3, "Hq": 4, "Hk": 2, "Dh": 16, "ctx": 37, "BS": 16, "MB": 4, "topk": 3},
           {"B": 1, "Hq": 2, "Hk": 1, "Dh": 32, "ctx": 5, "BS": 4, "MB": 8, "topk": 2}),
          tolerances=dict(MATMUL_TOLERANCES)),
    OpDef("block_sparse_prefill", block_sparse_prefill,
          "block_sparse_prefill(q[T, Hq, Dh], " + _KV + ", cu_seqlens_q[B+1] int32, context_lens[B] int32, blocks[T, "
          "Hk, K] int32, block_size, scale) -> [T, Hq, Dh]: causal (as attention_prefill) within the selected blocks. "
          "shape dict: {'B', 'chunk', 'Hq', 'Hk', 'Dh', 'ctx', 'BS', 'MB', 'topk'}",
          _attn_inputs("prefill"), _attn_shapes("prefill"),
          ({"B": 2, "chunk": 5, "Hq": 4, "Hk": 2, "Dh": 16, "ctx": 21, "BS": 8, "MB": 4, "topk": 2},),
          tolerances=dict(MATMUL_TOLERANCES)),
]
