"""DeepSeek-V4's attention core: shared-KV MQA over the sliding window plus compressed entries, with sinks.

Source: Hugging Face transformers ``models/deepseek_v4/modeling_deepseek_v4.py`` (Apache-2.0):
``DeepseekV4Attention.forward`` (K = V: one normed, rotated kv head read as both), ``eager_attention_forward``
(a per-head sink logit in the softmax denominator), the compressors' causal ``block_bias`` and
``DeepseekV4Indexer`` (CSA's top-k, -1 for picks past the causal threshold). A query at position p attends

    window keys   j with p - W < j <= p (the paged kv cache; W = ``sliding_window``)
    entries       w < (p + 1) // r of its sequence's compressed entries (``kv_compress``, already normed
                  and rotated): all of them on HCA layers (``entry_ids`` None), on CSA layers only those the
                  indexer picked (``entry_ids[T, k]``, -1 = none); r = 0: a window-only layer

    o = softmax([q.k_j * scale .., q.e_w * scale .., sink]) [:-1] @ [k_j .. e_w ..]     (fp32 softmax)

Ops: ``compressed_attention``, ``csa_indexer`` (the lightning indexer over compressed keys:
sum_h w[t, h] * relu(q[t, h] . k_w) * Di^-0.5, future entries masked, top-k; ties to the earlier entry).
"""

from __future__ import annotations

import torch

from persistent_engine.ops.dsa import GATHER_BUDGET, _rows, token_seq_pos
from persistent_engine.ops.opdef import MATMUL_TOLERANCES, OpDef, generator, paged_layout, paged_shape, randn


def _entry_mask(pos: torch.Tensor, seq: torch.Tensor, n_entries: torch.Tensor, ne: int, ratio: int,
                entry_ids: torch.Tensor | None) -> torch.Tensor:
    """[T, NE] bool: the compressed entries each query attends."""
    w = torch.arange(ne, device=pos.device)
    if not ratio:
        return torch.zeros(pos.shape[0], ne, dtype=torch.bool, device=pos.device)
    ok = (w[None, :] < ((pos + 1) // ratio)[:, None]) & (w[None, :] < n_entries[seq][:, None])
    if entry_ids is not None:
        picked = torch.zeros(pos.shape[0], ne + 1, dtype=torch.bool, device=pos.device)
        ids = torch.where(entry_ids >= 0, entry_ids.long(), torch.full_like(entry_ids.long(), ne))
        picked.scatter_(1, ids, True)
        ok &= picked[:, :ne]
    return ok


def compressed_attention(q: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor,
                         cu_seqlens_q: torch.Tensor, context_lens: torch.Tensor, entries: torch.Tensor,
                         n_entries: torch.Tensor, entry_ids: torch.Tensor | None, ratio: int, window: int,
                         sinks: torch.Tensor, scale: float) -> torch.Tensor:
    t, hq, d = q.shape
    ne = entries.shape[1]
    out = torch.empty_like(q)
    seq, pos = token_seq_pos(cu_seqlens_q, context_lens, t)
    offs = torch.arange(window, device=q.device)
    # queries in chunks of [C, W + NE, D] gathered keys within GATHER_BUDGET (one chunk at decode: no host sync)
    step = max(1, min(t, GATHER_BUDGET // max(1, (window + ne) * d)))
    for c0 in range(0, t, step):
        c1 = min(t, c0 + step)
        sq, pq = seq[c0:c1], pos[c0:c1]
        key_pos = pq[:, None] - window + 1 + offs[None, :]                      # [C, W] the window's positions
        keys = _rows(kv_cache, block_tables, sq, key_pos).float()               # [C, W, D]
        allk = torch.cat([keys, entries.float()[sq]], dim=1)                    # [C, W + NE, D]
        ids = None if entry_ids is None else entry_ids[c0:c1]
        visible = torch.cat([key_pos >= 0, _entry_mask(pq, sq, n_entries, ne, ratio, ids)], dim=1)
        s = torch.einsum("thd,tkd->thk", q[c0:c1].float(), allk) * scale
        s = s.masked_fill(~visible[:, None, :], float("-inf"))
        sink = sinks.float().view(1, hq, 1).expand(c1 - c0, hq, 1)
        p = torch.softmax(torch.cat([s, sink], dim=-1), dim=-1)[..., :-1]
        out[c0:c1] = torch.einsum("thk,tkd->thd", p, allk).to(q.dtype)
    return out


def indexer_scores(q: torch.Tensor, weights: torch.Tensor, keys: torch.Tensor, n_entries: torch.Tensor,
                   cu_seqlens_q: torch.Tensor, context_lens: torch.Tensor, ratio: int) -> torch.Tensor:
    """[T, NE] fp32: each query's indexer score of every compressed entry of its sequence, -inf where the
    entry is not visible (future or past n_entries). Cost: T x NE x Hi x Di multiply-adds, chunked."""
    t, hi, di = q.shape
    ne = keys.shape[1]
    seq, pos = token_seq_pos(cu_seqlens_q, context_lens, t)
    score = torch.empty(t, ne, dtype=torch.float32, device=q.device)
    step = max(1, min(t, GATHER_BUDGET // max(1, ne * max(di, hi))))          # [C, NE, Di] / [C, Hi, NE] bounded
    for c0 in range(0, t, step):
        c1 = min(t, c0 + step)
        k = keys.float()[seq[c0:c1]]                                              # [C, NE, Di]
        dots = torch.relu(torch.einsum("thd,ted->the", q[c0:c1].float(), k))
        score[c0:c1] = (dots * di ** -0.5 * weights[c0:c1].float()[..., None]).sum(1)
    w = torch.arange(ne, device=q.device)
    ok = (w[None, :] < ((pos + 1) // ratio)[:, None]) & (w[None, :] < n_entries[seq][:, None])
    return score.masked_fill(~ok, float("-inf"))


def csa_indexer(q: torch.Tensor, weights: torch.Tensor, keys: torch.Tensor, n_entries: torch.Tensor,
                cu_seqlens_q: torch.Tensor, context_lens: torch.Tensor, ratio: int, topk: int) -> torch.Tensor:
    score = indexer_scores(q, weights, keys, n_entries, cu_seqlens_q, context_lens, ratio)
    # a stable sort, not topk: tied scores (relu makes exact zeros common) go to the earlier entry, so the picks
    # are a function of the visible entries only (causal) and the same on every device
    values, order = score.sort(dim=-1, descending=True, stable=True)
    k = min(topk, keys.shape[1])
    return torch.where(torch.isfinite(values[:, :k]), order[:, :k], torch.full_like(order[:, :k], -1))


def _ids_canonical(outs: tuple) -> tuple:
    """The indexer's picks are a set: compare them sorted."""
    return (outs[0].sort(dim=-1).values,)


# ----------------------------------------------------------------------------- inputs and shapes
def _layout(g, shape, device):
    b, chunk, ctx, bs = shape["B"], shape.get("chunk", 1), shape["ctx"], shape["BS"]
    lens = [max(chunk, ctx - 3 * i) for i in range(b)]
    tables, cl, nb = paged_layout(g, b, lens, bs, device)
    cu = torch.arange(0, b + 1, dtype=torch.int32, device=device) * chunk
    r = shape.get("r", 0)
    n_entries = (cl.long() // r) if r else torch.zeros(b, dtype=torch.long, device=device)
    return tables, cl, nb, cu, n_entries, max(1, ctx // r) if r else 1


def _attention_inputs(shape, dtype, device, seed):
    g = generator(device, seed)
    tables, cl, nb, cu, n_entries, ne = _layout(g, shape, device)
    b, chunk, hq, d, r = shape["B"], shape.get("chunk", 1), shape["Hq"], shape["D"], shape.get("r", 0)
    q = randn(g, [b * chunk, hq, d], dtype, device)
    kv = randn(g, [nb, shape["BS"], d], dtype, device)
    entries = randn(g, [b, ne, d], dtype, device)
    ids = None
    if shape.get("topk"):
        ids = torch.randint(-1, ne, (b * chunk, shape["topk"]), generator=g, device=device, dtype=torch.int64)
    sinks = randn(g, [hq], torch.float32, device)
    return q, kv, tables, cu, cl, entries, n_entries, ids, r, int(shape["W"]), sinks, d ** -0.5


def _indexer_inputs(shape, dtype, device, seed):
    g = generator(device, seed)
    _, cl, _, cu, n_entries, ne = _layout(g, shape, device)
    t = shape["B"] * shape.get("chunk", 1)
    # q, k >= 0: every relu is live, so no two entries tie at a zero score (a tie would make the pick arbitrary)
    return (randn(g, [t, shape["Hi"], shape["Di"]], dtype, device).abs(), randn(g, [t, shape["Hi"]], torch.float32, device),
            randn(g, [shape["B"], ne, shape["Di"]], dtype, device).abs(), n_entries, cu, cl, shape["r"], shape["topk"])


def _v4_point(spec, point):
    if getattr(spec, "family", "") != "deepseek_v4":
        return None
    return paged_shape(point, chunk_always=True)


def _attention_shapes(spec, point) -> list[dict]:
    base = _v4_point(spec, point)
    if base is None:
        return []
    base.update(Hq=spec.num_heads, D=spec.head_dim, W=spec.sliding_window)
    return [{**base, "r": r, "topk": spec.index_topk if r == spec.csa_ratio else 0}
            for r in sorted(set(spec.compress_ratios))]


def _indexer_shapes(spec, point) -> list[dict]:
    base = _v4_point(spec, point)
    if base is None:
        return []
    return [{**base, "Hi": spec.index_n_heads, "Di": spec.index_head_dim, "r": spec.csa_ratio, "topk": spec.index_topk}]


OPS = [
    OpDef("compressed_attention", compressed_attention,
          "compressed_attention(q[T, Hq, D], kv_cache[NB, BS, D], block_tables[B, MB] int32, cu_seqlens_q[B+1] int32, "
          "context_lens[B] int32, entries[B, NE, D], n_entries[B] int64, entry_ids[T, k] int64 (-1: none) | None, "
          "ratio, window, sinks[Hq] fp32, scale) -> [T, Hq, D]: DeepSeek-V4 attention (K = V) over each query's last "
          "`window` cached tokens and its causal compressed entries (all, or the picked ones), sinks in the softmax. "
          "shape dict: {'B', 'chunk', 'ctx', 'BS', 'Hq', 'D', 'W', 'r', 'topk'}",
          _attention_inputs, _attention_shapes,
          ({"B": 2, "chunk": 1, "ctx": 23, "BS": 4, "Hq": 4, "D": 16, "W": 8, "r": 4, "topk": 3},
           {"B": 2, "chunk": 5, "ctx": 37, "BS": 8, "Hq": 2, "D": 16, "W": 6, "r": 8, "topk": 0},
           {"B": 1, "chunk": 3, "ctx": 5, "BS": 4, "Hq": 2, "D": 8, "W": 8, "r": 0, "topk": 0}),
          tolerances=dict(MATMUL_TOLERANCES)),
    OpDef("csa_indexer", csa_indexer,
          "csa_indexer(q[T, Hi, Di], weights[T, Hi] fp32, keys[B, NE, Di], n_entries[B] int64, cu_seqlens_q, "
          "context_lens, ratio, topk) -> [T, min(topk, NE)] int64: the top compressed entries by sum_h w * relu(q . k) "
          "* Di^-0.5 among w < (p + 1) // ratio (ties: the earlier entry), -1 where fewer exist (a set: compared sorted). shape dict: {'B', "
          "'chunk', 'ctx', 'BS', 'Hi', 'Di', 'r', 'topk'}",
          _indexer_inputs, _indexer_shapes,
          ({"B": 2, "chunk": 1, "ctx": 41, "BS": 4, "Hi": 3, "Di": 8, "r": 4, "topk": 4},
           {"B": 2, "chunk": 6, "ctx": 30, "BS": 4, "Hi": 2, "Di": 16, "r": 4, "topk": 5}),
          canonicalize=_ids_canonical),
]
