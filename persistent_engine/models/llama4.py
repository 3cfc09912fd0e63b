"""Llama-4's blocks beyond the generic decoder (HF transformers ``modeling_llama4.py``, Apache-2.0):

  attention  ``Llama4Attention``: GQA; rope layers rotate q and k (the checkpoint's interleaved pairs are permuted
             to halves on load, models/weights.py), then L2-normalise them (``Llama4TextL2Norm``: a weightless RMS
             norm, ``use_qk_norm``) and attend within chunks of ``attention_chunk_size`` tokens
             (``attention_decode_chunked`` / ``_prefill_chunked``); NoPE layers skip the rotary, scale q by the
             position temperature (``attn_temperature``) and attend every cached token.
  MoE        ``InputScaledMoE``: top-k of the router logits, weight sigmoid(logit) (``moe_route`` sigmoid without
             renormalisation), the weight scaling each expert's input (``moe_experts_scaled_input``), plus a shared
             SwiGLU expert (``Llama4TextMoe``).
``blocks(spec, ...)`` builds a layer's (attention, mlp) pair.
"""

from __future__ import annotations

import torch

from persistent_engine.models.attention import GQAAttention
from persistent_engine.models.moe import DenseMLP, MoEMLP, swiglu
from persistent_engine.ops.fused import split_qkv
from persistent_engine.ops.registry import call


class Llama4Attention(GQAAttention):
    def __init__(self, spec, params: dict[str, torch.Tensor], prefix: str, cos_sin: torch.Tensor, scale: float,
                 index: int):
        super().__init__(spec, params, prefix, cos_sin, scale)
        self.rope = spec.uses_rope(index)
        self.l2 = spec.qk_l2_norm and self.rope
        self.ones = torch.ones(self.dh, dtype=self.qkv_w.dtype, device=self.qkv_w.device) if self.l2 else None
        self.chunk = spec.attention_chunk_size if self.rope else 0
        self.temperature = (spec.attn_temperature_floor, spec.attn_temperature_scale) \
            if spec.attn_temperature_floor and not self.rope else None
        # the fused norm + qkv + rotary path holds only for rope layers without the L2 norm
        self.fused_rotary = self.fused_rotary if self.rope and not self.l2 else None

    def _qk_norm_rotary(self, qkv: torch.Tensor, wl):
        """qkv[T, (Hq + 2 Hk) Dh] -> q, k, v: rotary then L2 norm (rope layers), or the temperature (NoPE layers)."""
        q, k, v = split_qkv(qkv, self.hq, self.hk)                            # strided views, no copy
        if self.rope:
            q, k = call("rotary_embedding", wl.positions, q, k, self.cos_sin, self.rotary_dim)
        if self.l2:
            q, k = call("rms_norm", q, self.ones, self.eps), call("rms_norm", k, self.ones, self.eps)
        if self.temperature is not None:
            q = call("attn_temperature", q, wl.positions, *self.temperature)
        return q, k, v

    def attend(self, q: torch.Tensor, wl, k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
        if not self.chunk:
            return super().attend(q, wl, k_cache, v_cache)
        if wl.phase == "decode":
            return call("attention_decode_chunked", q, k_cache, v_cache, wl.block_tables, wl.context_lens, self.scale,
                        self.chunk)
        return call("attention_prefill_chunked", q, k_cache, v_cache, wl.block_tables, wl.cu_seqlens_q,
                    wl.context_lens, self.scale, self.chunk)


class InputScaledMoE(MoEMLP):
    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        weights, ids = self.route(h)                                             # [T, k] sigmoid(logit), top-k
        return call("moe_experts_scaled_input", h, self.w13, self.w2, weights, ids) + swiglu(h, *self.shared)


def blocks(spec, params: dict[str, torch.Tensor], prefix: str, cos_sin: torch.Tensor, scale: float, index: int):
    """(attention, mlp) of Llama-4 layer ``index``."""
    attn = Llama4Attention(spec, params, prefix, cos_sin, scale, index)
    if spec.layer_kind(index) == "dense":
        return attn, DenseMLP(spec, params, prefix)
    return attn, InputScaledMoE(spec, params, prefix)
