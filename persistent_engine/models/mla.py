"""Multi-head latent attention of one layer (DeepSeek-V3, Kimi-K2), absorbed for decode and prefill.

  q      = q_b(rms_norm(q_a(h)))              [T, H, Dn + R]    (or q(h) without q LoRA)
  c, kpe = kv_a(h) split [L | R]; c = rms_norm(c)
  rotary on q_pe and kpe (one shared key head); cache row = [c | kpe]   (L + R elements per token)
  q_abs  = mla_q_absorb(q_nope, W_UK)         [T, H, L]
  o_lat  = mla_decode / mla_prefill(q_abs, q_pe, cache)  [T, H, L]
  out    = o(mla_v_up(o_lat, W_UV))
Per decode token the attention reads (L + R) * 2 bytes per cached token (576 elements for DeepSeek-V3).
"""

from __future__ import annotations

import torch

from persistent_engine.models.kv_cache import write_kv
from persistent_engine.ops.registry import call


class MLAAttention:
    def __init__(self, spec, params: dict[str, torch.Tensor], prefix: str, cos_sin: torch.Tensor, scale: float):
        self.h, self.dn, self.r = spec.num_heads, spec.qk_nope_head_dim, spec.qk_rope_head_dim
        self.lat, self.dv, self.eps = spec.kv_lora_rank, spec.v_head_dim, spec.rms_norm_eps
        self.cos_sin, self.scale = cos_sin, scale
        self.q_a_w, self.q_a_norm = params.get(prefix + "q_a_w"), params.get(prefix + "q_a_norm")
        self.q_b_w = params.get(prefix + "q_b_w", params.get(prefix + "q_w"))
        self.kv_a_w, self.kv_a_norm = params[prefix + "kv_a_w"], params[prefix + "kv_a_norm"]
        self.w_uk, self.w_uv, self.o_w = params[prefix + "w_uk"], params[prefix + "w_uv"], params[prefix + "o_w"]

    def __call__(self, h: torch.Tensor, wl, cache: torch.Tensor, _unused=None) -> torch.Tensor:
        q_abs, q_pe, _ = self.project(h, wl, cache)
        if wl.phase == "decode":
            o = call("mla_decode", q_abs, q_pe, cache, wl.block_tables, wl.context_lens, self.scale)
        else:
            o = call("mla_prefill", q_abs, q_pe, cache, wl.block_tables, wl.cu_seqlens_q, wl.context_lens, self.scale)
        return self.output(o)

    def project(self, h: torch.Tensor, wl, cache: torch.Tensor):
        """(q_abs[T, H, L], rotated q_pe[T, H, R], the q latent c_q[T, Lq] or None); writes the step's
        cache rows [c | k_pe]."""
        t = h.shape[0]
        cq = None
        if self.q_a_w is not None:
            cq = call("rms_norm", call("linear", h, self.q_a_w, None), self.q_a_norm, self.eps)
            q = call("linear", cq, self.q_b_w, None)
        else:
            q = call("linear", h, self.q_b_w, None)
        q = q.view(t, self.h, self.dn + self.r)
        q_nope, q_pe = q[..., : self.dn].contiguous(), q[..., self.dn:].contiguous()
        kv = call("linear", h, self.kv_a_w, None)                                  # [T, L + R]
        c = call("rms_norm", kv[:, : self.lat].contiguous(), self.kv_a_norm, self.eps)
        k_pe = kv[:, self.lat:].contiguous().view(t, 1, self.r)
        q_pe, k_pe = call("rotary_embedding", wl.positions, q_pe, k_pe, self.cos_sin, self.r)
        write_kv(cache, wl.slot_mapping, torch.cat([c, k_pe.view(t, self.r)], -1))      # [T, L + R]
        return call("mla_q_absorb", q_nope, self.w_uk), q_pe, cq                  # q_abs [T, H, L]

    def output(self, o_latent: torch.Tensor) -> torch.Tensor:
        """[T, H, L] attention output in the latent -> [T, hidden]."""
        o = call("mla_v_up", o_latent, self.w_uv)                                 # [T, H, Dv]
        return call("linear", o.reshape(o.shape[0], self.h * self.dv), self.o_w, None)
