"""Composite ops: fusions of finer ops that the decoder calls as one, so that a single kernel (a
template or a candidate) can replace several launches and the round trips of their intermediates.

    add_rms_norm_linear(x[T, H], residual[T, H], norm_weight[H], eps, weight[N, H], bias[N] | None)
        -> (out[T, N], new_residual[T, H])
        normed, new_residual = fused_add_rms_norm(x, residual, norm_weight, eps)
        out = linear(normed, weight, bias)
    silu_mul_linear(x[T, 2I], weight[N, I]) -> [T, N] = linear(silu_and_mul(x), weight, None)
    add_rms_norm_qkv_rotary(x[T, H], residual[T, H], norm_weight[H], eps, qkv_weight[(Hq + 2 Hk) Dh, H],
                            qkv_bias | None, positions[T], cos_sin_cache[max_pos, R], rotary_dim, Hq, Hk)
        -> (q[T, Hq, Dh], k[T, Hk, Dh], v[T, Hk, Dh], new_residual[T, H])
        qkv, new_residual = add_rms_norm_linear(x, residual, norm_weight, eps, qkv_weight, qkv_bias)
        q, k = rotary_embedding(positions, q, k, cos_sin_cache, rotary_dim)   (q, k, v: split of qkv)

``reference`` is the composition of the fine ops' references (what verification compares against);
``default`` is the same composition through ``registry.call`` (what runs when the composite is not
overridden), so an accepted ``linear`` or ``silu_and_mul`` override still reaches these call sites.
Unfused, a batch-1 decode pays the [T, H] normed and [T, I] activated intermediates once written and
once read, plus one launch each; fused, the weights ([N, H] or [N, I]) dominate the bytes moved.
Call sites: the GQA qkv projection and the dense gate_up projection (add_rms_norm_linear); the dense
down projection and the MoE shared-expert down projection (silu_mul_linear); the whole attention input
(norm, qkv projection, rotary) of GQA layers without QK-norm (add_rms_norm_qkv_rotary: its default runs
add_rms_norm_linear, then rotary_embedding on strided q/k views, so overrides of either still apply;
fused, a decode step saves the rotary launch and the q/k round trip, 2 (Hq + Hk) Dh elements per token).
"""

from __future__ import annotations

import torch

from persistent_engine.ops import attention, basic
from persistent_engine.ops.opdef import MATMUL_TOLERANCES, OpDef, dedup, generator, randint, randn, tokens


# ----------------------------------------------------------------------------- add_rms_norm_linear
def add_rms_norm_linear(x: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor, eps: float,
                        weight: torch.Tensor, bias: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    normed, new_residual = basic.fused_add_rms_norm(x, residual, norm_weight, eps)
    return basic.linear(normed, weight, bias), new_residual


def _add_rms_norm_linear_default(x, residual, norm_weight, eps, weight, bias):
    from persistent_engine.ops.registry import call          # lazy: the registry imports this module
    normed, new_residual = call("fused_add_rms_norm", x, residual, norm_weight, eps)
    return call("linear", normed, weight, bias), new_residual


def _add_rms_norm_linear_shapes(spec, point) -> list[dict]:
    """{"T", "H", "N", "bias"}: the GQA qkv projection of every layer, the dense gate_up projection."""
    t, h = tokens(point), spec.hidden_size
    out = []
    if spec.attention == "gqa":
        for hk in sorted({k for k, _, _ in spec.attention_kinds()}):       # MiMo-V2-Flash: two KV head counts
            v = 0 if getattr(spec, "k_eq_v", False) else hk * spec.gqa_v_head_dim       # Gemma-4 full layers: V = K
            qkv = (spec.num_heads + hk) * spec.head_dim + v
            out.append({"T": t, "H": h, "N": qkv, "bias": bool(spec.qkv_bias)})
    if "dense" in set(spec.layer_kinds()):
        out.append({"T": t, "H": h, "N": 2 * spec.intermediate_size, "bias": False})
    return dedup(out)


def _add_rms_norm_linear_inputs(shape, dtype, device, seed):
    g = generator(device, seed)
    t, h, n = shape["T"], shape["H"], shape["N"]
    x, residual = randn(g, [t, h], dtype, device), randn(g, [t, h], dtype, device, 2.0)
    norm_weight = 1.0 + randn(g, [h], dtype, device, 0.1)
    weight = randn(g, [n, h], dtype, device, h ** -0.5)
    bias = randn(g, [n], dtype, device) if shape.get("bias") else None
    return (x, residual, norm_weight, 1e-6, weight, bias)


# ----------------------------------------------------------------------------- silu_mul_linear
def silu_mul_linear(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    return basic.linear(basic.silu_and_mul(x), weight, None)


def _silu_mul_linear_default(x, weight):
    from persistent_engine.ops.registry import call
    return call("linear", call("silu_and_mul", x), weight, None)


def _silu_mul_linear_shapes(spec, point) -> list[dict]:
    """{"T", "I", "N"}: the dense down projection, the MoE shared-expert down projection."""
    t, h = tokens(point), spec.hidden_size
    kinds = set(spec.layer_kinds())
    out = []
    if "dense" in kinds:
        out.append({"T": t, "I": spec.intermediate_size, "N": h})
    if "moe" in kinds and spec.num_shared_experts:
        out.append({"T": t, "I": spec.shared_intermediate_size * spec.num_shared_experts, "N": h})
    return dedup(out)


def _silu_mul_linear_inputs(shape, dtype, device, seed):
    g = generator(device, seed)
    t, i, n = shape["T"], shape["I"], shape["N"]
    return (randn(g, [t, 2 * i], dtype, device, 2.0), randn(g, [n, i], dtype, device, i ** -0.5))


# ----------------------------------------------------------------------------- add_rms_norm_qkv_rotary
def split_qkv(qkv: torch.Tensor, num_heads: int, num_kv_heads: int):
    """qkv[T, (Hq + 2 Hk) Dh] -> q[T, Hq, Dh], k[T, Hk, Dh], v[T, Hk, Dh]: strided views (row stride
    (Hq + 2 Hk) Dh), no copy."""
    t, n = qkv.shape
    dh = n // (num_heads + 2 * num_kv_heads)
    q, k, v = qkv.split([num_heads * dh, num_kv_heads * dh, num_kv_heads * dh], dim=-1)
    return q.view(t, num_heads, dh), k.view(t, num_kv_heads, dh), v.view(t, num_kv_heads, dh)


def add_rms_norm_qkv_rotary(x: torch.Tensor, residual: torch.Tensor, norm_weight: torch.Tensor, eps: float,
                            qkv_weight: torch.Tensor, qkv_bias: torch.Tensor | None, positions: torch.Tensor,
                            cos_sin_cache: torch.Tensor, rotary_dim: int, num_heads: int, num_kv_heads: int):
    """q and k are new tensors (the rotary's); v is a strided view of the projected qkv (a fresh
    intermediate, never an input), so nothing returned aliases an input."""
    qkv, new_residual = add_rms_norm_linear(x, residual, norm_weight, eps, qkv_weight, qkv_bias)
    q, k, v = split_qkv(qkv, num_heads, num_kv_heads)
    q, k = attention.rotary_embedding(positions, q, k, cos_sin_cache, rotary_dim)
    return q, k, v, new_residual


def _add_rms_norm_qkv_rotary_default(x, residual, norm_weight, eps, qkv_weight, qkv_bias, positions, cos_sin_cache,
                                     rotary_dim, num_heads, num_kv_heads):
    from persistent_engine.ops.registry import call
    qkv, new_residual = call("add_rms_norm_linear", x, residual, norm_weight, eps, qkv_weight, qkv_bias)
    q, k, v = split_qkv(qkv, num_heads, num_kv_heads)
    q, k = call("rotary_embedding", positions, q, k, cos_sin_cache, rotary_dim)
    return q, k, v, new_residual


def _add_rms_norm_qkv_rotary_shapes(spec, point) -> list[dict]:
    """{"T", "H", "Hq", "Hk", "Dh", "R", "bias"}: the attention input of GQA layers without QK-norm
    (Llama-style); QK-norm models keep add_rms_norm_linear + rms_norm + rotary_embedding."""
    if spec.attention != "gqa" or spec.qk_norm != "none" or spec.gqa_v_head_dim != spec.head_dim:
        return []                   # MiMo-V2-Flash's narrower V heads: add_rms_norm_linear, then the rotary
    return [{"T": tokens(point), "H": spec.hidden_size, "Hq": spec.num_heads, "Hk": hk,
             "Dh": spec.head_dim, "R": spec.rotary_dim or spec.head_dim, "bias": bool(spec.qkv_bias)}
            for hk in sorted({k for k, _, _ in spec.attention_kinds()})]


def _add_rms_norm_qkv_rotary_inputs(shape, dtype, device, seed):
    g = generator(device, seed)
    t, h, hq, hk, dh, r = (shape[k] for k in ("T", "H", "Hq", "Hk", "Dh", "R"))
    mp, n = shape.get("max_pos", 4096), (hq + 2 * hk) * dh
    x, residual = randn(g, [t, h], dtype, device), randn(g, [t, h], dtype, device, 2.0)
    norm_weight = 1.0 + randn(g, [h], dtype, device, 0.1)
    weight = randn(g, [n, h], dtype, device, h ** -0.5)
    bias = randn(g, [n], dtype, device) if shape.get("bias") else None
    positions = randint(g, mp, [t], device)
    return (x, residual, norm_weight, 1e-6, weight, bias, positions, attention.rope_cache(mp, r, device=device),
            r, hq, hk)


OPS = [
    OpDef("add_rms_norm_linear", add_rms_norm_linear,
          "add_rms_norm_linear(x[T, H], residual[T, H], norm_weight[H], eps: float, weight[N, H], bias[N] | None) "
          "-> (out[T, N], new_residual[T, H]), both x.dtype: normed, new_residual = fused_add_rms_norm(x, residual, "
          "norm_weight, eps); out = linear(normed, weight, bias). Composite: unless overridden it runs "
          "fused_add_rms_norm then linear through the registry. shape dict: {'T', 'H', 'N', 'bias': bool}",
          _add_rms_norm_linear_inputs, _add_rms_norm_linear_shapes,
          ({"T": 5, "H": 64, "N": 96, "bias": False}, {"T": 1, "H": 130, "N": 70, "bias": True},
           {"T": 3, "H": 48, "N": 200, "bias": False}),
          outputs=2, tolerances=dict(MATMUL_TOLERANCES), default=_add_rms_norm_linear_default),
    OpDef("silu_mul_linear", silu_mul_linear,
          "silu_mul_linear(x[T, 2I], weight[N, I]) -> [T, N] (x.dtype) = linear(silu_and_mul(x), weight, None) "
          "(first half of x gate, second half up). Composite: unless overridden it runs silu_and_mul then "
          "linear through the registry. shape dict: {'T', 'I', 'N'}",
          _silu_mul_linear_inputs, _silu_mul_linear_shapes,
          ({"T": 5, "I": 64, "N": 96}, {"T": 1, "I": 37, "N": 130}, {"T": 7, "I": 100, "N": 48}),
          tolerances=dict(MATMUL_TOLERANCES), default=_silu_mul_linear_default),
    OpDef("add_rms_norm_qkv_rotary", add_rms_norm_qkv_rotary,
          "add_rms_norm_qkv_rotary(x[T, H], residual[T, H], norm_weight[H], eps: float, qkv_weight[(Hq + 2 Hk) Dh, H], "
          "qkv_bias[(Hq + 2 Hk) Dh] | None, positions[T] int64, cos_sin_cache[max_pos, R] fp32, rotary_dim: int, "
          "num_heads: int, num_kv_heads: int) -> (q[T, Hq, Dh], k[T, Hk, Dh], v[T, Hk, Dh], new_residual[T, H]), "
          "all x.dtype: qkv, new_residual = add_rms_norm_linear(x, residual, norm_weight, eps, qkv_weight, qkv_bias); "
          "q, k, v = qkv split into heads (q rows first, then k, then v); q, k = rotary_embedding(positions, q, k, "
          "cos_sin_cache, rotary_dim) (neox halves on the first rotary_dim dims of each head); v unrotated (may be "
          "a strided view of an intermediate, never of an input). Composite: unless overridden it runs "
          "add_rms_norm_linear then rotary_embedding through the registry. "
          "shape dict: {'T', 'H', 'Hq', 'Hk', 'Dh', 'R', 'bias': bool, 'max_pos'}",
          _add_rms_norm_qkv_rotary_inputs, _add_rms_norm_qkv_rotary_shapes,
          ({"T": 5, "H": 64, "Hq": 4, "Hk": 2, "Dh": 16, "R": 16, "bias": False},
           {"T": 3, "H": 130, "Hq": 6, "Hk": 1, "Dh": 24, "R": 8, "bias": True},
           {"T": 1, "H": 48, "Hq": 3, "Hk": 3, "Dh": 10, "R": 6, "bias": True}),
          outputs=4, tolerances=dict(MATMUL_TOLERANCES), default=_add_rms_norm_qkv_rotary_default),
]
