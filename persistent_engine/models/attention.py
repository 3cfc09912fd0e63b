"""GQA self-attention of one layer (Llama, Qwen3, MiniMax-M2, GLM-4.x): fused qkv projection (+ bias),
QK-norm (per head, or per layer over all heads as MiniMax does), partial neox rotary, K/V written
into the paged cache at the workload's slots, paged attention, output projection.

The qkv projection is fused with the norm before it. Without QK-norm (Llama-style) the rotary is fused
too: the layer runs ``add_rms_norm_qkv_rotary`` with ``fused_input`` (qkv weight, bias) and
``fused_rotary`` (cos/sin cache, rotary_dim, Hq, Hk) and passes the rotated (q, k, v) to ``__call__``.
With QK-norm (which sits between the projection and the rotary) the layer runs ``add_rms_norm_linear``
and passes qkv[T, (Hq + 2 Hk) Dh]. The q/k/v split is not copied: q is a [T, Hq, Dh] view with row
stride (Hq + 2 Hk) Dh, and rotary_embedding and write_kv take such strided views.

Layers with a sliding window (``spec.layer_window``) or attention sinks run ``attention_decode_window`` /
``attention_prefill_window`` (ops/window.py) instead; Gemma-2's soft-capped scores ``attention_decode_softcap`` /
``attention_prefill_softcap`` (ops/gemma.py).

MiMo-V2-Flash: V heads of Dv < Dh (qkv[T, (Hq + Hk) Dh + Hk Dv], the rotary not fused: the fused op splits V at
Dh), the layer's own Hk (``spec.layer_kv_heads``), V times ``spec.value_scale`` before the cache write, sinks on the
layers whose params hold them (``spec.layer_sinks``).

Per decode token: reads (Hq + 2 Hk) Dh H + Hq Dh H weights and 2 Hk Dh elements per cached token (Dv for V's).
"""

from __future__ import annotations

import torch

from persistent_engine.models.kv_cache import write_kv
from persistent_engine.ops.fused import split_qkv
from persistent_engine.ops.registry import call


class GQAAttention:
    def __init__(self, spec, params: dict[str, torch.Tensor], prefix: str, cos_sin: torch.Tensor, scale: float):
        layer = int(prefix.split(".")[1])                   # prefix "layers.{i}."
        self.hq, self.hk, self.dh = spec.num_heads, spec.layer_kv_heads(layer), spec.head_dim
        self.dv, self.v_scale = spec.gqa_v_head_dim, spec.value_scale      # MiMo-V2-Flash: Dv < Dh, V x 0.707
        self.rotary_dim = spec.rotary_dim or spec.head_dim
        self.qk_norm, self.eps = spec.qk_norm, spec.rms_norm_eps
        self.cos_sin, self.scale = cos_sin, scale
        self.qkv_w, self.qkv_b = params[prefix + "qkv_w"], params.get(prefix + "qkv_b")
        self.q_norm, self.k_norm = params.get(prefix + "q_norm"), params.get(prefix + "k_norm")
        self.o_w, self.o_b = params[prefix + "o_w"], params.get(prefix + "o_b")      # o_b: gpt-oss
        self.window, self.sinks = spec.layer_window(layer), params.get(prefix + "sinks")
        self.softcap = spec.attn_softcap                    # Gemma-2: tanh(s / c) * c on every score (0: none)
        # the input projection, fused by the layer with the norm before it (add_rms_norm_linear)
        self.fused_input = (self.qkv_w, self.qkv_b)
        # without QK-norm the rotary is fused as well (add_rms_norm_qkv_rotary's trailing arguments; its split
        # takes V heads of Dh, so not with a narrower Dv)
        fuse = self.qk_norm == "none" and self.dv == self.dh
        self.fused_rotary = (cos_sin, self.rotary_dim, self.hq, self.hk) if fuse else None

    def __call__(self, a, wl, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
        """``a``: the rotated (q[T, Hq, Dh], k[T, Hk, Dh], v[T, Hk, Dh]) of add_rms_norm_qkv_rotary, or
        qkv[T, (Hq + 2 Hk) Dh] (the normed hidden state projected by ``fused_input``; QK-norm models)."""
        q, k, v = a if isinstance(a, tuple) else self._qk_norm_rotary(a, wl)
        t, hq = q.shape[0], self.hq
        if self.v_scale != 1.0:                     # MiMo-V2-Flash: V times attention_value_scale before the cache
            v = v * self.v_scale
        write_kv(k_cache, wl.slot_mapping, k)                                    # same slots on every run
        write_kv(v_cache, wl.slot_mapping, v)
        o = self.attend(q, wl, k_cache, v_cache)                                 # [T, Hq, Dv]
        return call("linear", o.reshape(t, hq * self.dv), self.o_w, self.o_b)

    def attend(self, q: torch.Tensor, wl, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
        """Paged attention of the step's queries [T, Hq, Dh] over the cache -> [T, Hq, Dh]."""
        if self.softcap:                                    # soft-capped scores (ops/gemma.py), windowed or not
            if wl.phase == "decode":
                return call("attention_decode_softcap", q, k_cache, v_cache, wl.block_tables, wl.context_lens,
                            self.scale, self.window, self.softcap)
            return call("attention_prefill_softcap", q, k_cache, v_cache, wl.block_tables, wl.cu_seqlens_q,
                        wl.context_lens, self.scale, self.window, self.softcap)
        if self.window or self.sinks is not None:           # sliding window and/or attention sinks
            if wl.phase == "decode":
                return call("attention_decode_window", q, k_cache, v_cache, wl.block_tables, wl.context_lens,
                            self.scale, self.window, self.sinks)
            return call("attention_prefill_window", q, k_cache, v_cache, wl.block_tables, wl.cu_seqlens_q,
                        wl.context_lens, self.scale, self.window, self.sinks)
        if wl.phase == "decode":
            return call("attention_decode", q, k_cache, v_cache, wl.block_tables, wl.context_lens, self.scale)
        return call("attention_prefill", q, k_cache, v_cache, wl.block_tables, wl.cu_seqlens_q, wl.context_lens,
                    self.scale)

    def _qk_norm_rotary(self, qkv: torch.Tensor, wl):
        """qkv[T, (Hq + 2 Hk) Dh] -> rotated q, k and v (QK-norm, when set, between the split and the rotary)."""
        t, hq, hk, dh = qkv.shape[0], self.hq, self.hk, self.dh
        if self.qk_norm == "per_layer":                    # over all heads: on the [T, Hq Dh] / [T, Hk Dh] views
            q, k, v = qkv.split([hq * dh, hk * dh, hk * dh], dim=-1)
            q, k = call("rms_norm", q, self.q_norm, self.eps), call("rms_norm", k, self.k_norm, self.eps)
            q, k, v = q.view(t, hq, dh), k.view(t, hk, dh), v.view(t, hk, dh)
        elif self.dv != dh:                                # MiMo-V2-Flash: qkv[T, (Hq + Hk) Dh + Hk Dv]
            q, k, v = qkv.split([hq * dh, hk * dh, hk * self.dv], dim=-1)
            q, k, v = q.view(t, hq, dh), k.view(t, hk, dh), v.view(t, hk, self.dv)     # strided views, no copy
        else:
            q, k, v = split_qkv(qkv, hq, hk)                                  # strided views, no copy
            if self.qk_norm == "per_head":
                q, k = call("rms_norm", q, self.q_norm, self.eps), call("rms_norm", k, self.k_norm, self.eps)
        q, k = call("rotary_embedding", wl.positions, q, k, self.cos_sin, self.rotary_dim)
        return q, k, v
