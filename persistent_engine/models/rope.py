"""Rotary position tables: the ``cos_sin_cache[max_pos, R]`` (fp32) that ``rotary_embedding`` reads,
with the frequency scaling of each family (none, linear, Llama-3, YaRN, Gemma-4's proportional), and YaRN's
attention-scale factor.

Cost: max_pos * R * 4 bytes, built once per model (GLM-4.6: 202752 x 64 -> 52 MB).
"""

from __future__ import annotations

import math

import torch


def _llama3_inv_freq(inv: torch.Tensor, sc: dict) -> torch.Tensor:
    factor, low, high = float(sc["factor"]), float(sc.get("low_freq_factor", 1.0)), float(sc.get("high_freq_factor", 4.0))
    old = float(sc["original_max_position_embeddings"])
    wavelen = 2 * math.pi / inv
    smooth = ((old / wavelen) - low) / (high - low)
    mid = (1 - smooth) * inv / factor + smooth * inv
    return torch.where(wavelen > old / low, inv / factor, torch.where(wavelen < old / high, inv, mid))


def yarn_mscale(factor: float, mscale: float = 1.0) -> float:
    return 1.0 if factor <= 1 else 0.1 * mscale * math.log(factor) + 1.0


def _yarn_inv_freq(dim: int, base: float, sc: dict) -> torch.Tensor:
    factor = float(sc["factor"])
    old = float(sc["original_max_position_embeddings"])
    beta_fast, beta_slow = float(sc.get("beta_fast", 32)), float(sc.get("beta_slow", 1))

    def corr_dim(rot: float) -> float:
        return dim * math.log(old / (rot * 2 * math.pi)) / (2 * math.log(base))

    low, high = corr_dim(beta_fast), corr_dim(beta_slow)
    if sc.get("truncate", True):                      # HF's default; gpt-oss: truncate false, unrounded bounds
        low, high = math.floor(low), math.ceil(high)
    low, high = max(low, 0), min(high, dim - 1)
    if low == high:
        high += 0.001
    ramp = ((torch.arange(dim // 2, dtype=torch.float64) - low) / (high - low)).clamp(0, 1)
    extra = 1.0 / base ** (torch.arange(0, dim, 2, dtype=torch.float64) / dim)
    keep = 1 - ramp                                   # 1: keep the original frequency (high freqs)
    return extra / factor * (1 - keep) + extra * keep


def rope_type(spec) -> str:
    sc = spec.rope_scaling or {}
    return str(sc.get("rope_type") or sc.get("type") or "default")


def rotary_dim(spec) -> int:
    return spec.qk_rope_head_dim if spec.attention == "mla" else (spec.rotary_dim or spec.head_dim)


def cos_sin_cache(spec, device="cpu", max_pos: int | None = None) -> torch.Tensor:
    """[max_pos, R] fp32: [:, :R/2] cos, [:, R/2:] sin of position * inv_freq (YaRN: times its mscale)."""
    r = rotary_dim(spec)
    base = spec.rope_theta
    kind = rope_type(spec)
    if getattr(spec, "rope_proportion", 0.0):
        # Gemma-4's full layers (HF "proportional"): R = the full head D; pair d < p D/2 turns at base^(-2d/D),
        # the others at frequency 0 (cos 1, sin 0: unrotated)
        r = spec.global_head_dim or spec.head_dim
        turn = int(spec.rope_proportion * r // 2)
        inv = torch.cat([1.0 / base ** (torch.arange(0, 2 * turn, 2, dtype=torch.float64) / r),
                         torch.zeros(r // 2 - turn, dtype=torch.float64)])
        mul = 1.0
    elif kind == "yarn":
        inv = _yarn_inv_freq(r, base, spec.rope_scaling)
        sc = spec.rope_scaling
        factor = float(sc["factor"])
        mul = yarn_mscale(factor, float(sc.get("mscale", 1.0))) / yarn_mscale(factor, float(sc.get("mscale_all_dim", 0.0)))
    else:
        inv = 1.0 / base ** (torch.arange(0, r, 2, dtype=torch.float64) / r)
        if kind == "llama3":
            inv = _llama3_inv_freq(inv, spec.rope_scaling)
        elif kind == "linear":                      # HF _compute_linear_scaling_rope_parameters: positions / factor
            inv = inv / float(spec.rope_scaling["factor"])
        mul = 1.0
    n = int(max_pos or spec.max_position_embeddings)
    ang = torch.arange(n, dtype=torch.float64)[:, None] * inv[None, :]
    return (torch.cat([ang.cos(), ang.sin()], dim=-1) * mul).float().to(device)


def local_cos_sin_cache(spec, device="cpu") -> torch.Tensor | None:
    """Gemma-3/4's sliding layers: the default rope at base rope_local_theta (None when every layer shares one
    table)."""
    if not spec.rope_local_theta:
        return None
    return cos_sin_cache(spec.replace(rope_theta=spec.rope_local_theta, rope_scaling=None, rope_proportion=0.0),
                         device=device)


def attention_scale(spec) -> float:
    """Softmax scale: 1/sqrt(qk head dim) (Gemma: 1/sqrt(query_pre_attn_scalar)); MLA with YaRN also multiplies by
    mscale(all_dim)^2."""
    if spec.query_pre_attn_scalar:
        return spec.query_pre_attn_scalar ** -0.5
    if spec.attention != "mla":
        return spec.head_dim ** -0.5
    scale = (spec.qk_nope_head_dim + spec.qk_rope_head_dim) ** -0.5
    sc = spec.rope_scaling or {}
    if rope_type(spec) == "yarn" and sc.get("mscale_all_dim"):
        m = yarn_mscale(float(sc["factor"]), float(sc["mscale_all_dim"]))
        scale *= m * m
    return scale
