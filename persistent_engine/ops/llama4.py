"""Llama-4's own ops (HF transformers ``modeling_llama4.py``, Apache-2.0):

- ``attention_decode_chunked`` / ``attention_prefill_chunked``: causal attention within fixed chunks of ``chunk``
  positions (``attention_chunk_size``, the rope layers' "chunked_attention"): the query at position p sees the
  keys j with (p // chunk) * chunk <= j <= p (HF masking_utils ``chunked_overlay``: kv_idx // chunk ==
  q_idx // chunk, and causal). A decode step reads at most ``chunk`` keys per sequence.
- ``attn_temperature(q[T, Hq, Dh], positions[T], floor_scale, attn_scale)``: the NoPE layers' query temperature,
  q * (log1p(floor((p + 1) / floor_scale)) * attn_scale + 1) in fp32, rounded to q's dtype
  (``Llama4TextAttention`` with ``attn_temperature_tuning``).
- ``moe_experts_scaled_input``: ``Llama4TextMoe``'s routed experts, which scale each token's *input* by its
  router weight: sum_j expert_{ids[t, j]}(x[t] * w[t, j]) (SwiGLU experts; unselected experts see 0 and give 0).
"""

from __future__ import annotations

import torch

from persistent_engine.ops.attention import _decode_inputs, _prefill_inputs
from persistent_engine.ops.basic import _acc
from persistent_engine.ops.moe import _experts_fit, _experts_inputs, _experts_shapes, experts_check_bytes, moe_experts
from persistent_engine.ops.opdef import MATMUL_TOLERANCES, OpDef, generator, paged_shape, randn, tokens
from persistent_engine.ops.window import masked_decode, masked_prefill


def _outside_chunk(key: torch.Tensor, pos: torch.Tensor, chunk: int) -> torch.Tensor:
    """[X, L]: keys a query at pos[X] may not see (after it, or before its chunk's first position)."""
    start = torch.div(pos, chunk, rounding_mode="floor") * chunk
    return (key[None, :] > pos[:, None]) | (key[None, :] < start[:, None])


def attention_decode_chunked(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                             context_lens: torch.Tensor, scale: float, chunk: int) -> torch.Tensor:
    return masked_decode(q, k_cache, v_cache, block_tables, context_lens, scale,
                         lambda key, pos: _outside_chunk(key, pos, chunk))


def attention_prefill_chunked(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                              cu_seqlens_q: torch.Tensor, context_lens: torch.Tensor, scale: float,
                              chunk: int) -> torch.Tensor:
    return masked_prefill(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale,
                          lambda key, pos: _outside_chunk(key, pos, chunk))


def _with_chunk(make):
    def inputs(shape, dtype, device, seed):
        return (*make(shape, dtype, device, seed), int(shape["chunk_size"]))
    return inputs


def _chunk_shapes(phase: str):
    def shapes(spec, point) -> list[dict]:
        if not spec.attention_chunk_size or point.phase != phase:
            return []
        s = {**paged_shape(point), "Hq": spec.num_heads, "Hk": spec.num_kv_heads, "Dh": spec.head_dim,
             "Dv": spec.head_dim, "chunk_size": spec.attention_chunk_size}
        return [s]
    return shapes


# ----------------------------------------------------------------------------- NoPE query temperature
def attn_temperature(q: torch.Tensor, positions: torch.Tensor, floor_scale: int, attn_scale: float) -> torch.Tensor:
    scales = torch.log1p(torch.floor((positions.float() + 1.0) / floor_scale)) * attn_scale + 1.0     # [T]
    return (_acc(q) * scales[:, None, None]).to(q.dtype)


def _temp_inputs(shape, dtype, device, seed):
    g = generator(device, seed)
    q = randn(g, [shape["T"], shape["Hq"], shape["Dh"]], dtype, device)
    pos = torch.randint(0, shape.get("max_pos", 4 * shape["floor_scale"]), (shape["T"],), generator=g,
                        device=device)
    return q, pos, int(shape["floor_scale"]), float(shape["attn_scale"])


def _temp_shapes(spec, point) -> list[dict]:
    if not spec.attn_temperature_floor:
        return []
    return [{"T": tokens(point), "Hq": spec.num_heads, "Dh": spec.head_dim, "floor_scale": spec.attn_temperature_floor,
             "attn_scale": spec.attn_temperature_scale}]


# ----------------------------------------------------------------------------- input-scaled experts
def moe_experts_scaled_input(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                             topk_ids: torch.Tensor) -> torch.Tensor:
    ones = torch.ones_like(topk_weights[:, :1])
    out = None
    for j in range(topk_ids.shape[1]):
        xs = (_acc(x) * _acc(topk_weights[:, j:j + 1])).to(x.dtype)           # HF: routed_in = x * score
        y = moe_experts(xs, w13, w2, ones, topk_ids[:, j:j + 1])
        out = y if out is None else out + y
    return out


def _scaled_shapes(spec, point) -> list[dict]:
    return _experts_shapes(spec, point) if spec.moe_input_scaled else []


OPS = [
    OpDef("attention_decode_chunked", attention_decode_chunked,
          "attention_decode_chunked(q[B, Hq, Dh], k_cache[NB, BS, Hk, Dh], v_cache[NB, BS, Hk, Dv], block_tables[B, MB] "
          "int32, context_lens[B] int32, scale, chunk: int) -> [B, Hq, Dv]: attention_decode over the keys of the "
          "query's own chunk of `chunk` positions (Llama-4). shape dict: {'B', 'Hq', 'Hk', 'Dh', 'Dv', 'ctx', 'BS', "
          "'chunk_size'}",
          _with_chunk(_decode_inputs), _chunk_shapes("decode"),
          ({"B": 3, "Hq": 4, "Hk": 2, "Dh": 16, "Dv": 16, "ctx": 37, "BS": 16, "chunk_size": 8},
           {"B": 2, "Hq": 4, "Hk": 1, "Dh": 16, "Dv": 16, "ctx": 21, "BS": 4, "chunk_size": 64}),
          tolerances=dict(MATMUL_TOLERANCES)),
    OpDef("attention_prefill_chunked", attention_prefill_chunked,
          "attention_prefill_chunked(q[T, Hq, Dh], k_cache, v_cache, block_tables, cu_seqlens_q[B+1] int32, "
          "context_lens[B] int32, scale, chunk) -> [T, Hq, Dv]: causal attention within each query's chunk. shape "
          "dict: {'B', 'chunk', 'Hq', 'Hk', 'Dh', 'Dv', 'ctx', 'BS', 'chunk_size'}",
          _with_chunk(_prefill_inputs), _chunk_shapes("prefill"),
          ({"B": 2, "chunk": 5, "Hq": 4, "Hk": 2, "Dh": 16, "Dv": 16, "ctx": 21, "BS": 8, "chunk_size": 6},),
          tolerances=dict(MATMUL_TOLERANCES)),
    OpDef("attn_temperature", attn_temperature,
          "attn_temperature(q[T, Hq, Dh], positions[T] int64, floor_scale: int, attn_scale: float) -> [T, Hq, Dh] = "
          "q * (log1p(floor((positions + 1) / floor_scale)) * attn_scale + 1) in fp32 (Llama-4 NoPE layers). shape "
          "dict: {'T', 'Hq', 'Dh', 'floor_scale', 'attn_scale'}",
          _temp_inputs, _temp_shapes, ({"T": 7, "Hq": 4, "Dh": 16, "floor_scale": 4, "attn_scale": 0.1},)),
    OpDef("moe_experts_scaled_input", moe_experts_scaled_input,
          "moe_experts_scaled_input(x[T, H], w13[E, 2I, H], w2[E, H, I], topk_weights[T, k] fp32, topk_ids[T, k] "
          "int64) -> [T, H] = sum_j silu_and_mul((x[t] * w[t, j]) @ w13[e].T) @ w2[e].T, e = topk_ids[t, j] (the "
          "router weight scales the expert's input: Llama-4). shape dict: {'T', 'E', 'k', 'H', 'I'}",
          _experts_inputs, _scaled_shapes,
          ({"T": 1, "E": 16, "k": 1, "H": 32, "I": 24}, {"T": 6, "E": 8, "k": 2, "H": 48, "I": 16}),
          tolerances=dict(MATMUL_TOLERANCES), fit=_experts_fit, check_bytes=experts_check_bytes),
]
