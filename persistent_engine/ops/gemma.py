"""Gemma-2 / Gemma-3 / Gemma-4's own ops: GeGLU, GeGLU experts, soft-capped attention over the paged KV cache,
soft-capped logits.

- ``gelu_tanh_and_mul(x[..., 2I]) -> [..., I]``: gelu_pytorch_tanh(gate) * up (HF Gemma2MLP / Gemma3MLP:
  ``down_proj(act_fn(gate_proj(x)) * up_proj(x))``, ``hidden_activation`` "gelu_pytorch_tanh"), in fp32.
- ``moe_experts_gelu(x, w13, w2, topk_weights, topk_ids)``: ``moe_experts`` with GeGLU experts (HF
  ``Gemma4TextExperts``: ``down_proj[e](gelu_tanh(gate) * up)`` of ``gate_up_proj[e] x``, each expert's output
  times its routing weight, summed): 6 H Im FLOPs and 3 H Im weights per token and expert, as a SwiGLU expert.
- ``attention_decode_softcap`` / ``attention_prefill_softcap``: the windowed attention of ops/window.py with
  each score soft-capped before the mask and softmax, as HF's Gemma-2 ``eager_attention_forward`` does:
  ``s = tanh(s * scale / cap) * cap`` (``attn_logit_softcapping``); ``window`` 0 is full (causal) attention.
- ``logit_softcap(logits[B, V], cap) -> tanh(logits / cap) * cap`` (``final_logit_softcapping``, Gemma2ForCausalLM
  and Gemma3ForCausalLM after lm_head).

Reads and writes as the ops they extend: a decode step reads min(window, context) keys per sequence when windowed.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from persistent_engine.ops.attention import _decode_inputs, _prefill_inputs
from persistent_engine.ops.basic import _acc
from persistent_engine.ops.moe import LOOP_MIN_TOKENS, _experts_fit, _experts_inputs, experts_check_bytes, \
    experts_forward
from persistent_engine.ops.opdef import MATMUL_TOLERANCES, OpDef, generator, paged_shape, randn, tokens
from persistent_engine.ops.window import _hidden, masked_decode, masked_prefill


# ----------------------------------------------------------------------------- GeGLU
def gelu_tanh_and_mul(x: torch.Tensor) -> torch.Tensor:
    gate, up = _acc(x).chunk(2, dim=-1)
    return (F.gelu(gate, approximate="tanh") * up).to(x.dtype)


def _glu_inputs(shape, dtype, device, seed):
    return (randn(generator(device, seed), shape["x"], dtype, device),)


def _glu_shapes(spec, point) -> list[dict]:
    if spec.mlp_act != "gelu_tanh":
        return []
    return [{"x": [tokens(point), 2 * spec.intermediate_size]}]


# ----------------------------------------------------------------------------- soft-capped attention
def moe_experts_gelu(x: torch.Tensor, w13: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                     topk_ids: torch.Tensor) -> torch.Tensor:
    """x [T, H], w13 [E, 2Im, H] (gate rows then up), w2 [E, H, Im], topk_weights [T, k] fp32, topk_ids [T, k] ->
    [T, H] (the gather / dense / grouped paths of ``moe_experts`` with GeGLU)."""
    return experts_forward(x, w13, w2, topk_weights, topk_ids, gelu_tanh_and_mul)


def _experts_shapes(spec, point) -> list[dict]:
    if not spec.is_moe or spec.mlp_act != "gelu_tanh":
        return []
    return [{"T": tokens(point), "E": spec.num_experts, "k": spec.num_experts_per_tok, "H": spec.hidden_size,
             "I": spec.moe_intermediate_size}]


def attention_decode_softcap(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                             context_lens: torch.Tensor, scale: float, window: int, cap: float) -> torch.Tensor:
    return masked_decode(q, k_cache, v_cache, block_tables, context_lens, scale,
                         lambda key, pos: _hidden(key, pos, window), cap=cap)


def attention_prefill_softcap(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, block_tables: torch.Tensor,
                              cu_seqlens_q: torch.Tensor, context_lens: torch.Tensor, scale: float, window: int,
                              cap: float) -> torch.Tensor:
    return masked_prefill(q, k_cache, v_cache, block_tables, cu_seqlens_q, context_lens, scale,
                          lambda key, pos: _hidden(key, pos, window), cap=cap)


def _with_cap(make):
    def inputs(shape, dtype, device, seed):
        return (*make(shape, dtype, device, seed), int(shape.get("window", 0)), float(shape["cap"]))
    return inputs


def _attn_shapes(phase: str):
    def shapes(spec, point) -> list[dict]:
        if not spec.attn_softcap or point.phase != phase:
            return []
        base = {**paged_shape(point), "Hq": spec.num_heads, "Hk": spec.num_kv_heads, "Dh": spec.head_dim,
                "Dv": spec.head_dim, "cap": spec.attn_softcap}
        return [{**base, "window": w} for w in sorted({spec.layer_window(i) for i in range(spec.num_layers)})]
    return shapes


# ----------------------------------------------------------------------------- soft-capped logits
def logit_softcap(logits: torch.Tensor, cap: float) -> torch.Tensor:
    return (torch.tanh(_acc(logits) / cap) * cap).to(logits.dtype)


def _logit_inputs(shape, dtype, device, seed):
    return randn(generator(device, seed), [shape["B"], shape["V"]], torch.float32, device, std=30.0), float(shape["cap"])


def _logit_shapes(spec, point) -> list[dict]:
    return [{"B": int(point.batch), "V": spec.vocab_size, "cap": spec.final_softcap}] if spec.final_softcap else []


OPS = [
    OpDef("gelu_tanh_and_mul", gelu_tanh_and_mul,
          "gelu_tanh_and_mul(x[..., 2I]) -> [..., I] = gelu(x[..., :I], approximate='tanh') * x[..., I:] in fp32 "
          "(Gemma's GeGLU). shape dict: {'x': [..., 2I]}",
          _glu_inputs, _glu_shapes, ({"x": [5, 128]}, {"x": [3, 2 * 37]})),
    OpDef("moe_experts_gelu", moe_experts_gelu,
          "moe_experts_gelu(x[T, H], w13[E, 2I, H], w2[E, H, I], topk_weights[T, k] fp32, topk_ids[T, k] int64) -> "
          "[T, H] = sum_j topk_weights[t, j] * (gelu_tanh_and_mul(x[t] @ w13[e].T) @ w2[e].T), e = topk_ids[t, j] "
          "(w13 rows: gate then up; Gemma-4's experts). shape dict: {'T', 'E', 'k', 'H', 'I'}",
          _experts_inputs, _experts_shapes,
          ({"T": 1, "E": 16, "k": 2, "H": 32, "I": 24}, {"T": 6, "E": 8, "k": 2, "H": 48, "I": 16},
           {"T": LOOP_MIN_TOKENS + 3, "E": 8, "k": 3, "H": 16, "I": 8}),
          tolerances=dict(MATMUL_TOLERANCES), fit=_experts_fit, check_bytes=experts_check_bytes),
    OpDef("attention_decode_softcap", attention_decode_softcap,
          "attention_decode_softcap(q[B, Hq, Dh], k_cache[NB, BS, Hk, Dh], v_cache[NB, BS, Hk, Dv], block_tables[B, MB] "
          "int32, context_lens[B] int32, scale, window: int, cap: float) -> [B, Hq, Dv]: attention_decode_window with "
          "scores tanh(q.k * scale / cap) * cap (Gemma-2). shape dict: {'B', 'Hq', 'Hk', 'Dh', 'Dv', 'ctx', 'BS', "
          "'window', 'cap'}",
          _with_cap(_decode_inputs), _attn_shapes("decode"),
          ({"B": 3, "Hq": 4, "Hk": 2, "Dh": 16, "Dv": 16, "ctx": 37, "BS": 16, "window": 8, "cap": 2.0},
           {"B": 2, "Hq": 4, "Hk": 1, "Dh": 16, "Dv": 16, "ctx": 21, "BS": 4, "window": 0, "cap": 50.0}),
          tolerances=dict(MATMUL_TOLERANCES)),
    OpDef("attention_prefill_softcap", attention_prefill_softcap,
          "attention_prefill_softcap(q[T, Hq, Dh], k_cache, v_cache, block_tables, cu_seqlens_q[B+1] int32, "
          "context_lens[B] int32, scale, window, cap) -> [T, Hq, Dv]: attention_prefill_window with soft-capped "
          "scores. shape dict: {'B', 'chunk', 'Hq', 'Hk', 'Dh', 'Dv', 'ctx', 'BS', 'window', 'cap'}",
          _with_cap(_prefill_inputs), _attn_shapes("prefill"),
          ({"B": 2, "chunk": 5, "Hq": 4, "Hk": 2, "Dh": 16, "Dv": 16, "ctx": 21, "BS": 8, "window": 6, "cap": 2.0},),
          tolerances=dict(MATMUL_TOLERANCES)),
    OpDef("logit_softcap", logit_softcap,
          "logit_softcap(logits[B, V] fp32, cap) -> [B, V] = tanh(logits / cap) * cap. shape dict: {'B', 'V', 'cap'}",
          _logit_inputs, _logit_shapes, ({"B": 3, "V": 97, "cap": 30.0},)),
]
