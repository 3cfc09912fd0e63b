"""Squared-ReLU MLPs of Nemotron-H (HF ``NemotronHMLP`` / ``NemotronHExperts``, mlp_hidden_act "relu2"; vLLM
``ReLUSquaredActivation``): not gated, so one up projection [I, H] and one down projection [H, I] per MLP or expert.

  relu2(x)                                   relu(x)^2 elementwise (the dense MLP: linear, relu2, linear)
  moe_experts_relu2(x, w1, w2, weights, ids) sum_j weights[t, j] (relu(x[t] @ w1[e].T)^2 @ w2[e].T), e = ids[t, j]
Per token and expert: 4 H I FLOPs, 2 H I weights (a gated expert: 6 H I, 3 H I).
"""

from __future__ import annotations

import torch

from persistent_engine.ops.basic import _acc
from persistent_engine.ops.moe import LOOP_MIN_TOKENS, _experts_fit, experts_check_bytes, experts_forward
from persistent_engine.ops.opdef import DEFAULT_TOLERANCES, MATMUL_TOLERANCES, OpDef, generator, randn, tokens


def relu2(x: torch.Tensor) -> torch.Tensor:
    """relu(x)^2 in fp32, x's dtype."""
    return torch.relu(_acc(x)).square().to(x.dtype)


def moe_experts_relu2(x: torch.Tensor, w1: torch.Tensor, w2: torch.Tensor, topk_weights: torch.Tensor,
                      topk_ids: torch.Tensor) -> torch.Tensor:
    """x [T, H], w1 [E, I, H], w2 [E, H, I], topk_weights [T, k] fp32, topk_ids [T, k] -> [T, H] (the gather /
    dense / grouped paths of ``moe_experts`` with relu2 in place of the gated activation)."""
    return experts_forward(x, w1, w2, topk_weights, topk_ids, relu2)


def _relu2_inputs(shape, dtype, device, seed):
    return (randn(generator(device, seed), [shape["T"], shape["I"]], dtype, device),)


def _experts_inputs(shape, dtype, device, seed):
    g = generator(device, seed)
    t, e, k, h, i = shape["T"], shape["E"], shape["k"], shape["H"], shape["I"]
    w = torch.rand((t, k), generator=g, device=device) + 0.1
    ids = torch.rand((t, e), generator=g, device=device).argsort(dim=-1)[:, :k]
    return (randn(g, [t, h], dtype, device), randn(g, [e, i, h], dtype, device, h ** -0.5),
            randn(g, [e, h, i], dtype, device, i ** -0.5), w / w.sum(-1, keepdim=True), ids)


def _relu2_model(spec) -> bool:
    return getattr(spec, "mlp_act", "") == "relu2"


def _relu2_shapes(spec, point) -> list[dict]:
    if not _relu2_model(spec):
        return []
    widths = [spec.intermediate_size] if "-" in spec.hybrid_pattern else []
    widths += [spec.shared_intermediate_size * spec.num_shared_experts] if spec.num_shared_experts else []
    return [{"T": tokens(point), "I": w} for w in dict.fromkeys(widths)]


def _experts_shapes(spec, point) -> list[dict]:
    if not _relu2_model(spec) or not spec.is_moe:
        return []
    return [{"T": tokens(point), "E": spec.num_experts, "k": spec.num_experts_per_tok,
             "H": spec.latent_moe_size or spec.hidden_size, "I": spec.moe_intermediate_size}]


def _experts_check_bytes(shape: dict) -> int:
    return experts_check_bytes(shape) * 2 // 3           # two matrices per expert, not three


OPS = [
    OpDef("relu2", relu2, "relu2(x[T, I]) -> relu(x)^2 [T, I] x.dtype. shape dict: {'T', 'I'}",
          _relu2_inputs, _relu2_shapes, ({"T": 5, "I": 24},), tolerances=dict(DEFAULT_TOLERANCES)),
    OpDef("moe_experts_relu2", moe_experts_relu2,
          "moe_experts_relu2(x[T, H], w1[E, I, H], w2[E, H, I], topk_weights[T, k] fp32, topk_ids[T, k] int64) -> "
          "[T, H] = sum_j topk_weights[t, j] * (relu(x[t] @ w1[e].T)^2 @ w2[e].T), e = topk_ids[t, j] (not gated). "
          "shape dict: {'T', 'E', 'k', 'H', 'I'}",
          _experts_inputs, _experts_shapes,
          ({"T": 1, "E": 16, "k": 2, "H": 32, "I": 24}, {"T": 6, "E": 8, "k": 2, "H": 48, "I": 16},
           {"T": LOOP_MIN_TOKENS + 3, "E": 8, "k": 3, "H": 16, "I": 8}),
          tolerances=dict(MATMUL_TOLERANCES), fit=_experts_fit, check_bytes=_experts_check_bytes),
]
