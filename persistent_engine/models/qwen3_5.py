"""Qwen3.5's blocks beyond the generic decoder (HF transformers ``modeling_qwen3_5_moe.py``, Apache-2.0):

  linear layers  ``GatedDeltaNet`` (models/gated_delta.py)
  full layers    ``GatedAttention``: GQA with per-head QK-norm and partial rotary whose q projection also
                 yields a per-head output gate (HF ``Qwen3_5MoeAttention``: q_proj rows [H, 2 Dh] = query |
                 gate); out = o_proj(attn * sigmoid(gate)). Internally the gate rows follow q | k | v in
                 ``qkv_w``, so one projection (fused with the input norm) yields all four.
  MoE            ``GatedSharedMoE``: softmax top-k (renormalised) experts + shared expert * sigmoid(shared_gate(h))
                 (HF ``Qwen3_5MoeSparseMoeBlock``).
``blocks(spec, ...)`` builds a layer's (attention, mlp) pair.
"""

from __future__ import annotations

import torch

from persistent_engine.models.attention import GQAAttention
from persistent_engine.models.gated_delta import GatedDeltaNet
from persistent_engine.models.kv_cache import write_kv
from persistent_engine.models.moe import DenseMLP, MoEMLP, swiglu
from persistent_engine.ops.registry import call


class GatedAttention(GQAAttention):
    def __init__(self, spec, params: dict[str, torch.Tensor], prefix: str, cos_sin: torch.Tensor, scale: float):
        super().__init__(spec, params, prefix, cos_sin, scale)
        self.qkv_rows = (self.hq + 2 * self.hk) * self.dh

    def __call__(self, a, wl, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
        """a: [T, (2 Hq + 2 Hk) Dh] = the normed hidden state projected to q | k | v | gate."""
        t = a.shape[0]
        q, k, v = self._qk_norm_rotary(a[:, : self.qkv_rows], wl)
        write_kv(k_cache, wl.slot_mapping, k)
        write_kv(v_cache, wl.slot_mapping, v)
        o = self.attend(q, wl, k_cache, v_cache).reshape(t, self.hq * self.dh)
        return call("linear", call("sigmoid_gate", o, a[:, self.qkv_rows:]), self.o_w, None)


class GatedSharedMoE(MoEMLP):
    def __init__(self, spec, params: dict[str, torch.Tensor], prefix: str):
        super().__init__(spec, params, prefix)
        self.shared_gate_w = params[prefix + "shared_gate_w"]

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        weights, ids = self.route(h)
        out = call("moe_experts", h, self.w13, self.w2, weights, ids)
        shared = swiglu(h, *self.shared)
        return out + call("sigmoid_gate", shared, call("linear", h, self.shared_gate_w, None))


def blocks(spec, params: dict[str, torch.Tensor], prefix: str, cos_sin: torch.Tensor, scale: float, index: int):
    """(attention, mlp) of Qwen3.5 layer ``index``."""
    if spec.is_linear(index):
        attn = GatedDeltaNet(spec, params, prefix, index)
    else:
        attn = (GatedAttention if spec.attn_output_gate else GQAAttention)(spec, params, prefix, cos_sin, scale)
    if spec.layer_kind(index) == "dense":
        return attn, DenseMLP(spec, params, prefix)
    return attn, (GatedSharedMoE if spec.shared_expert_gate else MoEMLP)(spec, params, prefix)
