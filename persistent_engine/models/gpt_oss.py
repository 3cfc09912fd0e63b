"""gpt-oss (``GptOssForCausalLM``, gpt-oss-20b / gpt-oss-120b): its config section and its weights.

Source: HF transformers ``models/gpt_oss/modeling_gpt_oss.py`` and ``configuration_gpt_oss.py`` (Apache-2.0). The
layer is the generic decoder's (models/decoder.py) with:
  attention  GQA with q, k, v and o biases (``attention_bias``), a learned sink logit per head in every softmax
             (``sinks``), ``layer_types``: sliding_attention layers see the last ``sliding_window`` keys (128),
             full_attention layers all; YaRN rope (factor 32 from 4096, ``truncate`` false: unrounded ramp bounds)
  MoE        every layer: router = linear with bias, top-k of the logits, softmax over those k (= ``moe_route``
             softmax scoring, renormalised); experts with biases on both projections around the clamped SwiGLU
             (``moe_experts_bias``, ops/gpt_oss.py; alpha 1.702, ``swiglu_limit`` 7)
  MXFP4      ``quantization_config`` {quant_method: mxfp4}: the experts' weights ship as e2m1 blocks with e8m0
             scales (ops/mxfp4.py); the loader keeps them (``w13_blocks`` / ``w13_scales``, ``w2_*``, rows in
             tkcc's order) beside their exact bf16 decode (``w13``, ``w2``) that the reference runs. Seeded random
             weights are rounded to MXFP4 the same way, so the packed and the bf16 experts are the same numbers.
             ``moe_experts_bias`` receives the packs for a template to read (4.25 bits a weight); the reference
             ignores them and no fast template exists yet (the cost model counts expert bytes at 4.25 bits).

The config section (torch-free, read by models/spec.py): models/gpt_oss_config.py.

HF checkpoint names (per layer i, ``model.layers.{i}.``): ``self_attn.{q,k,v,o}_proj.{weight,bias}``,
``self_attn.sinks``, ``mlp.router.{weight,bias}``, ``mlp.experts.gate_up_proj_{blocks,scales}`` [E, 2I, H/32, 16 |
-] (rows interleaved gate, up, gate, ...), ``gate_up_proj_bias`` [E, 2I], ``down_proj_{blocks,scales}`` [E, H,
I/32, 16 | -], ``down_proj_bias`` [E, H]; unquantized checkpoints: ``gate_up_proj`` [E, H, 2I], ``down_proj``
[E, I, H] (x @ W layout).
"""

from __future__ import annotations

import torch

from persistent_engine.ops.mxfp4 import decode_mxfp4, encode_mxfp4

# ----------------------------------------------------------------------------- weights
def packed(spec) -> bool:
    return spec.family == "gpt_oss" and spec.expert_dtype == "mxfp4"


def extra_param_specs(spec, i: int) -> dict[str, tuple[tuple[int, ...], str]]:
    """Layer i's tensors beyond the generic GQA + MoE ones: o bias, router bias, expert biases, MXFP4 packs."""
    p, h, e, im = f"layers.{i}.", spec.hidden_size, spec.num_experts, spec.moe_intermediate_size
    out = {p + "o_b": ((h,), "bias"), p + "router_b": ((e,), "bias"), p + "w13_b": ((e, 2 * im), "router_bias"),
           p + "w2_b": ((e, h), "router_bias")}
    if packed(spec):
        out.update({p + "w13_blocks": ((e, 2 * im, h // 32, 16), "packed"), p + "w13_scales": ((e, 2 * im, h // 32), "packed"),
                    p + "w2_blocks": ((e, h, im // 32, 16), "packed"), p + "w2_scales": ((e, h, im // 32), "packed")})
    return out


def pack_experts(spec, params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Seeded random experts rounded to MXFP4: each layer's w13 / w2 replaced by the decode of its packs, which are
    stored too (so a template reading the packs computes the reference's numbers)."""
    if not packed(spec):
        return params
    for name in [n for n in params if n.endswith((".w13", ".w2"))]:
        w = params[name]                                   # [E, rows, K]: one expert at a time (bounded temporaries)
        packs = [encode_mxfp4(w[e]) for e in range(w.shape[0])]
        params[name + "_blocks"] = torch.stack([b for b, _ in packs])
        params[name + "_scales"] = torch.stack([s for _, s in packs])
        for e, (b, s) in enumerate(packs):
            w[e] = decode_mxfp4(b, s, w.dtype)
    return params


def _halves(spec) -> torch.Tensor:
    """Rows of HF's interleaved gate_up (gate 0, up 0, gate 1, ...) in tkcc's [gate | up] order."""
    im = spec.moe_intermediate_size
    return torch.cat([torch.arange(0, 2 * im, 2), torch.arange(1, 2 * im, 2)])


def moe_from_hf(spec, i: int, get) -> dict[str, torch.Tensor]:
    """Layer i's router and experts (internal names) from the HF checkpoint; MXFP4 packs decoded and kept."""
    p, m = f"layers.{i}.", f"model.layers.{i}.mlp."
    rows = _halves(spec)
    out = {p + "router_w": get(m + "router.weight"), p + "router_b": get(m + "router.bias"),
           p + "w13_b": get(m + "experts.gate_up_proj_bias")[:, rows].float(),
           p + "w2_b": get(m + "experts.down_proj_bias").float()}
    if packed(spec):
        gb, gs = get(m + "experts.gate_up_proj_blocks")[:, rows], get(m + "experts.gate_up_proj_scales")[:, rows]
        db, ds = get(m + "experts.down_proj_blocks"), get(m + "experts.down_proj_scales")
        out.update({p + "w13_blocks": gb.contiguous(), p + "w13_scales": gs.contiguous(), p + "w2_blocks": db,
                    p + "w2_scales": ds, p + "w13": decode_mxfp4(gb, gs), p + "w2": decode_mxfp4(db, ds)})
    else:
        out[p + "w13"] = get(m + "experts.gate_up_proj").transpose(1, 2)[:, rows].contiguous()
        out[p + "w2"] = get(m + "experts.down_proj").transpose(1, 2).contiguous()
    return out


def moe_to_hf(spec, i: int, params: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The inverse of ``moe_from_hf`` (MXFP4 checkpoints: the packs)."""
    p, m = f"layers.{i}.", f"model.layers.{i}.mlp."
    inv = _halves(spec).argsort()
    out = {m + "router.weight": params[p + "router_w"], m + "router.bias": params[p + "router_b"],
           m + "experts.gate_up_proj_bias": params[p + "w13_b"][:, inv], m + "experts.down_proj_bias": params[p + "w2_b"]}
    if packed(spec):
        out.update({m + "experts.gate_up_proj_blocks": params[p + "w13_blocks"][:, inv],
                    m + "experts.gate_up_proj_scales": params[p + "w13_scales"][:, inv],
                    m + "experts.down_proj_blocks": params[p + "w2_blocks"],
                    m + "experts.down_proj_scales": params[p + "w2_scales"]})
    else:
        out[m + "experts.gate_up_proj"] = params[p + "w13"][:, inv].transpose(1, 2)
        out[m + "experts.down_proj"] = params[p + "w2"].transpose(1, 2)
    return out
