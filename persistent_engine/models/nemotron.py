"""Nemotron-H (family ``nemotron_h``: NVIDIA Nemotron-3 Nano / Super): one block per layer, ``x + mixer(rms_norm(x))``,
the block of layer i given by ``spec.hybrid_pattern[i]`` (models/nemotron_config.py). Every op through the registry.
Sources: HF transformers ``modeling_nemotron_h.py`` (NemotronHBlock, NemotronHMamba2Mixer, NemotronHAttention,
NemotronHMLP, NemotronHMoE), vLLM ``nemotron_h.py`` and its ``MambaMixer2`` (Apache-2.0).

Mamba-2 layer (M), a [T, H] (the normed block input, projected with the norm: add_rms_norm_linear):
  [z | xBC | dt] = in_proj(a)                   [T, I | I + 2 G N | Hm],  I = Hm P
  xBC, conv'     = mamba_conv_decode / _prefill(xBC, conv state, conv_w, conv_b)     silu(causal conv + bias)
  x, B, C        = xBC -> [T, Hm, P], [T, G, N], [T, G, N]
  y, state'      = ssd_decode / ssd_prefill(x, dt, A_log, B, C, D, dt_bias, state)     (ops/mamba.py)
  out            = out_proj(mamba_gated_norm(y, z, norm_w, G))    rms_norm per group of y * silu(z)
Attention (*): GQA without rotary over the paged cache. MLP (-): down(relu2(up(a))). MoE (E): sigmoid grouped
top-k routing with correction bias (moe_route), relu2 experts on fc1_latent_proj(a) then fc2_latent_proj (when the
model has a latent), plus the relu2 shared expert on a.
Per decode token a Mamba layer reads and writes its fp32 state once (2 Hm P N x 4 bytes) and its conv inputs:
constant in the context length. States live in the KV cache (``kv_cache.py``): a step reads ``state`` / ``conv``
and writes ``state_next`` / ``conv_next``.
"""

from __future__ import annotations

import torch

from persistent_engine.models.attention import GQAAttention
from persistent_engine.models.decoder import Decoder, _norm_into
from persistent_engine.models.kv_cache import write_kv
from persistent_engine.models.rope import attention_scale, cos_sin_cache
from persistent_engine.ops.fused import split_qkv
from persistent_engine.ops.registry import call

__all__ = ["NemotronDecoder", "nemotron_param_specs"]


def nemotron_param_specs(spec, layers: list[int]) -> dict[str, tuple[tuple[int, ...], str]]:
    """Internal name -> (shape, init kind). Per layer ``norm`` [H] and its block's tensors:
    M: in_w [I + C + Hm, H], conv_w [C, K], conv_b [C], A_log, dt_bias, D [Hm] fp32, mamba_norm [I], out_w [H, I];
    *: qkv_w [(Hq + 2 Hk) Dh, H], o_w [H, Hq Dh];  -: up_w [I_d, H], down_w [H, I_d];
    E: router_w [E, H], router_bias [E] fp32, w1 [E, Im, L], w2 [E, L, Im] (L: the latent, else H), shared_up_w
    [Is, H], shared_down_w [H, Is], and with a latent lat_down_w [L, H], lat_up_w [H, L]."""
    h, v = spec.hidden_size, spec.vocab_size
    out: dict[str, tuple[tuple[int, ...], str]] = {"embed": ((v, h), "embed"), "final_norm": ((h,), "norm")}
    if not spec.tie_word_embeddings:
        out["lm_head"] = ((v, h), "linear")
    for i in layers:
        p, block = f"layers.{i}.", spec.layer_block(i)
        out[p + "norm"] = ((h,), "norm")
        if block == "mamba":
            c, hm, inner = spec.mamba_conv_dim, spec.mamba_num_heads, spec.mamba_inner
            out.update({p + "in_w": ((spec.mamba_in_proj_dim, h), "linear"),
                        p + "conv_w": ((c, spec.mamba_conv_kernel), "conv"), p + "conv_b": ((c,), "bias"),
                        p + "A_log": ((hm,), "a_log"), p + "dt_bias": ((hm,), "dt_bias"),
                        p + "D": ((hm,), "dt_bias"),                # fp32 ~1 (HF initialises D to ones)
                        p + "mamba_norm": ((inner,), "norm"), p + "out_w": ((h, inner), "linear")})
        elif block == "attention":
            hq, hk, dh = spec.num_heads, spec.num_kv_heads, spec.head_dim
            out[p + "qkv_w"], out[p + "o_w"] = (((hq + 2 * hk) * dh, h), "linear"), ((h, hq * dh), "linear")
        elif block == "mlp":
            out[p + "up_w"] = ((spec.intermediate_size, h), "linear")
            out[p + "down_w"] = ((h, spec.intermediate_size), "linear")
        else:
            e, im, lat = spec.num_experts, spec.moe_intermediate_size, spec.latent_moe_size or h
            si = spec.shared_intermediate_size * spec.num_shared_experts
            out.update({p + "router_w": ((e, h), "linear"), p + "router_bias": ((e,), "router_bias"),
                        p + "w1": ((e, im, lat), "linear"), p + "w2": ((e, lat, im), "linear")})
            if si:
                out[p + "shared_up_w"], out[p + "shared_down_w"] = ((si, h), "linear"), ((h, si), "linear")
            if spec.latent_moe_size:
                out[p + "lat_down_w"], out[p + "lat_up_w"] = ((lat, h), "linear"), ((h, lat), "linear")
    return out


class Mamba2Mixer:
    def __init__(self, spec, params: dict[str, torch.Tensor], p: str, index: int):
        self.index, self.eps, self.groups = index, spec.rms_norm_eps, spec.mamba_n_groups
        self.hm, self.hd, self.n = spec.mamba_num_heads, spec.mamba_head_dim, spec.ssm_state_size
        self.inner, self.conv_dim = spec.mamba_inner, spec.mamba_conv_dim
        self.conv_w, self.conv_b = params[p + "conv_w"], params[p + "conv_b"]
        self.a_log, self.dt_bias, self.d = params[p + "A_log"], params[p + "dt_bias"], params[p + "D"]
        self.norm_w, self.out_w = params[p + "mamba_norm"], params[p + "out_w"]
        self.fused_input = (params[p + "in_w"], None)      # in_proj, fused with the block's norm

    def __call__(self, proj: torch.Tensor, wl) -> torch.Tensor:
        """proj [T, I + C + Hm] (the normed block input through in_proj) -> [T, H]."""
        t, cache, i = proj.shape[0], wl.cache, self.index
        z, xbc, dt = proj.split([self.inner, self.conv_dim, self.hm], dim=-1)
        if wl.phase == "decode":
            xbc, conv = call("mamba_conv_decode", xbc.contiguous(), cache.conv[i], self.conv_w, self.conv_b)
        else:
            xbc, conv = call("mamba_conv_prefill", xbc.contiguous(), cache.conv[i], self.conv_w, self.conv_b,
                             wl.cu_seqlens_q)
        gn = self.groups * self.n
        x, b, c = xbc.split([self.inner, gn, gn], dim=-1)
        args = (x.view(t, self.hm, self.hd), dt.contiguous(), self.a_log, b.view(t, self.groups, self.n),
                c.view(t, self.groups, self.n), self.d, self.dt_bias, cache.state[i])
        if wl.phase == "decode":
            y, state = call("ssd_decode", *args)
        else:
            y, state = call("ssd_prefill", *args, wl.cu_seqlens_q)
        cache.state_next[i].copy_(state)
        cache.conv_next[i].copy_(conv)
        y = call("mamba_gated_norm", y.reshape(t, self.inner), z, self.norm_w, self.groups, self.eps)
        return call("linear", y, self.out_w, None)


class NoPEAttention(GQAAttention):
    """GQA without rotary: qkv (fused with the block's norm) split, K/V written, paged attention, o_proj."""

    def __init__(self, spec, params, p: str, cos_sin: torch.Tensor, scale: float, index: int):
        super().__init__(spec, params, p, cos_sin, scale)
        self.index, self.fused_rotary = index, None

    def __call__(self, qkv: torch.Tensor, wl) -> torch.Tensor:
        k_cache, v_cache = wl.cache.k[self.index], wl.cache.v[self.index]
        q, k, v = split_qkv(qkv, self.hq, self.hk)
        write_kv(k_cache, wl.slot_mapping, k)
        write_kv(v_cache, wl.slot_mapping, v)
        o = self.attend(q, wl, k_cache, v_cache)
        return call("linear", o.reshape(qkv.shape[0], self.hq * self.dh), self.o_w, None)


class Relu2MLP:
    def __init__(self, params, p: str):
        self.down_w = params[p + "down_w"]
        self.fused_input = (params[p + "up_w"], None)       # up_proj, fused with the block's norm

    def __call__(self, up: torch.Tensor, wl=None) -> torch.Tensor:
        return call("linear", call("relu2", up), self.down_w, None)


class Relu2MoE:
    fused_input = None                                      # the normed input feeds router, latent and shared expert

    def __init__(self, spec, params, p: str):
        self.router_w, self.router_bias = params[p + "router_w"], params[p + "router_bias"]
        self.w1, self.w2 = params[p + "w1"], params[p + "w2"]
        self.down, self.up = params.get(p + "lat_down_w"), params.get(p + "lat_up_w")
        self.shared = (params[p + "shared_up_w"], params[p + "shared_down_w"]) if p + "shared_up_w" in params else None
        self.route_args = (spec.num_experts_per_tok, spec.scoring, spec.n_group, spec.topk_group,
                           spec.norm_topk_prob, spec.routed_scaling_factor)

    def route(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = call("linear", h, self.router_w, None).float()                    # [T, E] fp32
        return call("moe_route", logits, self.router_bias, *self.route_args)

    def __call__(self, h: torch.Tensor, wl=None) -> torch.Tensor:
        weights, ids = self.route(h)
        x = h if self.down is None else call("linear", h, self.down, None)          # [T, L]
        y = call("moe_experts_relu2", x, self.w1, self.w2, weights, ids)
        if self.up is not None:
            y = call("linear", y, self.up, None)
        if self.shared is not None:
            y = y + call("linear", call("relu2", call("linear", h, self.shared[0], None)), self.shared[1], None)
        return y


class NemotronLayer:
    def __init__(self, spec, index: int, params: dict, cos_sin: torch.Tensor, scale: float):
        p, block = f"layers.{index}.", spec.layer_block(index)
        self.index, self.block, self.kind, self.norm = index, block, spec.layer_kind(index), params[p + "norm"]
        if block == "mamba":
            self.mixer = Mamba2Mixer(spec, params, p, index)
        elif block == "attention":
            self.mixer = NoPEAttention(spec, params, p, cos_sin, scale, index)
        elif block == "mlp":
            self.mixer = Relu2MLP(params, p)
        else:
            self.mixer = Relu2MoE(spec, params, p)
        self.fused_input = self.mixer.fused_input
        # the token mixer or the MLP of the layer, under the names the routing planter and tools look for
        self.attn, self.mlp = (None, self.mixer) if block in ("mlp", "moe") else (self.mixer, None)


class NemotronDecoder(Decoder):
    def __init__(self, spec, layers: list[int], params: dict[str, torch.Tensor], device, dtype):
        self.spec, self.layers, self.params = spec, list(layers), params
        self.device, self.dtype = torch.device(device), dtype
        self.cos_sin = cos_sin_cache(spec, device=device)       # unused (no rotary); sets max_positions
        self.scale, self.eps = attention_scale(spec), spec.rms_norm_eps
        self.embed, self.final_norm = params["embed"], params["final_norm"]
        self.lm_head_w = params.get("lm_head", self.embed)
        self.embed_scale, self.selections = None, {}
        self.blocks = [NemotronLayer(spec, i, params, self.cos_sin, self.scale) for i in self.layers]

    @torch.no_grad()
    def hidden(self, wl) -> torch.Tensor:
        """The pre-norm residual stream: per layer x + mixer(rms_norm(x)), then the final norm: [T, H]."""
        x = call("embedding", wl.token_ids, self.embed)                           # [T, H]
        residual = torch.zeros_like(x)
        for layer in self.blocks:
            a, residual = _norm_into(x, residual, layer.norm, self.eps, layer.fused_input)
            x = layer.mixer(a, wl)
        return call("fused_add_rms_norm", x, residual, self.final_norm, self.eps)[0]
