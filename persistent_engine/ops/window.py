"""Sliding-window attention and attention sinks over the paged KV cache (Qwen3's ``use_sliding_window``
layers, gpt-oss-style alternating windows and per-head sinks).

A layer with window W: the query at position p attends the cached keys j with p - W < j <= p (HF's
``sliding_window`` masks, ``kv_idx > q_idx - sliding_window``): W keys including its own. Sinks (gpt-oss,
``sinks[Hq]`` fp32): one learned logit per head that joins each softmax's denominator and carries no
value: softmax([s_0 .. s_n, sink])[:n+1]. ``window`` 0 is full attention; ``sinks`` None is none.

The cache keeps every token (the paged layout is shared with full layers, and block tables stay one per
sequence); the windowed ops read only the last W keys of each sequence, so a decode step reads
min(W, context) tokens of K/V per layer. Ops: ``attention_decode_window``, ``attention_prefill_window``.
"""

from __future__ import annotations

from typing import Callable

import torch

from persistent_engine.ops.attention import _decode_inputs, _prefill_inputs, gather_pages
from persistent_engine.ops.basic import _acc
from persistent_engine.ops.dsa import GATHER_BUDGET, _chunk_out, _chunk_scores, token_seq_pos
from persistent_engine.ops.opdef import MATMUL_TOLERANCES, OpDef, generator, paged_shape, randn


def _softmax_with_sinks(s: torch.Tensor, sinks: torch.Tensor | None) -> torch.Tensor:
    """softmax over the last dim of s[X, Hk, G, N] with head (Hk, G)'s sink logit in the denominator."""
    if sinks is None:
        return torch.softmax(s, dim=-1)
    sink = _acc(sinks).to(s.dtype).view(1, s.shape[1], s.shape[2], 1).expand(*s.shape[:-1], 1)
    return torch.softmax(torch.cat([s, sink], dim=-1), dim=-1)[..., :-1]


def _hidden(key: torch.Tensor, pos: torch.Tensor, window: int) -> torch.Tensor:
    """[X, L]: keys a query at pos[X] may not see (after it, or window or more positions before it)."""
    lo = pos - window if window > 0 else torch.full_like(pos, -1)
    return (key[None, :] > pos[:, None]) | (key[None, :] <= lo[:, None])


def masked_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                  context_lens: torch.Tensor, scale: float, hidden: Callable, sinks: torch.Tensor | None = None,
                  cap: float = 0.0) -> torch.Tensor:
    """Decode attention of q[B, Hq, Dh] over the cached keys of its sequence but those ``hidden(key[L],
    pos[B]) -> [B, L]`` masks (pos: the query's position); scores soft-capped (tanh(s / cap) * cap, Gemma-2) when
    ``cap``; sinks as ``_softmax_with_sinks``. The reference of the window, soft-capped and chunked ops."""
    b, hq, dh = q.shape
    hk = k_cache.shape[2]
    k = gather_pages(k_cache, block_tables)                                    # [B, L, Hk, Dh]
    v = gather_pages(v_cache, block_tables)
    s = _acc(torch.einsum("bhgd,blhd->bhgl", q.view(b, hk, hq // hk, dh), k)) * scale     # [B, Hk, G, L]
    if cap:
        s = torch.tanh(s / cap) * cap
    masked = hidden(torch.arange(k.shape[1], device=q.device), context_lens.long() - 1)  # [B, L]
    p = _softmax_with_sinks(s.masked_fill(masked[:, None, None, :], float("-inf")), sinks)
    return torch.einsum("bhgl,blhd->bhgd", p.to(v.dtype), v).reshape(b, hq, v.shape[-1]).to(q.dtype)


def masked_prefill(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                   cu_seqlens_q: torch.Tensor, context_lens: torch.Tensor, scale: float, hidden: Callable,
                   sinks: torch.Tensor | None = None, cap: float = 0.0) -> torch.Tensor:
    """``masked_decode`` for the prompt tokens q[T, Hq, Dh] (their keys already in the cache), C query rows at
    a time (C x L gathered rows bounded by GATHER_BUDGET)."""
    t, hq, dh = q.shape
    hk = k_cache.shape[2]
    length = block_tables.shape[1] * k_cache.shape[1]
    out = torch.empty(t, hq, v_cache.shape[-1], dtype=q.dtype, device=q.device)
    if t == 0:
        return out
    seq, pos = token_seq_pos(cu_seqlens_q, context_lens, t)
    key = torch.arange(length, device=q.device)
    chunk = max(1, min(t, GATHER_BUDGET // max(1, length * hk * dh)))
    for c0 in range(0, t, chunk):
        c1 = min(t, c0 + chunk)
        s, vv = _chunk_scores(q, k_cache, v_cache, block_tables, seq, c0, c1, key, scale)       # [C, Hk, G, L]
        if cap:
            s = torch.tanh(s / cap) * cap
        masked = hidden(key, pos[c0:c1])                                                        # [C, L]
        p = _softmax_with_sinks(s.masked_fill(masked[:, None, None, :], float("-inf")), sinks)
        out[c0:c1] = _chunk_out(p, vv, q.dtype)
    return out


def attention_decode_window(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                            context_lens: torch.Tensor, scale: float, window: int,
                            sinks: torch.Tensor | None) -> torch.Tensor:
    return masked_decode(q, k_cache, v_cache, block_tables, context_lens, scale,
                         lambda key, pos: _hidden(key, pos, window), sinks)


def attention_prefill_window(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                             cu_seqlens_q: torch.Tensor, context_lens: torch.Tensor, scale: float, window: int,
                             sinks: torch.Tensor | None) -> torch.Tensor:
    return masked_prefill(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale,
                          lambda key, pos: _hidden(key, pos, window), sinks)


def _with_window(make):
    def inputs(shape, dtype, device, seed):
        args = make(shape, dtype, device, seed)
        sinks = randn(generator(device, seed + 1), [shape["Hq"]], torch.float32, device) if shape.get("sinks") else None
        return (*args, int(shape.get("window", 0)), sinks)
    return inputs


def _shapes(phase: str):
    def shapes(spec, point) -> list[dict]:
        if spec.attention != "gqa" or point.phase != phase:
            return []
        base = {**paged_shape(point), "Hq": spec.num_heads, "Dh": spec.head_dim, "Dv": spec.gqa_v_head_dim}
        return [{**base, "Hk": hk, "window": w, "sinks": sinks} for hk, w, sinks in spec.attention_kinds()
                if w or sinks]
    return shapes


OPS = [
    OpDef("attention_decode_window", attention_decode_window,
          "attention_decode_window(q[B, Hq, Dh], k_cache[NB, BS, Hk, Dh], v_cache[NB, BS, Hk, Dv], block_tables[B, MB] "
          "int32, context_lens[B] int32, scale, window: int, sinks[Hq] fp32 | None) -> [B, Hq, Dv]: attention_decode "
          "over the last `window` keys (0: all), each head's sink logit in the softmax denominator. shape dict: "
          "{'B', 'Hq', 'Hk', 'Dh', 'Dv', 'ctx', 'BS', 'window', 'sinks': bool}",
          _with_window(_decode_inputs), _shapes("decode"),
          ({"B": 3, "Hq": 4, "Hk": 2, "Dh": 16, "Dv": 16, "ctx": 37, "BS": 16, "window": 8},
           {"B": 2, "Hq": 4, "Hk": 1, "Dh": 16, "Dv": 16, "ctx": 21, "BS": 4, "window": 5, "sinks": True},
           {"B": 1, "Hq": 2, "Hk": 2, "Dh": 8, "Dv": 8, "ctx": 3, "BS": 4, "window": 0, "sinks": True}),
          tolerances=dict(MATMUL_TOLERANCES)),
    OpDef("attention_prefill_window", attention_prefill_window,
          "attention_prefill_window(q[T, Hq, Dh], k_cache, v_cache, block_tables, cu_seqlens_q[B+1] int32, context_lens"
          "[B] int32, scale, window, sinks[Hq] fp32 | None) -> [T, Hq, Dv]: attention_prefill (causal) within the "
          "window, with sinks. shape dict: {'B', 'chunk', 'Hq', 'Hk', 'Dh', 'Dv', 'ctx', 'BS', 'window', 'sinks'}",
          _with_window(_prefill_inputs), _shapes("prefill"),
          ({"B": 2, "chunk": 5, "Hq": 4, "Hk": 2, "Dh": 16, "Dv": 16, "ctx": 21, "BS": 8, "window": 6, "sinks": True},),
          tolerances=dict(MATMUL_TOLERANCES)),
]
