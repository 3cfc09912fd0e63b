"""A Gated DeltaNet (linear attention) layer of Qwen3.5, over the registry's ops (math and sources in
``ops/linear_attention.py``; the layer is HF transformers' ``Qwen3_5MoeGatedDeltaNet``, Apache-2.0):

  [qkv | z | b | a] = in_proj(rms_norm(x))           one projection, fused with the input norm
  qkv  = silu(causal_conv1d(qkv, conv state))         [T, C], C = 2 Hk Dk + Hv Dv; conv state: the last K-1 inputs
  q, k = qkv[:Hk Dk], qkv[Hk Dk:2 Hk Dk] -> [T, Hk, Dk];  v -> [T, Hv, Dv]
  g, beta = -exp(A_log) softplus(a + dt_bias), sigmoid(b)
  o, state = gated_delta_decode / gated_delta_prefill(q, k, v, g, beta, state)   (state [B, Hv, Dk, Dv] fp32)
  out  = o_proj(gated_rms_norm(o, z, w))
The layer reads each sequence's states from ``cache.state`` / ``cache.conv`` and writes the new ones to
``cache.state_next`` / ``cache.conv_next`` (``KVCache.commit_states`` advances them), so a step can be
replayed. Per decode token and layer: weights H (C + Hv Dv + 2 Hv) + Hv Dv H, the state read and written
once (2 Hv Dk Dv x 4 bytes): constant in the context length.
"""

from __future__ import annotations

import torch

from persistent_engine.ops.registry import call


class GatedDeltaNet:
    def __init__(self, spec, params: dict[str, torch.Tensor], prefix: str, index: int):
        self.index, self.eps = index, spec.rms_norm_eps
        self.hk, self.hv, self.dk, self.dv = (spec.linear_num_k_heads, spec.linear_num_v_heads, spec.linear_k_dim,
                                              spec.linear_v_dim)
        self.conv_dim = spec.linear_conv_dim
        self.in_w, self.conv_w = params[prefix + "lin_in_w"], params[prefix + "conv_w"]
        self.a_log, self.dt_bias = params[prefix + "A_log"], params[prefix + "dt_bias"]
        self.norm_w, self.o_w = params[prefix + "lin_norm"], params[prefix + "o_w"]
        # the input projection, fused by the layer with the norm before it (add_rms_norm_linear)
        self.fused_input = (self.in_w, None)

    def __call__(self, proj: torch.Tensor, wl, _k=None, _v=None) -> torch.Tensor:
        """proj [T, C + Hv Dv + 2 Hv] (the normed hidden state projected by ``fused_input``) -> [T, H]."""
        t, vd = proj.shape[0], self.hv * self.dv
        mixed, z, b, a = proj.split([self.conv_dim, vd, self.hv, self.hv], dim=-1)
        cache, i = wl.cache, self.index
        if wl.phase == "decode":
            x, conv = call("causal_conv1d_decode", mixed, cache.conv[i], self.conv_w)
        else:
            x, conv = call("causal_conv1d_prefill", mixed, cache.conv[i], self.conv_w, wl.cu_seqlens_q)
        kd = self.hk * self.dk
        q, k, v = x.split([kd, kd, vd], dim=-1)
        q, k, v = q.view(t, self.hk, self.dk), k.view(t, self.hk, self.dk), v.view(t, self.hv, self.dv)
        g, beta = call("gdn_gating", a, b, self.a_log, self.dt_bias)
        if wl.phase == "decode":
            o, state = call("gated_delta_decode", q, k, v, g, beta, cache.state[i])
        else:
            o, state = call("gated_delta_prefill", q, k, v, g, beta, cache.state[i], wl.cu_seqlens_q)
        cache.state_next[i].copy_(state)
        cache.conv_next[i].copy_(conv)
        o = call("gated_rms_norm", o, z.reshape(t, self.hv, self.dv), self.norm_w, self.eps)
        return call("linear", o.reshape(t, vd), self.o_w, None)
