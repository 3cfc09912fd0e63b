"""Multi-head latent attention (DeepSeek-V3, Kimi-K2), absorbed form.

The cache holds one latent row per token: ``kv_cache[NB, BS, L + R]`` = [c_kv (kv_lora_rank L, normed) |
k_pe (R rope dims, rotated)], shared by all heads (MQA over the latent). With ``kv_b_proj`` viewed as
``[H, Dn + Dv, L]``, W_UK = ``[:, :Dn]`` and W_UV = ``[:, Dn:]``:
  q_abs  = mla_q_absorb(q_nope, W_UK)          [T, H, L]    (q_nope . W_UK: keys never decompressed)
  o_lat  = mla_decode(q_abs, q_pe, cache, ...)  [B, H, L]    softmax((q_abs c + q_pe k_pe) * scale) c
  o      = mla_v_up(o_lat, W_UV)                [T, H, Dv]
Per decode token this reads (L + R) elements per cached token instead of H * (Dn + Dv) * 2.
"""

from __future__ import annotations

import torch

from persistent_engine.ops.attention import (_ragged_lens, attention_decode, attention_prefill)
from persistent_engine.ops.basic import _acc
from persistent_engine.ops.opdef import (DEFAULT_BLOCK_SIZE, MATMUL_TOLERANCES, OpDef, generator,
                                         paged_layout, paged_shape, randn, tokens)


def mla_q_absorb(q_nope: torch.Tensor, w_uk: torch.Tensor) -> torch.Tensor:
    return torch.einsum("thd,hdl->thl", _acc(q_nope), _acc(w_uk)).to(q_nope.dtype)


def mla_v_up(o_latent: torch.Tensor, w_uv: torch.Tensor) -> torch.Tensor:
    return torch.einsum("thl,hvl->thv", _acc(o_latent), _acc(w_uv)).to(o_latent.dtype)


def _as_mqa(q_nope, q_pe, kv_cache):
    latent = q_nope.shape[-1]
    return torch.cat([q_nope, q_pe], dim=-1), kv_cache[:, :, None, :], kv_cache[:, :, None, :latent]


def mla_decode(q_nope: torch.Tensor, q_pe: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor,
               context_lens: torch.Tensor, scale: float) -> torch.Tensor:
    q, k, v = _as_mqa(q_nope, q_pe, kv_cache)
    return attention_decode(q, k, v, block_tables, context_lens, scale)


def mla_prefill(q_nope: torch.Tensor, q_pe: torch.Tensor, kv_cache: torch.Tensor, block_tables: torch.Tensor,
                cu_seqlens_q: torch.Tensor, context_lens: torch.Tensor, scale: float) -> torch.Tensor:
    q, k, v = _as_mqa(q_nope, q_pe, kv_cache)
    return attention_prefill(q, k, v, block_tables, cu_seqlens_q, context_lens, scale)


# ----------------------------------------------------------------------------- inputs and shapes
def _absorb_inputs(shape, dtype, device, seed):
    g = generator(device, seed)
    t, h, d, n = shape["T"], shape["H"], shape["K"], shape["N"]
    return randn(g, [t, h, d], dtype, device), randn(g, [h, d, n], dtype, device, d ** -0.5)


def _v_up_inputs(shape, dtype, device, seed):
    g = generator(device, seed)
    t, h, d, n = shape["T"], shape["H"], shape["K"], shape["N"]
    return randn(g, [t, h, d], dtype, device), randn(g, [h, n, d], dtype, device, d ** -0.5)


def _mla_inputs(phase: str):
    def make(shape, dtype, device, seed):
        g = generator(device, seed)
        b, h, lat, r = shape["B"], shape["H"], shape["L"], shape["R"]
        bs = shape.get("BS", DEFAULT_BLOCK_SIZE)
        chunk = shape.get("chunk", 1)
        lens = _ragged_lens(g, b, shape["ctx"], chunk)
        bt, cl, nb = paged_layout(g, b, lens, bs, device)
        cache = randn(g, [nb, bs, lat + r], dtype, device)
        t = b * chunk
        qn, qp = randn(g, [t, h, lat], dtype, device, 0.2), randn(g, [t, h, r], dtype, device)
        scale = (shape.get("Dqk", lat + r)) ** -0.5
        if phase == "decode":
            return qn, qp, cache, bt, cl, scale
        cu = torch.arange(0, b + 1, dtype=torch.int32, device=device) * chunk
        return qn, qp, cache, bt, cu, cl, scale
    return make


def _mla_shapes(phase: str):
    def shapes(spec, point) -> list[dict]:
        if spec.attention != "mla" or point.phase != phase:
            return []
        return [{**paged_shape(point), "H": spec.num_heads, "L": spec.kv_lora_rank, "R": spec.qk_rope_head_dim,
                 "Dqk": spec.qk_nope_head_dim + spec.qk_rope_head_dim}]
    return shapes


def _bmm_shapes(which: str):
    def shapes(spec, point) -> list[dict]:
        if spec.attention != "mla":
            return []
        t, h, lat = tokens(point), spec.num_heads, spec.kv_lora_rank
        if which == "absorb":
            return [{"T": t, "H": h, "K": spec.qk_nope_head_dim, "N": lat}]
        return [{"T": t, "H": h, "K": lat, "N": spec.v_head_dim}]
    return shapes


_MLA_DOC = ("kv_cache[NB, BS, L + R] (latent c | rotated k_pe), block_tables[B, MB] int32, context_lens[B] int32, "
            "scale: float (1/sqrt(Dn + R), times yarn mscale^2)")
OPS = [
    OpDef("mla_q_absorb", mla_q_absorb,
          "mla_q_absorb(q_nope[T, H, Dn], w_uk[H, Dn, L]) -> [T, H, L] = per-head q_nope @ w_uk. "
          "shape dict: {'T', 'H', 'K' (Dn), 'N' (L)}",
          _absorb_inputs, _bmm_shapes("absorb"),
          ({"T": 3, "H": 4, "K": 16, "N": 32}, {"T": 1, "H": 2, "K": 24, "N": 40}), tolerances=dict(MATMUL_TOLERANCES)),
    OpDef("mla_v_up", mla_v_up,
          "mla_v_up(o_latent[T, H, L], w_uv[H, Dv, L]) -> [T, H, Dv] = per-head o_latent @ w_uv.T. "
          "shape dict: {'T', 'H', 'K' (L), 'N' (Dv)}",
          _v_up_inputs, _bmm_shapes("v_up"),
          ({"T": 3, "H": 4, "K": 32, "N": 16}, {"T": 1, "H": 2, "K": 40, "N": 24}), tolerances=dict(MATMUL_TOLERANCES)),
    OpDef("mla_decode", mla_decode,
          "mla_decode(q_nope[B, H, L] (absorbed), q_pe[B, H, R], " + _MLA_DOC + ") -> [B, H, L]: "
          "softmax((q_nope . c + q_pe . k_pe) * scale) c over each sequence's context_lens[b] tokens. "
          "shape dict: {'B', 'H', 'L', 'R', 'ctx', 'BS', 'Dqk'}",
          _mla_inputs("decode"), _mla_shapes("decode"),
          ({"B": 3, "H": 4, "L": 32, "R": 8, "ctx": 37, "BS": 16}, {"B": 1, "H": 2, "L": 64, "R": 16, "ctx": 3, "BS": 4}),
          tolerances=dict(MATMUL_TOLERANCES)),
    OpDef("mla_prefill", mla_prefill,
          "mla_prefill(q_nope[T, H, L] (absorbed), q_pe[T, H, R], " + _MLA_DOC.replace("block_tables[B, MB] int32, ",
                                                                                       "block_tables[B, MB] int32, "
                                                                                       "cu_seqlens_q[B+1] int32, ")
          + ") -> [T, H, L]: causal, as attention_prefill. shape dict: {'B', 'chunk', 'H', 'L', 'R', 'ctx', 'BS'}",
          _mla_inputs("prefill"), _mla_shapes("prefill"),
          ({"B": 2, "chunk": 4, "H": 4, "L": 32, "R": 8, "ctx": 19, "BS": 8},), tolerances=dict(MATMUL_TOLERANCES)),
]
