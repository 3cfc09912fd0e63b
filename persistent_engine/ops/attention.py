"""Rotary embedding and attention over a paged KV cache (GQA; MLA reuses the same math).

Paged layout: a cache is ``[NB, BS, Hk, D]`` (NB blocks of BS tokens); sequence ``b`` owns the blocks
``block_tables[b, :ceil(context_lens[b] / BS)]`` in order, so its token ``j`` lives at
``cache[block_tables[b, j // BS], j % BS]``. ``context_lens[b]`` counts every cached token of the
sequence including the new ones (their K/V are written before attention runs).
"""

from __future__ import annotations

import torch

from persistent_engine.ops.basic import _acc
from persistent_engine.ops.opdef import (DEFAULT_BLOCK_SIZE, MATMUL_TOLERANCES, OpDef, generator,
                                         paged_layout, paged_shape, randint, randn, tokens)


# ----------------------------------------------------------------------------- rotary
def rotary_embedding(positions: torch.Tensor, q: torch.Tensor, k: torch.Tensor, cos_sin_cache: torch.Tensor,
                     rotary_dim: int) -> tuple[torch.Tensor, torch.Tensor]:
    cos, sin = cos_sin_cache[positions].chunk(2, dim=-1)          # [T, R/2] each

    def rope(x: torch.Tensor) -> torch.Tensor:
        xf = _acc(x)
        c, s = cos[:, None, :].to(xf.dtype), sin[:, None, :].to(xf.dtype)
        x1, x2 = xf[..., : rotary_dim // 2], xf[..., rotary_dim // 2: rotary_dim]
        return torch.cat([x1 * c - x2 * s, x2 * c + x1 * s, xf[..., rotary_dim:]], dim=-1).to(x.dtype)

    return rope(q), rope(k)


def rope_cache(max_pos: int, rotary_dim: int, theta: float = 10000.0, device="cpu") -> torch.Tensor:
    """Plain (unscaled) cos/sin cache [max_pos, rotary_dim] fp32; the model builds scaled ones."""
    inv = 1.0 / theta ** (torch.arange(0, rotary_dim, 2, dtype=torch.float64) / rotary_dim)
    ang = torch.arange(max_pos, dtype=torch.float64)[:, None] * inv[None, :]
    return torch.cat([ang.cos(), ang.sin()], dim=-1).float().to(device)


def _rotary_inputs(shape, dtype, device, seed):
    g = generator(device, seed)
    t, dh, r, mp = shape["T"], shape["Dh"], shape["R"], shape.get("max_pos", 4096)
    return (randint(g, mp, [t], device), randn(g, [t, shape["Hq"], dh], dtype, device),
            randn(g, [t, shape["Hk"], dh], dtype, device), rope_cache(mp, r, device=device), r)


def _rotary_shapes(spec, point) -> list[dict]:
    t = tokens(point)
    if spec.attention == "mla":
        return [{"T": t, "Hq": spec.num_heads, "Hk": 1, "Dh": spec.qk_rope_head_dim, "R": spec.qk_rope_head_dim}]
    return [{"T": t, "Hq": spec.num_heads, "Hk": hk, "Dh": spec.head_dim, "R": spec.rotary_dim or spec.head_dim}
            for hk in sorted({k for k, _, _ in spec.attention_kinds()})]       # MiMo-V2-Flash: two KV head counts


# ----------------------------------------------------------------------------- attention
def gather_pages(cache: torch.Tensor, block_tables: torch.Tensor) -> torch.Tensor:
    """[NB, BS, H, D] pages -> [B, MB*BS, H, D] in sequence order (positions past the context are junk)."""
    b, mb = block_tables.shape
    return cache[block_tables.long()].reshape(b, mb * cache.shape[1], *cache.shape[2:])


def attention_decode(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                     context_lens: torch.Tensor, scale: float) -> torch.Tensor:
    # GEMMs in the cache dtype (fp32 accumulation inside), softmax in fp32+: no fp32 copy of the
    # gathered cache, which at batch 64 x 1k context would dominate the step's memory traffic
    b, hq, dh = q.shape
    hk = k_cache.shape[2]
    k = gather_pages(k_cache, block_tables)                        # [B, L, Hk, Dh]
    v = gather_pages(v_cache, block_tables)                        # [B, L, Hk, Dv]
    qg = q.view(b, hk, hq // hk, dh)                               # q head h*G+g reads kv head h
    s = _acc(torch.einsum("bhgd,blhd->bhgl", qg, k)) * scale
    past = torch.arange(k.shape[1], device=q.device)[None, :] >= context_lens[:, None]   # [B, L]
    p = torch.softmax(s.masked_fill(past[:, None, None, :], float("-inf")), dim=-1)
    return torch.einsum("bhgl,blhd->bhgd", p.to(v.dtype), v).reshape(b, hq, v.shape[-1]).to(q.dtype)


# scores held at once by attention_prefill: Hq * chunk * L fp32 values (2^25: 128 MiB, plus the
# softmax and mask of the same size), so a 2048-token prefill over an 8k context stays < 1 GB
PREFILL_SCORE_BUDGET = 1 << 25


def attention_prefill(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                      cu_seqlens_q: torch.Tensor, context_lens: torch.Tensor, scale: float) -> torch.Tensor:
    # No host sync (capturable in a CUDA graph): every shape comes from tensor shapes (T, B, MB), the
    # lengths stay on the device. Query t belongs to sequence seq[t] (searchsorted on cu_seqlens) at
    # position pos[t]; each sequence's MB*BS paged keys are gathered whole and masked (keys past the
    # query's position, and queries of other sequences). Cost: B * T * MB*BS scores (B times the
    # exact work when B > 1), in query chunks of at most PREFILL_SCORE_BUDGET scores.
    t, hq, dh = q.shape
    b, mb = block_tables.shape
    hk, dv = k_cache.shape[2], v_cache.shape[-1]
    length = mb * k_cache.shape[1]                                   # L: keys per sequence (padded)
    out = torch.zeros(t, hq, dv, dtype=q.dtype, device=q.device)
    if t == 0:
        return out
    cu, lens = cu_seqlens_q.long(), context_lens.long()
    tok = torch.arange(t, device=q.device)
    seq = (torch.searchsorted(cu, tok, right=True) - 1).clamp_(max=b - 1)   # [T]; cu[0] = 0 (no slice: inductor)
    pos = lens[seq] - (cu[seq + 1] - cu[seq]) + (tok - cu[seq])                            # [T]
    key_pos = torch.arange(length, device=q.device)
    qf = _acc(q).reshape(t, hk, hq // hk, dh)                      # q head h*G+g reads kv head h
    chunk = max(1, min(t, PREFILL_SCORE_BUDGET // max(1, hq * length)))
    for s in range(b):
        k = _acc(gather_pages(k_cache, block_tables[s:s + 1])[0])  # [L, Hk, Dh]
        v = _acc(gather_pages(v_cache, block_tables[s:s + 1])[0])  # [L, Hk, Dv]
        for c0 in range(0, t, chunk):
            c1 = min(t, c0 + chunk)
            mine = seq[c0:c1] == s                                 # [C]
            allowed = (key_pos[None, :] <= pos[c0:c1, None]) & mine[:, None]                 # [C, L]
            sc = torch.einsum("nhgd,lhd->hgnl", qf[c0:c1], k) * scale
            # finite fill: a row with no allowed key (another sequence's query) stays finite
            p = torch.softmax(sc.masked_fill(~allowed, torch.finfo(sc.dtype).min), dim=-1)
            o = torch.einsum("hgnl,lhd->nhgd", p, v).reshape(c1 - c0, hq, dv).to(q.dtype)
            out[c0:c1] = torch.where(mine[:, None, None], o, out[c0:c1])
    return out


def _ragged_lens(g, batch: int, ctx: int, low: int) -> list[int]:
    """Context lengths in [low, ctx], the first exactly ctx (so the longest case is always tested)."""
    span = max(ctx - low, 0)
    extra = torch.randint(0, span + 1, (batch,), generator=torch.Generator().manual_seed(g.initial_seed())).tolist()
    return [ctx] + [ctx - e for e in extra[1:]]


def _paged_kv(g, shape, dtype, device, lens):
    bt, cl, nb = paged_layout(g, shape["B"], lens, shape.get("BS", DEFAULT_BLOCK_SIZE), device)
    bs = shape.get("BS", DEFAULT_BLOCK_SIZE)
    kc = randn(g, [nb, bs, shape["Hk"], shape["Dh"]], dtype, device)
    vc = randn(g, [nb, bs, shape["Hk"], shape.get("Dv", shape["Dh"])], dtype, device)
    return kc, vc, bt, cl


def _decode_inputs(shape, dtype, device, seed):
    g = generator(device, seed)
    lens = _ragged_lens(g, shape["B"], shape["ctx"], 1)
    kc, vc, bt, cl = _paged_kv(g, shape, dtype, device, lens)
    q = randn(g, [shape["B"], shape["Hq"], shape["Dh"]], dtype, device)
    return q, kc, vc, bt, cl, shape["Dh"] ** -0.5


def _prefill_inputs(shape, dtype, device, seed):
    g = generator(device, seed)
    chunk = shape["chunk"]
    lens = _ragged_lens(g, shape["B"], shape["ctx"], chunk)
    kc, vc, bt, cl = _paged_kv(g, shape, dtype, device, lens)
    q = randn(g, [shape["B"] * chunk, shape["Hq"], shape["Dh"]], dtype, device)
    cu = torch.arange(0, shape["B"] + 1, dtype=torch.int32, device=device) * chunk
    return q, kc, vc, bt, cu, cl, shape["Dh"] ** -0.5


def _attn_shapes(phase: str):
    def shapes(spec, point) -> list[dict]:
        if spec.attention != "gqa" or point.phase != phase:
            return []
        return [{**paged_shape(point), "Hq": spec.num_heads, "Hk": hk, "Dh": spec.head_dim, "Dv": spec.gqa_v_head_dim}
                for hk in sorted({k for k, _, _ in spec.attention_kinds()})]
    return shapes


OPS = [
    OpDef("rotary_embedding", rotary_embedding,
          "rotary_embedding(positions[T] int64, q[T, Hq, Dh], k[T, Hk, Dh], cos_sin_cache[max_pos, R] fp32, "
          "rotary_dim: int) -> (q, k) rotated: neox style (halves, not interleaved) on the first rotary_dim dims "
          "of each head, the rest passed through; cache[:, :R/2] is cos, [:, R/2:] sin. "
          "shape dict: {'T', 'Hq', 'Hk', 'Dh', 'R', 'max_pos'}",
          _rotary_inputs, _rotary_shapes,
          ({"T": 5, "Hq": 4, "Hk": 2, "Dh": 16, "R": 16}, {"T": 3, "Hq": 6, "Hk": 1, "Dh": 24, "R": 8},
           {"T": 1, "Hq": 8, "Hk": 8, "Dh": 64, "R": 32}), outputs=2),
    OpDef("attention_decode", attention_decode,
          "attention_decode(q[B, Hq, Dh], k_cache[NB, BS, Hk, Dh], v_cache[NB, BS, Hk, Dv], block_tables[B, MB] "
          "int32, context_lens[B] int32, scale: float) -> [B, Hq, Dv]: softmax(q k^T * scale) v over each "
          "sequence's first context_lens[b] cached tokens (the new token included); q head h reads kv head "
          "h // (Hq / Hk). shape dict: {'B', 'Hq', 'Hk', 'Dh', 'Dv', 'ctx' (longest), 'BS'}",
          _decode_inputs, _attn_shapes("decode"),
          ({"B": 3, "Hq": 4, "Hk": 2, "Dh": 16, "Dv": 16, "ctx": 37, "BS": 16},
           {"B": 1, "Hq": 8, "Hk": 1, "Dh": 32, "Dv": 32, "ctx": 5, "BS": 4},
           {"B": 5, "Hq": 6, "Hk": 6, "Dh": 24, "Dv": 16, "ctx": 100, "BS": 16}),
          tolerances=dict(MATMUL_TOLERANCES)),
    OpDef("attention_prefill", attention_prefill,
          "attention_prefill(q[T, Hq, Dh], k_cache[NB, BS, Hk, Dh], v_cache[NB, BS, Hk, Dv], block_tables[B, MB] "
          "int32, cu_seqlens_q[B+1] int32, context_lens[B] int32, scale) -> [T, Hq, Dv]: causal; sequence b's "
          "queries are q[cu[b]:cu[b+1]], its last n_b = cu[b+1]-cu[b] positions (their K/V already cached); "
          "query i of b sees keys 0..context_lens[b]-n_b+i. shape dict: {'B', 'chunk', 'Hq', 'Hk', 'Dh', 'Dv', "
          "'ctx', 'BS'}",
          _prefill_inputs, _attn_shapes("prefill"),
          ({"B": 2, "chunk": 5, "Hq": 4, "Hk": 2, "Dh": 16, "Dv": 16, "ctx": 21, "BS": 8},
           {"B": 1, "chunk": 7, "Hq": 2, "Hk": 1, "Dh": 32, "Dv": 32, "ctx": 7, "BS": 16}),
          tolerances=dict(MATMUL_TOLERANCES)),
]

