"""Norms, activations, projections, embedding, lm_head and sampling: the ops of every layer type.

References compute in at least float32 (``_acc``) and return the input dtype, so that the contract
can run them on float64 copies of the inputs to get a higher-precision answer.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from persistent_engine.ops.opdef import (MATMUL_TOLERANCES, OpDef, dedup, generator, randint, randn,
                                         tokens)


def _acc(t: torch.Tensor) -> torch.Tensor:
    """``t`` in its accumulation dtype: float32, or float64 when it already is."""
    return t.to(torch.promote_types(t.dtype, torch.float32))


# ----------------------------------------------------------------------------- rms_norm
def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    xf = _acc(x)
    y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return (y * weight.to(xf.dtype)).to(x.dtype)


def fused_add_rms_norm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor,
                       eps: float) -> tuple[torch.Tensor, torch.Tensor]:
    r = _acc(x) + _acc(residual)
    y = r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + eps)
    return (y * weight.to(r.dtype)).to(x.dtype), r.to(x.dtype)


def _norm_shapes(spec, point) -> list[dict]:
    t, h = tokens(point), spec.hidden_size
    out = [{"x": [t, h]}]
    if spec.attention == "mla":
        if spec.q_lora_rank:
            out.append({"x": [t, spec.q_lora_rank]})
        out.append({"x": [t, spec.kv_lora_rank]})
    elif spec.qk_norm == "per_head":
        out += [{"x": [t, spec.num_heads, spec.head_dim]}, {"x": [t, spec.num_kv_heads, spec.head_dim]}]
    elif spec.qk_norm == "per_layer":
        out += [{"x": [t, spec.num_heads * spec.head_dim]}, {"x": [t, spec.num_kv_heads * spec.head_dim]}]
    return dedup(out)


def _norm_inputs(shape, dtype, device, seed):
    g = generator(device, seed)
    d = shape["x"][-1]
    return (randn(g, shape["x"], dtype, device, 3.0), 1.0 + randn(g, [d], dtype, device, 0.1), 1e-6)


def _fused_inputs(shape, dtype, device, seed):
    g = generator(device, seed)
    d = shape["x"][-1]
    return (randn(g, shape["x"], dtype, device), randn(g, shape["x"], dtype, device, 2.0),
            1.0 + randn(g, [d], dtype, device, 0.1), 1e-6)


# ----------------------------------------------------------------------------- silu_and_mul
def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    gate, up = _acc(x).chunk(2, dim=-1)
    return (F.silu(gate) * up).to(x.dtype)


def _silu_shapes(spec, point) -> list[dict]:
    t = tokens(point)
    kinds = set(spec.layer_kinds())
    out = []
    if "dense" in kinds:
        out.append({"x": [t, 2 * spec.intermediate_size]})
    if "moe" in kinds and spec.num_shared_experts:
        out.append({"x": [t, 2 * spec.shared_intermediate_size * spec.num_shared_experts]})
    return dedup(out)


def _silu_inputs(shape, dtype, device, seed):
    return (randn(generator(device, seed), shape["x"], dtype, device, 2.0),)


# ----------------------------------------------------------------------------- linear
def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    return F.linear(x, weight, bias)


def linear_shapes(spec, point) -> list[dict]:
    """Every projection of the model at this point: {"T", "K", "N", "bias"}."""
    t, h = tokens(point), spec.hidden_size
    kn: list[tuple[int, int, bool]] = []
    if spec.attention == "mla":
        qk = spec.qk_nope_head_dim + spec.qk_rope_head_dim
        if spec.q_lora_rank:
            kn += [(h, spec.q_lora_rank, False), (spec.q_lora_rank, spec.num_heads * qk, False)]
        else:
            kn.append((h, spec.num_heads * qk, False))
        kn += [(h, spec.kv_lora_rank + spec.qk_rope_head_dim, False), (spec.num_heads * spec.v_head_dim, h, False)]
    elif spec.attention == "v4":        # DeepSeek-V4: q_a, q_b, kv_proj, o_b, the compressors and the CSA indexer
        lq, d, di, hi = spec.q_lora_rank, spec.head_dim, spec.index_head_dim, spec.index_n_heads
        kn += [(h, lq, False), (lq, spec.num_heads * d, False), (h, d, False), (spec.o_groups * spec.o_lora_rank, h, False)]
        for r in set(spec.compress_ratios) - {0}:
            kn.append((h, (2 if r == spec.csa_ratio else 1) * d, False))
            if r == spec.csa_ratio:
                kn += [(h, 2 * di, False), (lq, hi * di, False), (h, hi, False)]
    else:
        q, dh, dv = spec.num_heads * spec.head_dim, spec.head_dim, spec.gqa_v_head_dim
        kv = dh if getattr(spec, "k_eq_v", False) else dh + dv                  # Gemma-4 full layers: V = K
        kn += [(h, q + hk * kv, spec.qkv_bias) for hk in sorted({k for k, _, _ in spec.attention_kinds()})]
        kn.append((spec.num_heads * dv, h, False))
    kinds = set(spec.layer_kinds())
    if "dense" in kinds:
        kn += [(h, 2 * spec.intermediate_size, False), (spec.intermediate_size, h, False)]
    if "moe" in kinds:
        kn.append((h, spec.num_experts, False))
        if spec.num_shared_experts:
            si = spec.shared_intermediate_size * spec.num_shared_experts
            kn += [(h, 2 * si, False), (si, h, False)]
    return dedup([{"T": t, "K": k, "N": n, "bias": b} for k, n, b in kn])


def _linear_inputs(shape, dtype, device, seed):
    g = generator(device, seed)
    k, n = shape["K"], shape["N"]
    bias = randn(g, [n], dtype, device) if shape.get("bias") else None
    return (randn(g, [shape["T"], k], dtype, device), randn(g, [n, k], dtype, device, k ** -0.5), bias)


# ----------------------------------------------------------------------------- embedding / lm_head
def embedding(ids: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return F.embedding(ids, weight)


def _embedding_inputs(shape, dtype, device, seed):
    g = generator(device, seed)
    return (randint(g, shape["V"], [shape["T"]], device), randn(g, [shape["V"], shape["D"]], dtype, device))


def lm_head(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    out = F.linear(x, weight)
    return out.to(torch.promote_types(out.dtype, torch.float32))


def _lm_head_inputs(shape, dtype, device, seed):
    g = generator(device, seed)
    h = shape["H"]
    return (randn(g, [shape["B"], h], dtype, device), randn(g, [shape["V"], h], dtype, device, h ** -0.5))


def _batch(point) -> int:
    return int(point.batch)


# ----------------------------------------------------------------------------- sample
def sample(logits: torch.Tensor, temperature: float, seed: int) -> torch.Tensor:
    """Greedy when temperature <= 0; otherwise the exponential race (argmax p / E, E ~ Exp(1) drawn
    from a generator seeded with ``seed``), which samples from softmax(logits / temperature)."""
    if temperature <= 0:
        return logits.argmax(dim=-1)
    probs = torch.softmax(_acc(logits) / temperature, dim=-1)
    e = torch.empty_like(probs).exponential_(1.0, generator=generator(logits.device, seed))
    return (probs / e).argmax(dim=-1)


def _sample_inputs(shape, dtype, device, seed):
    g = generator(device, seed)
    return (randn(g, [shape["B"], shape["V"]], torch.float32, device, 4.0), float(shape.get("temperature", 0.0)),
            int(seed))


OPS = [
    OpDef("rms_norm", rms_norm,
          "rms_norm(x[..., D], weight[D], eps: float) -> [..., D] (x.dtype); y = x / sqrt(mean(x^2) + eps) * weight, "
          "computed in fp32. shape dict: {'x': [..., D]}",
          _norm_inputs, _norm_shapes, ({"x": [5, 64]}, {"x": [3, 4, 48]}, {"x": [1, 2048]}, {"x": [7, 100]})),
    OpDef("fused_add_rms_norm", fused_add_rms_norm,
          "fused_add_rms_norm(x[..., D], residual[..., D], weight[D], eps) -> (rms_norm(x + residual), x + residual), "
          "both x.dtype, the sum taken in fp32. shape dict: {'x': [..., D]}",
          _fused_inputs, lambda spec, p: [{"x": [tokens(p), spec.hidden_size]}],
          ({"x": [5, 64]}, {"x": [1, 2048]}, {"x": [9, 96]}), outputs=2),
    OpDef("silu_and_mul", silu_and_mul,
          "silu_and_mul(x[..., 2I]) -> [..., I] = silu(x[..., :I]) * x[..., I:] (first half gate, second half up). "
          "shape dict: {'x': [..., 2I]}",
          _silu_inputs, _silu_shapes, ({"x": [5, 128]}, {"x": [1, 2 * 8192]}, {"x": [3, 2 * 37]})),
    OpDef("linear", linear,
          "linear(x[T, K], weight[N, K], bias[N] | None) -> [T, N] = x @ weight.T + bias. "
          "shape dict: {'T', 'K', 'N', 'bias': bool}",
          _linear_inputs, linear_shapes,
          ({"T": 5, "K": 64, "N": 96, "bias": False}, {"T": 1, "K": 256, "N": 200, "bias": True},
           {"T": 33, "K": 130, "N": 70, "bias": False}),
          tolerances=dict(MATMUL_TOLERANCES)),
    OpDef("embedding", embedding,
          "embedding(ids[T] int64, weight[V, D]) -> [T, D] = weight[ids]. shape dict: {'T', 'V', 'D'}",
          _embedding_inputs, lambda spec, p: [{"T": tokens(p), "V": spec.vocab_size, "D": spec.hidden_size}],
          ({"T": 5, "V": 100, "D": 64}, {"T": 1, "V": 33, "D": 48})),
    OpDef("lm_head", lm_head,
          "lm_head(x[B, H], weight[V, H]) -> logits[B, V] fp32 (bf16 matmul, fp32 result). shape dict: {'B', 'V', 'H'}",
          _lm_head_inputs, lambda spec, p: [{"B": _batch(p), "V": spec.vocab_size, "H": spec.hidden_size}],
          ({"B": 3, "V": 500, "H": 64}, {"B": 1, "V": 1000, "H": 128}), tolerances=dict(MATMUL_TOLERANCES)),
    OpDef("sample", sample,
          "sample(logits[B, V] fp32, temperature: float, seed: int) -> tokens[B] int64; temperature <= 0 is "
          "greedy (argmax). shape dict: {'B', 'V', 'temperature'}",
          _sample_inputs, lambda spec, p: [{"B": _batch(p), "V": spec.vocab_size, "temperature": 0.0}],
          ({"B": 3, "V": 500, "temperature": 0.0}, {"B": 4, "V": 77, "temperature": 0.7})),
]
