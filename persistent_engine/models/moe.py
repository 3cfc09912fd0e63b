"""The MLP of one layer: dense SwiGLU (Gemma: GeGLU), or a routed MoE block with optional shared experts.

Dense: the gate_up projection is fused with the norm before it (the layer runs ``add_rms_norm_linear``
with ``fused_input``), so ``DenseMLP`` takes gate_up[T, 2I] and runs ``silu_mul_linear``. MoE takes the
normed hidden state (it feeds the router and the shared experts); the shared experts' down projection
is ``silu_mul_linear`` too.

gpt-oss (``spec.moe_bias``): the router is a biased linear and the experts have biases on both projections
(``moe_experts_bias``, ops/gpt_oss.py).

MoE decode is free of host syncs (router linear -> moe_route -> moe_experts, shapes only), so a
decode step can be captured in a CUDA graph. Routed output is scaled inside moe_route
(routed_scaling_factor); shared experts are added unscaled, as in DeepSeek-V3 / GLM-4.x.
"""

from __future__ import annotations

import torch

from persistent_engine.ops.registry import call


def swiglu(h: torch.Tensor, gate_up_w: torch.Tensor, down_w: torch.Tensor, oai: tuple | None = None) -> torch.Tensor:
    """down(silu(gate(h)) * up(h)) for h[T, H]: reads 3 H I weights per token batch. ``oai``: (alpha, limit) of
    swigluoai (MiniMax-M3) instead of silu."""
    return _act_down(call("linear", h, gate_up_w, None), down_w, oai)


def _act_down(gate_up: torch.Tensor, down_w: torch.Tensor, oai: tuple | None) -> torch.Tensor:
    if oai is None:
        return call("silu_mul_linear", gate_up, down_w)
    return call("linear", call("swigluoai_and_mul", gate_up, *oai), down_w, None)


def oai_args(spec) -> tuple | None:
    """(alpha, limit) for swigluoai MLPs, None for SwiGLU."""
    return (spec.swiglu_alpha, spec.swiglu_limit) if spec.mlp_act == "swigluoai" else None


class DenseMLP:
    def __init__(self, spec, params: dict[str, torch.Tensor], prefix: str):
        self.gate_up_w, self.down_w = params[prefix + "gate_up_w"], params[prefix + "down_w"]
        self.oai = oai_args(spec)
        self.geglu = spec.mlp_act == "gelu_tanh"            # Gemma: gelu_pytorch_tanh(gate) * up
        # the input projection, fused by the layer with the norm before it (add_rms_norm_linear)
        self.fused_input = (self.gate_up_w, None)

    def __call__(self, gate_up: torch.Tensor) -> torch.Tensor:
        """gate_up[T, 2I] (already projected by ``fused_input``) -> [T, H]."""
        if self.geglu:
            return call("linear", call("gelu_tanh_and_mul", gate_up), self.down_w, None)
        return _act_down(gate_up, self.down_w, self.oai)


class MoEMLP:
    def __init__(self, spec, params: dict[str, torch.Tensor], prefix: str):
        self.router_w, self.router_bias = params[prefix + "router_w"], params.get(prefix + "router_bias")
        self.router_b = params.get(prefix + "router_b")                 # gpt-oss: the router linear's bias
        self.expert_b = (params[prefix + "w13_b"], params[prefix + "w2_b"]) if prefix + "w13_b" in params else None
        # gpt-oss MXFP4 checkpoints: the packs of w13 / w2, for a template of moe_experts_bias (the reference ignores them)
        self.packs = tuple(params[prefix + n] for n in ("w13_blocks", "w13_scales", "w2_blocks", "w2_scales")) \
            if prefix + "w13_blocks" in params else None
        self.w13, self.w2 = params[prefix + "w13"], params[prefix + "w2"]
        self.shared = (params[prefix + "shared_gate_up_w"], params[prefix + "shared_down_w"]) \
            if prefix + "shared_gate_up_w" in params else None
        self.route_args = (spec.num_experts_per_tok, spec.scoring, spec.n_group, spec.topk_group,
                           spec.norm_topk_prob, spec.routed_scaling_factor)
        self.oai = oai_args(spec)

    def route(self, h: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits = call("linear", h, self.router_w, self.router_b).float()        # [T, E] fp32
        return call("moe_route", logits, self.router_bias, *self.route_args)

    def __call__(self, h: torch.Tensor) -> torch.Tensor:
        weights, ids = self.route(h)
        if self.expert_b is not None:
            out = call("moe_experts_bias", h, self.w13, self.w2, *self.expert_b, weights, ids, *self.oai, self.packs)
        elif self.oai is None:
            out = call("moe_experts", h, self.w13, self.w2, weights, ids)
        else:
            out = call("moe_experts_oai", h, self.w13, self.w2, weights, ids, *self.oai)
        if self.shared is not None:
            out = out + swiglu(h, *self.shared, self.oai)
        return out
