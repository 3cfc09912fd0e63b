"""Kimi-Linear / Kimi-K3 (family ``kimi_linear``): Kimi delta attention (KDA) interleaved with MLA, latent MoE
with SiTU experts, attention residuals. Every op through the registry. Sources: Moonshot's
``modeling_kimi_linear.py`` (KimiDeltaAttention, KimiMLAAttention, the K3 MoE block, ``_apply_attn_res``), vLLM
``kimi_linear.py`` / ``kda.py``, SGLang's Kimi-K3 model (KimiK3DecoderLayer's attention-residual forward), FLA
``fla/ops/kda``; the math of each op in ``ops/kda.py``.

KDA layer, h [T, hidden] (the normed block input):
  [qkv | gate | b | f_a] = linear(h, kda_in_w)             one projection: [3 H Dk | H Dv (or Dk) | H | Dk]
  qkv, conv'   = short_conv_decode / short_conv_prefill(qkv, conv state)      silu(causal conv, width W)
  f            = linear(f_a, f_b)  [T, H, Dk];  gate = g_b(gate) unless full rank
  o, state'    = kda_decode / kda_prefill(q, k, v, f, b, A_log, dt_bias, lower_bound, state)
  out          = linear(rms_norm_gated(o, gate, o_norm), o_w)
MLA layer: DeepSeek-V3's absorbed MLA (``mla.py``) without rotary (``mla_use_nope``), its output times
sigmoid(g_proj(h)) before o_proj (``sigmoid_mul``). MoE layer: router and shared experts on h; routed experts on
linear(h, lat_down_w) [T, Lm], then rms_norm (latent_moe_use_norm) and linear(., lat_up_w).
Attention residuals (``attn_res_block_size`` B): the stream is the running sum of the current block's outputs
("prefix") plus the summaries of finished blocks; before attention and before the MLP each layer mixes them with
``attn_res``; layer i with i % B == 0 starts a block (stores the prefix as a summary; the prefix restarts at its
attention output). A slice counts the blocks its own layers wrote (the full model: ceil(i / B) before layer i).
Recurrent states live in the KV cache (``kv_cache.py``): steps read ``state`` / ``conv`` and write ``*_next``.
"""

from __future__ import annotations

import torch

from persistent_engine.models.decoder import Decoder
from persistent_engine.models.kv_cache import write_kv
from persistent_engine.models.mla import MLAAttention
from persistent_engine.models.moe import MoEMLP
from persistent_engine.models.rope import attention_scale, cos_sin_cache
from persistent_engine.ops.registry import call

__all__ = ["KimiDecoder", "kimi_param_specs"]


def kimi_param_specs(spec, layers: list[int]) -> dict[str, tuple[tuple[int, ...], str]]:
    """Internal name -> (shape, init kind): MLA / dense / MoE tensors as DeepSeek-V3's (``weights.param_specs``),
    KDA layers' own, the latent MoE's routed experts at the latent width, attention-residual weights."""
    from persistent_engine.models.weights import param_specs

    h, n, d = spec.hidden_size, spec.kda_num_heads, spec.kda_head_dim
    out = param_specs(spec.replace(family="deepseek_v3", kda_layers=()), layers)
    for i in layers:
        p = f"layers.{i}."
        if spec.is_kda_layer(i):
            for name in [k for k in out if k.startswith(p) and k[len(p):] in MLA_NAMES]:
                del out[name]
            gate = n * d if spec.kda_full_rank_gate else d
            out[p + "kda_in_w"] = ((3 * n * d + gate + n + d, h), "linear")
            out[p + "kda_conv_w"] = ((3 * n * d, spec.kda_conv_size), "linear")
            out[p + "kda_fb_w"] = ((n * d, d), "linear")
            if not spec.kda_full_rank_gate:
                out[p + "kda_gb_w"] = ((n * d, d), "linear")
            out[p + "kda_a_log"], out[p + "kda_dt_bias"] = ((n,), "router_bias"), ((n * d,), "router_bias")
            out[p + "kda_o_norm"], out[p + "o_w"] = ((d,), "norm"), ((h, n * d), "linear")
        elif spec.mla_output_gate:
            out[p + "g_w"] = ((spec.num_heads * spec.v_head_dim, h), "linear")
        if spec.layer_kind(i) == "moe" and spec.latent_moe_size:
            lat, e, im = spec.latent_moe_size, spec.num_experts, spec.moe_intermediate_size
            out[p + "w13"], out[p + "w2"] = ((e, 2 * im, lat), "linear"), ((e, lat, im), "linear")
            out[p + "lat_down_w"], out[p + "lat_up_w"] = ((lat, h), "linear"), ((h, lat), "linear")
            if spec.latent_moe_norm:
                out[p + "lat_norm"] = ((lat,), "norm")
        if spec.attn_res_block_size:
            for side in ("attn", "mlp"):
                out[p + f"{side}_res_norm"], out[p + f"{side}_res_proj"] = ((h,), "norm"), ((h,), "linear")
    if spec.attn_res_block_size:
        out["out_res_norm"], out["out_res_proj"] = ((h,), "norm"), ((h,), "linear")
    return out


MLA_NAMES = ("q_a_w", "q_a_norm", "q_b_w", "q_w", "kv_a_w", "kv_a_norm", "w_uk", "w_uv", "o_w")


class KDAAttention:
    def __init__(self, spec, params: dict[str, torch.Tensor], prefix: str, index: int):
        n, d = spec.kda_num_heads, spec.kda_head_dim
        self.index, self.n, self.d, self.eps = index, n, d, spec.rms_norm_eps
        self.full_gate = spec.kda_full_rank_gate
        self.sizes = [3 * n * d, n * d if self.full_gate else d, n, d]
        self.in_w, self.conv_w = params[prefix + "kda_in_w"], params[prefix + "kda_conv_w"]
        self.fb_w, self.gb_w = params[prefix + "kda_fb_w"], params.get(prefix + "kda_gb_w")
        self.a_log, self.dt_bias = params[prefix + "kda_a_log"], params[prefix + "kda_dt_bias"]
        self.o_norm, self.o_w = params[prefix + "kda_o_norm"], params[prefix + "o_w"]
        self.lower_bound = spec.kda_gate_lower_bound

    def __call__(self, h: torch.Tensor, wl) -> torch.Tensor:
        t, n, d, i, cache = h.shape[0], self.n, self.d, self.index, wl.cache
        qkv, gate, b, fa = (x.contiguous() for x in call("linear", h, self.in_w, None).split(self.sizes, -1))
        if wl.phase == "decode":
            qkv, conv = call("short_conv_decode", qkv, cache.conv[i], self.conv_w)
        else:
            qkv, conv = call("short_conv_prefill", qkv, cache.conv[i], self.conv_w, wl.cu_seqlens_q)
        cache.conv_next[i].copy_(conv)
        q, k, v = (x.contiguous() for x in qkv.view(t, 3, n, d).unbind(1))
        f = call("linear", fa, self.fb_w, None).view(t, n, d)
        if not self.full_gate:
            gate = call("linear", gate, self.gb_w, None)
        args = (q, k, v, f, b, self.a_log, self.dt_bias, self.lower_bound, cache.state[i])
        if wl.phase == "decode":
            o, state = call("kda_decode", *args)
        else:
            o, state = call("kda_prefill", *args, wl.cu_seqlens_q)
        cache.state_next[i].copy_(state)
        o = call("rms_norm_gated", o, gate.view(t, n, d), self.o_norm, self.eps)
        return call("linear", o.reshape(t, n * d), self.o_w, None)


class GatedMLA(MLAAttention):
    """MLA without rotary (the "rope" dims are plain shared key dims), with the optional output gate."""

    def __init__(self, spec, params: dict[str, torch.Tensor], prefix: str, cos_sin: torch.Tensor, scale: float):
        super().__init__(spec, params, prefix, cos_sin, scale)
        self.g_w = params.get(prefix + "g_w")

    def __call__(self, h: torch.Tensor, wl) -> torch.Tensor:
        cache = wl.cache.k[self.index]
        q_abs, q_pe = self.project_nope(h, wl, cache)
        if wl.phase == "decode":
            o = call("mla_decode", q_abs, q_pe, cache, wl.block_tables, wl.context_lens, self.scale)
        else:
            o = call("mla_prefill", q_abs, q_pe, cache, wl.block_tables, wl.cu_seqlens_q, wl.context_lens, self.scale)
        o = call("mla_v_up", o, self.w_uv).reshape(h.shape[0], self.h * self.dv)
        if self.g_w is not None:
            o = call("sigmoid_mul", o, call("linear", h, self.g_w, None))
        return call("linear", o, self.o_w, None)

    def project_nope(self, h: torch.Tensor, wl, cache: torch.Tensor):
        """MLAAttention.project without the rotary: (q_abs[T, H, L], q_pe[T, H, R]); writes [c | k_pe]."""
        t = h.shape[0]
        if self.q_a_w is not None:
            q = call("linear", call("rms_norm", call("linear", h, self.q_a_w, None), self.q_a_norm, self.eps),
                     self.q_b_w, None)
        else:
            q = call("linear", h, self.q_b_w, None)
        q = q.view(t, self.h, self.dn + self.r)
        kv = call("linear", h, self.kv_a_w, None)                                    # [T, L + R]
        c = call("rms_norm", kv[:, : self.lat].contiguous(), self.kv_a_norm, self.eps)
        write_kv(cache, wl.slot_mapping, torch.cat([c, kv[:, self.lat:]], -1))          # [T, L + R]
        return call("mla_q_absorb", q[..., : self.dn].contiguous(), self.w_uk), q[..., self.dn:].contiguous()


def _act_down(gate_up: torch.Tensor, down_w: torch.Tensor, situ: tuple | None) -> torch.Tensor:
    if situ is None:
        return call("silu_mul_linear", gate_up, down_w)
    return call("linear", call("situ_and_mul", gate_up, *situ), down_w, None)


class SituMLP:
    def __init__(self, spec, params: dict[str, torch.Tensor], prefix: str):
        self.gate_up_w, self.down_w = params[prefix + "gate_up_w"], params[prefix + "down_w"]
        self.situ = (spec.situ_beta, spec.situ_linear_beta) if spec.mlp_act == "situ" else None

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        return _act_down(call("linear", h, self.gate_up_w, None), self.down_w, self.situ)


class LatentMoE(MoEMLP):
    """Router and shared experts on h; routed experts in the latent (when set), then its norm and up projection."""

    def __init__(self, spec, params: dict[str, torch.Tensor], prefix: str):
        super().__init__(spec, params, prefix)
        self.situ = (spec.situ_beta, spec.situ_linear_beta) if spec.mlp_act == "situ" else None
        self.down, self.up = params.get(prefix + "lat_down_w"), params.get(prefix + "lat_up_w")
        self.lat_norm, self.eps = params.get(prefix + "lat_norm"), spec.rms_norm_eps

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        weights, ids = self.route(h)
        x = h if self.down is None else call("linear", h, self.down, None)              # [T, Lm]
        if self.situ is None:
            y = call("moe_experts", x, self.w13, self.w2, weights, ids)
        else:
            y = call("moe_experts_situ", x, self.w13, self.w2, weights, ids, *self.situ)
        if self.lat_norm is not None:
            y = call("rms_norm", y, self.lat_norm, self.eps)
        if self.up is not None:
            y = call("linear", y, self.up, None)
        if self.shared is not None:
            y = y + _act_down(call("linear", h, self.shared[0], None), self.shared[1], self.situ)
        return y


class KimiLayer:
    def __init__(self, spec, index: int, params: dict, cos_sin: torch.Tensor, scale: float):
        p = f"layers.{index}."
        self.index, self.kind, self.kda = index, spec.layer_kind(index), spec.is_kda_layer(index)
        self.input_norm, self.post_norm = params[p + "input_norm"], params[p + "post_norm"]
        if self.kda:
            self.attn = KDAAttention(spec, params, p, index)
        else:
            self.attn = GatedMLA(spec, params, p, cos_sin, scale)
            self.attn.index = index
        self.mlp = SituMLP(spec, params, p) if self.kind == "dense" else LatentMoE(spec, params, p)
        self.res = tuple(params.get(p + n) for n in ("attn_res_proj", "attn_res_norm", "mlp_res_proj", "mlp_res_norm"))


class KimiDecoder(Decoder):
    def __init__(self, spec, layers: list[int], params: dict[str, torch.Tensor], device, dtype):
        self.spec, self.layers, self.params = spec, list(layers), params
        self.device, self.dtype = torch.device(device), dtype
        self.cos_sin = cos_sin_cache(spec, device=device)       # unused by NoPE MLA; sets max_positions
        self.scale = attention_scale(spec)
        self.eps = spec.rms_norm_eps
        self.embed, self.final_norm = params["embed"], params["final_norm"]
        self.lm_head_w = params.get("lm_head", self.embed)
        self.selections: dict[int, torch.Tensor] = {}
        self.blocks = [KimiLayer(spec, i, params, self.cos_sin, self.scale) for i in self.layers]
        self.block_size = spec.attn_res_block_size

    @torch.no_grad()
    def hidden(self, wl) -> torch.Tensor:
        x = call("embedding", wl.token_ids, self.embed)                           # [T, H]
        if not self.block_size:
            return self._plain(x, wl)
        starts = sum(1 for i in self.layers if i % self.block_size == 0)
        summaries = x.new_empty(x.shape[0], max(starts, 1), x.shape[1])       # [T, NB, H] finished blocks
        nb, prefix = 0, x
        for layer in self.blocks:
            a_proj, a_norm, m_proj, m_norm = layer.res
            a = call("attn_res", prefix, summaries[:, :nb], a_proj, a_norm, self.eps) if nb else prefix
            a = call("rms_norm", a, layer.input_norm, self.eps)
            start = layer.index % self.block_size == 0
            if start:
                summaries[:, nb] = prefix
                nb += 1
            out = layer.attn(a, wl)
            prefix = out if start else prefix + out
            m = call("attn_res", prefix, summaries[:, :nb], m_proj, m_norm, self.eps) if nb else prefix
            prefix = prefix + layer.mlp(call("rms_norm", m, layer.post_norm, self.eps))
        if nb:
            prefix = call("attn_res", prefix, summaries[:, :nb], self.params["out_res_proj"],
                          self.params["out_res_norm"], self.eps)
        return call("rms_norm", prefix, self.final_norm, self.eps)

    def _plain(self, x: torch.Tensor, wl) -> torch.Tensor:
        """Kimi-Linear without attention residuals: the pre-norm residual stream."""
        residual = torch.zeros_like(x)
        for layer in self.blocks:
            a, residual = call("fused_add_rms_norm", x, residual, layer.input_norm, self.eps)
            x = layer.attn(a, wl)
            a, residual = call("fused_add_rms_norm", x, residual, layer.post_norm, self.eps)
            x = layer.mlp(a)
        return call("fused_add_rms_norm", x, residual, self.final_norm, self.eps)[0]
