"""The template library: every kernel template, its knob space and its validity constraint.

Knob values are listed with a sensible default first. Constraints bound the per-thread register
footprint of a Triton tile (elements of the largest live block per thread, 32 threads a warp) and
reject settings that only waste work at the model's sizes (``dims``: hidden, intermediate,
head_dim, ... from :func:`dims_of`); an empty ``dims`` checks the knobs alone.
"""

from __future__ import annotations

from typing import Any, Mapping

from agents.templates.base import Knob, Template, TemplateError

POW2_WARPS = (4, 8, 2, 1)
MAX_ELEMS_PER_THREAD = 128       # fp32 values of the largest live tile per thread


def dims_of(spec: Any) -> dict[str, int]:
    """Model sizes that constraints look at, from a ModelSpec (or {} without one)."""
    if spec is None:
        return {}
    return {"hidden": spec.hidden_size, "intermediate": spec.intermediate_size,
            "moe_intermediate": spec.moe_intermediate_size, "head_dim": spec.head_dim,
            "heads": spec.num_heads, "kv_heads": spec.num_kv_heads,
            "group": max(spec.num_heads // max(spec.num_kv_heads, 1), 1), "kv_lora_rank": spec.kv_lora_rank,
            "experts": getattr(spec, "num_experts", 0) or 0,
            "kda_head_dim": getattr(spec, "kda_head_dim", 0),
            **({"linear_k_dim": spec.linear_k_dim, "linear_v_dim": spec.linear_v_dim}
               if getattr(spec, "linear_layers", ()) else {})}


def _next_pow2(n: int) -> int:
    return 1 << max(int(n) - 1, 0).bit_length()


def _per_thread(elems: int, warps: int) -> list[str]:
    per = elems / (32 * warps)
    return [f"{elems} tile elements over {warps} warps is {per:.0f} per thread "
            f"(> {MAX_ELEMS_PER_THREAD})"] if per > MAX_ELEMS_PER_THREAD else []


def _row_norm(prefix: str):
    def check(k: Mapping, dims: Mapping) -> list[str]:
        out = _per_thread(k[f"{prefix}_BLOCK_D"] * k[f"{prefix}_ROWS"], k[f"{prefix}_NUM_WARPS"])
        if "hidden" in dims and k[f"{prefix}_BLOCK_D"] > 2 * _next_pow2(dims["hidden"]):
            out.append(f"BLOCK_D {k[f'{prefix}_BLOCK_D']} is over twice the row ({dims['hidden']})")
        return out
    return check


def _glu(prefix: str, *, row: bool = True):
    """A gated-unit row kernel (triton_glu_and_mul.py): its BLOCK_I tile per thread and, with ``row``, no
    block over twice the model's intermediate row."""
    def check(k: Mapping, dims: Mapping) -> list[str]:
        out = _per_thread(k[f"{prefix}_BLOCK_I"], k[f"{prefix}_NUM_WARPS"])
        if row and "intermediate" in dims and k[f"{prefix}_BLOCK_I"] > 2 * _next_pow2(dims["intermediate"]):
            out.append(f"BLOCK_I {k[f'{prefix}_BLOCK_I']} is over twice the row ({dims['intermediate']})")
        return out
    return check


def _rope(k: Mapping, dims: Mapping) -> list[str]:
    half = _next_pow2(dims.get("head_dim", 128) // 2)
    out = _per_thread(2 * k["ROPE_HEADS"] * half, k["ROPE_NUM_WARPS"])
    if "heads" in dims and k["ROPE_HEADS"] > 2 * _next_pow2(dims["heads"]):
        out.append("more heads per program than the model has")
    return out


def _gemv(k: Mapping, dims: Mapping) -> list[str]:
    bm, bn, bk = k["GEMV_BLOCK_M"], k["GEMV_BLOCK_N"], k["GEMV_BLOCK_K"]
    out = _per_thread(bm * bn * bk, k["GEMV_NUM_WARPS"])
    if bm > k["GEMV_MAX_M"]:
        out.append("BLOCK_M above MAX_M")
    if "hidden" in dims and bk * k["GEMV_SPLIT_K"] > 2 * _next_pow2(max(dims["hidden"], 1)) and k["GEMV_SPLIT_K"] > 1:
        out.append("split-K slices shorter than one BLOCK_K at this hidden size")
    if k["GEMV_FUSED_REDUCE"] and k["GEMV_SPLIT_K"] == 1:
        out.append("FUSED_REDUCE without a K split (the same kernel as FUSED_REDUCE 0)")
    return out


def _tiled(k: Mapping, dims: Mapping) -> list[str]:
    bm, bn, bk, w = k["TILE_BLOCK_M"], k["TILE_BLOCK_N"], k["TILE_BLOCK_K"], k["TILE_NUM_WARPS"]
    out = _per_thread(bm * bn, w) + _per_thread((bm + bn) * bk, w * 2)
    smem = (bm + bn) * bk * 2 * k["TILE_NUM_STAGES"]
    if smem > 200 * 1024:
        out.append(f"{smem} bytes of shared memory for the pipeline stages")
    return out


def _skinny(k: Mapping, dims: Mapping) -> list[str]:
    bt, bn, bk, w = k["SKINNY_BLOCK_T"], k["SKINNY_BLOCK_N"], k["SKINNY_BLOCK_K"], k["SKINNY_NUM_WARPS"]
    out = _per_thread(bt * bn, w) + _per_thread((bt + bn) * bk, w * 2)
    smem = (bt + bn) * bk * 2 * k["SKINNY_NUM_STAGES"]
    if smem > 200 * 1024:
        out.append(f"{smem} bytes of shared memory for the pipeline stages")
    if bt > k["SKINNY_MAX_M"]:
        out.append("BLOCK_T above MAX_M")
    split = k["SKINNY_SPLIT_K"]
    if "hidden" in dims and split > 1 and bk * split > 2 * _next_pow2(max(dims["hidden"], 1)):
        out.append("split-K slices shorter than one BLOCK_K at this hidden size")
    if k["SKINNY_FUSED_REDUCE"] and split == 1:
        out.append("FUSED_REDUCE without a K split (the same kernel as FUSED_REDUCE 0)")
    return out


def _fused_linear(prefix: str, dim: str):
    """Composite GEMV + GEMM templates (add_rms_norm_linear, silu_mul_linear): the decode GEMV tile
    ([BLOCK_M, BLOCK_N, BLOCK_K] products), split-K slices at the model's K (``dims[dim]``), and the
    prefill ``tl.dot`` tiles (accumulator, operands, pipeline stages in shared memory)."""
    def check(k: Mapping, dims: Mapping) -> list[str]:
        bm, bn, bk, split = (k[f"{prefix}_{x}"] for x in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "SPLIT_K"))
        out = _per_thread(bm * bn * bk, k[f"{prefix}_NUM_WARPS"])
        if bm > k[f"{prefix}_MAX_T"]:
            out.append("BLOCK_M above MAX_T")
        if dim in dims and split > 1 and bk * split > 2 * _next_pow2(max(dims[dim], 1)):
            out.append(f"split-K slices shorter than one BLOCK_K at {dim} {dims[dim]}")
        if k[f"{prefix}_FUSED_REDUCE"] and split == 1:
            out.append("FUSED_REDUCE without a K split (the same kernel as FUSED_REDUCE 0)")
        tm, tn, tk, tw = (k[f"{prefix}_TILE_{x}"] for x in ("M", "N", "K", "WARPS"))
        out += _per_thread(tm * tn, tw) + _per_thread((tm + tn) * tk, tw * 2)
        smem = (tm + tn) * tk * 2 * k[f"{prefix}_TILE_STAGES"]
        if smem > 200 * 1024:
            out.append(f"{smem} bytes of shared memory for the pipeline stages")
        return out
    return check


def _qkv_rotary(p: str):
    """add_rms_norm_qkv_rotary (``p`` QKVR) and its K/V-writing region (QKVW), one kernel pair: the split-K
    GEMV tile, and the reduce tile of HEADS whole heads (the value and its rotary partner, [HEADS,
    pow2(head_dim)] fp32 each)."""
    def check(k: Mapping, dims: Mapping) -> list[str]:
        bm, bn, bk, split = (k[f"{p}_{x}"] for x in ("BLOCK_M", "BLOCK_N", "BLOCK_K", "SPLIT_K"))
        out = _per_thread(bm * bn * bk, k[f"{p}_NUM_WARPS"])
        out += _per_thread(2 * k[f"{p}_HEADS"] * _next_pow2(dims.get("head_dim", 128)), k[f"{p}_REDUCE_WARPS"])
        if bm > k[f"{p}_MAX_T"]:
            out.append("BLOCK_M above MAX_T")
        if "hidden" in dims and split > 1 and bk * split > 2 * _next_pow2(max(dims["hidden"], 1)):
            out.append(f"split-K slices shorter than one BLOCK_K at hidden {dims['hidden']}")
        if "heads" in dims and k[f"{p}_HEADS"] > 2 * _next_pow2(dims["heads"] + 2 * dims["kv_heads"]):
            out.append("more heads per reduce program than the model has")
        return out
    return check


def _qkv_rotary_knobs(p: str) -> tuple[Knob, ...]:
    return (Knob(f"{p}_BLOCK_N", (8, 16, 4, 32, 2)), Knob(f"{p}_BLOCK_K", (512, 256, 1024, 128, 64)),
            Knob(f"{p}_BLOCK_M", (1, 2, 4)), Knob(f"{p}_SPLIT_K", (1, 2, 4, 8)),
            Knob(f"{p}_NUM_WARPS", POW2_WARPS), Knob(f"{p}_NUM_STAGES", (3, 2, 4, 1)),
            Knob(f"{p}_MAX_T", (1, 4, 8, 16, 32)), Knob(f"{p}_HEADS", (2, 1, 4, 8)),
            Knob(f"{p}_REDUCE_WARPS", (2, 1, 4)), Knob(f"{p}_PDL", (0, 1)))


def _gated_delta(k: Mapping, dims: Mapping) -> list[str]:
    """The fp32 state tile [pow2(Dk), BLOCK_V] of one program (two live copies: S and the update)."""
    out = _per_thread(2 * _next_pow2(dims.get("linear_k_dim", 128)) * k["GDD_BLOCK_V"], k["GDD_NUM_WARPS"])
    if "linear_v_dim" in dims and k["GDD_BLOCK_V"] > 2 * _next_pow2(dims["linear_v_dim"]):
        out.append(f"BLOCK_V {k['GDD_BLOCK_V']} is over twice the head's Dv ({dims['linear_v_dim']})")
    return out


def _attn(k: Mapping, dims: Mapping) -> list[str]:
    dh = max(16, _next_pow2(dims.get("head_dim", 64)))
    g = _next_pow2(dims.get("group", 4))
    bt, warps = k["ATTD_BLOCK_T"], k["ATTD_NUM_WARPS"]
    if k["ATTD_DOT"]:           # operands and the [G, T] / [G, D] results only
        return _per_thread(max(g, 16) * (bt + dh) + 2 * bt * dh, warps)
    return _per_thread(g * bt * dh, warps)


def _attn_prefill(k: Mapping, dims: Mapping) -> list[str]:
    """The live [M, BLOCK_T] scores and [M, Dv] accumulator of M = BLOCK_Q x the padded group rows (>= 16: the
    template's ``_attp_block_g``); the K/V tiles are tl.dot operands staged through shared memory."""
    bq, bt = k["ATTP_BLOCK_Q"], k["ATTP_BLOCK_T"]
    rows = bq * max(_next_pow2(dims.get("group", 4)), 16 // bq)
    return _per_thread(rows * (bt + max(16, _next_pow2(dims.get("head_dim", 64)))), k["ATTP_NUM_WARPS"])


def _moe_route(k: Mapping, dims: Mapping) -> list[str]:
    """The [ROWS, next_pow2(E)] scores, choice and masks live at once (about four tiles); no more rows a program
    than a decode batch needs is checked by the search's timing, not here."""
    return _per_thread(4 * k["MROUTE_ROWS"] * _next_pow2(dims.get("experts") or 128), k["MROUTE_NUM_WARPS"])


def _dense_layer(prefix: str):
    """The persistent layer kernel's largest live tiles: a GEMV's [BLOCK_B, BLOCK_N, BLOCK_K] product and the
    attention's [G, BLOCK_T, Dh] one."""
    def check(k: Mapping, dims: Mapping) -> list[str]:
        dh, g = max(16, _next_pow2(dims.get("head_dim", 64))), _next_pow2(dims.get("group", 4))
        tile = max(k[f"{prefix}_BLOCK_B"] * k[f"{prefix}_BLOCK_N"] * k[f"{prefix}_BLOCK_K"],
                   g * k[f"{prefix}_BLOCK_T"] * dh)
        return _per_thread(tile, k[f"{prefix}_NUM_WARPS"])
    return check


def _dense_layer_knobs(prefix: str) -> tuple:
    return (Knob(f"{prefix}_PROGRAMS", (132, 264, 66, 114)), Knob(f"{prefix}_BLOCK_N", (32, 16, 64, 8, 4)),
            Knob(f"{prefix}_BLOCK_K", (256, 128, 512, 64, 32)), Knob(f"{prefix}_BLOCK_B", (1, 2, 4)),
            Knob(f"{prefix}_SPLITS", (16, 8, 4, 2)), Knob(f"{prefix}_BLOCK_T", (32, 16, 64)),
            Knob(f"{prefix}_NUM_WARPS", (8, 4, 2)))


def _attn_window(k: Mapping, dims: Mapping) -> list[str]:
    g, dh = _next_pow2(dims.get("group", 8)), _next_pow2(dims.get("head_dim", 128))
    return _per_thread(g * k["ATTW_BLOCK_T"] * dh, k["ATTW_NUM_WARPS"])


def _hc_post(k: Mapping, dims: Mapping) -> list[str]:
    return _per_thread(k["HCP_BLOCK_D"], k["HCP_NUM_WARPS"])


HC_STREAMS = 4                   # hc_mult of DeepSeek-V4: (2+N)*N = 24 logits + the sum of squares, padded to 32


def _hc_pre(k: Mapping, dims: Mapping) -> list[str]:
    """The [BLOCK_T, 32, BLOCK_K] product tile of the logits GEMV and the [N, BLOCK_D] collapse tile; at the
    model's K = N * hidden, no split-K slice shorter than one BLOCK_K and no D-block over twice the row."""
    logits = _next_pow2((2 + HC_STREAMS) * HC_STREAMS + 1)
    out = _per_thread(k["HCPR_BLOCK_T"] * logits * k["HCPR_BLOCK_K"], k["HCPR_NUM_WARPS"])
    out += _per_thread(HC_STREAMS * k["HCPR_BLOCK_D"], k["HCPR_COLLAPSE_WARPS"])
    if "hidden" in dims and k["HCPR_SPLIT_K"] > 1 and \
            k["HCPR_BLOCK_K"] * k["HCPR_SPLIT_K"] > 2 * _next_pow2(HC_STREAMS * dims["hidden"]):
        out.append(f"split-K slices shorter than one BLOCK_K at K = {HC_STREAMS} x hidden {dims['hidden']}")
    if "hidden" in dims and k["HCPR_BLOCK_D"] > 2 * _next_pow2(dims["hidden"]):
        out.append(f"BLOCK_D {k['HCPR_BLOCK_D']} is over twice the row ({dims['hidden']})")
    return out


def _sparse_mla(k: Mapping, dims: Mapping) -> list[str]:
    """The [BLOCK_H, L] accumulator, the [BLOCK_K, L] row tile and the [BLOCK_H, BLOCK_K] scores live at once
    (L: kv_lora_rank, 512 for DeepSeek/GLM; 128 assumed without a model)."""
    lat = _next_pow2(dims.get("kv_lora_rank", 128))
    out = _per_thread(k["SMLA_BLOCK_H"] * lat + k["SMLA_BLOCK_K"] * lat + k["SMLA_BLOCK_H"] * k["SMLA_BLOCK_K"],
                      k["SMLA_NUM_WARPS"])
    smem = max(k["SMLA_NUM_STAGES"], 1) * k["SMLA_BLOCK_K"] * (lat + 64) * 2     # bf16 row tiles in flight
    if smem > MOE_SMEM_BYTES:
        out.append(f"{k['SMLA_NUM_STAGES']} stages of {k['SMLA_BLOCK_K']}-row latent tiles need {smem >> 10} KiB "
                   f"of shared memory (> {MOE_SMEM_BYTES >> 10})")
    return out


def _compressed_attn(k: Mapping, dims: Mapping) -> list[str]:
    """The fp32 [BLOCK_H, D] accumulator, the 16-bit q (half as many registers), the [max(BLOCK_T, BLOCK_E), D]
    row tile and the scores live at once (D: head_dim, 512 for DeepSeek-V4-Flash; 512 assumed without a
    model); the row tiles in flight in shared memory; no head block over twice the model's heads."""
    d = _next_pow2(dims.get("head_dim", 512))
    bh, rows = k["CSAA_BLOCK_H"], max(k["CSAA_BLOCK_T"], k["CSAA_BLOCK_E"])
    out = _per_thread(bh * d + bh * d // 2 + rows * d + bh * rows, k["CSAA_NUM_WARPS"])
    smem = max(k["CSAA_NUM_STAGES"], 1) * rows * d * 2                              # bf16 row tiles in flight
    if smem > MOE_SMEM_BYTES:
        out.append(f"{k['CSAA_NUM_STAGES']} stages of {rows}-row tiles need {smem >> 10} KiB of shared memory "
                   f"(> {MOE_SMEM_BYTES >> 10})")
    if "heads" in dims and bh > 2 * _next_pow2(max(dims["heads"], 16)):
        out.append(f"BLOCK_H {bh} is over twice the model's {dims['heads']} heads")
    return out


def _kda(k: Mapping, dims: Mapping) -> list[str]:
    """The fp32 state tile [K, BLOCK_V] lives in registers (K: the KDA head dim, 128 for Kimi; 128 assumed)."""
    return _per_thread(_next_pow2(dims.get("kda_head_dim") or 128) * k["KDA_BLOCK_V"], k["KDA_NUM_WARPS"])


MOE_SMEM_BYTES = 200 * 1024     # bf16 A + gate + up tiles of the w13 GEMM, NUM_STAGES - 1 buffers (H200: 227 KiB)


def _moe(k: Mapping, dims: Mapping) -> list[str]:
    out = _per_thread(2 * k["MOE_GEMV_ROWS"] * k["MOE_GEMV_BLOCK_K"], k["MOE_GEMV_WARPS"])
    out += _per_thread(2 * k["MOE_BLOCK_M"] * k["MOE_BLOCK_N"], k["MOE_NUM_WARPS"])   # gate + up accumulators
    smem = max(k["MOE_NUM_STAGES"] - 1, 1) * (k["MOE_BLOCK_M"] + 2 * k["MOE_BLOCK_N"]) * k["MOE_BLOCK_K"] * 2
    if smem > MOE_SMEM_BYTES:
        out.append(f"{k['MOE_NUM_STAGES']} stages of the w13 tiles need {smem >> 10} KiB of shared memory "
                   f"(> {MOE_SMEM_BYTES >> 10})")
    if "hidden" in dims and k["MOE_GEMV_BLOCK_K"] > 2 * _next_pow2(dims["hidden"]):
        out.append(f"GEMV BLOCK_K {k['MOE_GEMV_BLOCK_K']} is over twice the row ({dims['hidden']})")
    return out


MOE_KNOBS = (Knob("MOE_GEMV_MAX_PAIRS", (16, 8, 32, 64, 128, 0)), Knob("MOE_GEMV_ROWS", (8, 4, 16, 32, 2)),
             Knob("MOE_GEMV_BLOCK_K", (512, 256, 1024, 128, 32)), Knob("MOE_GEMV_WARPS", POW2_WARPS),
             Knob("MOE_BLOCK_M", (16, 32, 64)), Knob("MOE_BLOCK_N", (64, 128, 32, 16)),
             Knob("MOE_BLOCK_K", (64, 128, 32, 256, 16)), Knob("MOE_GROUP_M", (8, 1, 4, 16)),
             Knob("MOE_NUM_WARPS", (4, 8, 2)), Knob("MOE_NUM_STAGES", (3, 4, 2, 1)))


def _moe_variant(prefix: str):
    """A fused-MoE variant (its own epilogue, the fused MoE's kernels): MOE_KNOBS renamed to ``prefix``, and
    the fused MoE's checks on them."""
    knobs = tuple(Knob(k.name.replace("MOE_", prefix, 1), k.values) for k in MOE_KNOBS)
    return knobs, lambda k, dims: _moe({name.replace(prefix, "MOE_", 1): v for name, v in k.items()}, dims)


MOES_KNOBS, _moes = _moe_variant("MOES_")      # moe_experts_situ (Kimi-K3's SiTU-GLU)
MOEC_KNOBS, _moec = _moe_variant("MOEC_")      # moe_experts_clamp (DeepSeek-V4's clamped SwiGLU)


TRITON_TEMPLATES: tuple[Template, ...] = (
    Template("rms_norm.triton_rows", "rms_norm", "triton_rms_norm.py", "rms_norm_triton", "triton",
             ("cuda",), (Knob("RMSN_BLOCK_D", (2048, 1024, 4096, 8192, 512, 256, 128, 64)),
                         Knob("RMSN_ROWS", (1, 2, 4)), Knob("RMSN_NUM_WARPS", POW2_WARPS + (16,))),
             "row-blocked RMSNorm, fp32 sum of squares, single pass when the row fits",
             _row_norm("RMSN")),
    Template("fused_add_rms_norm.triton_rows", "fused_add_rms_norm", "triton_fused_add_rms_norm.py",
             "fused_add_rms_norm_triton", "triton", ("cuda",),
             (Knob("FARN_BLOCK_D", (2048, 1024, 4096, 8192, 512, 256, 128, 64)), Knob("FARN_ROWS", (1, 2, 4)),
              Knob("FARN_NUM_WARPS", POW2_WARPS + (16,))),
             "residual add and RMSNorm in one pass; the sum never leaves registers",
             _row_norm("FARN")),
    Template("silu_and_mul.triton", "silu_and_mul", "triton_glu_and_mul.py", "silu_and_mul_triton",
             "triton", ("cuda",),
             (Knob("SAM_BLOCK_I", (1024, 512, 2048, 4096, 256, 128, 64)), Knob("SAM_NUM_WARPS", POW2_WARPS)),
             "SiLU(gate) * up in fp32, one rounding", _glu("SAM")),
    Template("rotary_embedding.triton", "rotary_embedding", "triton_rotary.py", "rotary_embedding_triton",
             "triton", ("cuda",),
             (Knob("ROPE_HEADS", (4, 8, 16, 2, 1, 32)), Knob("ROPE_NUM_WARPS", POW2_WARPS)),
             "neox RoPE on q and k in one launch, cos/sin loaded once per token", _rope),
    Template("linear.triton_gemv_splitk", "linear", "triton_linear_gemv.py", "linear_gemv", "triton",
             ("cuda",),
             (Knob("GEMV_BLOCK_N", (16, 32, 8, 64, 4)), Knob("GEMV_BLOCK_K", (512, 256, 1024, 128, 64)),
              Knob("GEMV_BLOCK_M", (1, 2, 4)), Knob("GEMV_SPLIT_K", (4, 1, 2, 8, 16)),
              Knob("GEMV_NUM_WARPS", POW2_WARPS), Knob("GEMV_NUM_STAGES", (3, 2, 4, 1)),
              Knob("GEMV_MAX_M", (1, 4, 8, 16, 32, 64)), Knob("GEMV_PDL", (0, 1)), Knob("GEMV_FUSED_REDUCE", (0, 1))),
             "split-K GEMV for decode batches: vectorised weight streaming, one reduction at the end; "
             "GEMV_PDL: programmatic dependent launch (SM90+), the first W tile loads before waiting on x; "
             "GEMV_FUSED_REDUCE: the last-arriving program of each tile reduces it (no reduce launch)",
             _gemv),
    Template("linear.triton_tiled", "linear", "triton_linear_tiled.py", "linear_tiled", "triton", ("cuda",),
             (Knob("TILE_BLOCK_M", (16, 32, 64, 128)), Knob("TILE_BLOCK_N", (64, 128, 32, 256)),
              Knob("TILE_BLOCK_K", (64, 128, 32)), Knob("TILE_SPLIT_K", (1, 2, 4, 8)),
              Knob("TILE_GROUP_M", (8, 1, 4)), Knob("TILE_NUM_WARPS", (4, 8, 2)),
              Knob("TILE_NUM_STAGES", (3, 4, 2, 5))),
             "tiled tensor-core GEMM with split-K and grouped ordering", _tiled),
    Template("linear.triton_skinny", "linear", "triton_linear_skinny.py", "linear_skinny", "triton", ("cuda",),
             (Knob("SKINNY_BLOCK_T", (64, 16, 32, 128, 256)), Knob("SKINNY_BLOCK_N", (64, 128, 32)),
              Knob("SKINNY_BLOCK_K", (128, 64, 256, 32)), Knob("SKINNY_SPLIT_K", (4, 1, 2, 8, 16)),
              Knob("SKINNY_NUM_WARPS", (4, 8)), Knob("SKINNY_NUM_STAGES", (4, 3, 5, 2)),
              Knob("SKINNY_MAX_M", (256, 64, 128, 512)), Knob("SKINNY_FUSED_REDUCE", (0, 1))),
             "swap-AB tensor-core GEMM for serving batches (16-256 rows): W tiles are the MMA's 64/128-row side, "
             "the batch its 16-256 column side, row blocks fastest so W streams from memory once; split-K with a "
             "deterministic reduce (SKINNY_FUSED_REDUCE: in the last-arriving programs); cuBLAS above MAX_M",
             _skinny),
    Template("attention_decode.triton_splitkv", "attention_decode", "triton_attention_decode.py",
             "attention_decode_triton", "triton", ("cuda",),
             (Knob("ATTD_BLOCK_T", (32, 16, 64, 128)), Knob("ATTD_NUM_SPLITS", (0, 4, 1, 2, 8, 16, 32)),
              Knob("ATTD_NUM_WARPS", POW2_WARPS), Knob("ATTD_NUM_STAGES", (2, 1, 3)),
              Knob("ATTD_DOT", (False, True)), Knob("ATTD_PDL", (0, 1))),
             "flash-decoding over the paged cache: GQA group per program, split-KV (0: ~2 programs per SM), "
             "merge kernel; "
             "ATTD_PDL: programmatic dependent launch (SM90+)", _attn),
    Template("attention_prefill.triton_varlen", "attention_prefill", "triton_attention_prefill.py",
             "attention_prefill_triton", "triton", ("cuda",),
             (Knob("ATTP_BLOCK_Q", (16, 32, 8, 64, 4)), Knob("ATTP_BLOCK_T", (64, 32, 16, 128)),
              Knob("ATTP_NUM_WARPS", (8, 4, 2, 1)), Knob("ATTP_NUM_STAGES", (2, 1, 3))),
             "varlen causal flash attention over the paged cache (chunked prefill and mixed prefill + decode "
             "batches): BLOCK_Q queries x the GQA group per tensor-core tile, sequences found on device from "
             "cu_seqlens_q, keys past the block's last query never read", _attn_prefill),
    Template("dense_gqa_decode_layer.triton_persistent", "dense_gqa_decode_layer", "triton_dense_layer.py",
             "dense_gqa_decode_layer_triton", "triton", ("cuda",), _dense_layer_knobs("DLAY"),
             "one persistent kernel per decoder layer (norm, qkv, rotary, K/V write, split-KV attention, "
             "o-projection, residual, norm, gate/up, SiLU, down), phases separated by grid barriers instead of "
             "kernel boundaries; at most one program per SM (all resident)", _dense_layer("DLAY")),
    Template("dense_gqa_decode_step.triton_persistent", "dense_gqa_decode_step", "triton_dense_layer.py",
             "dense_gqa_decode_step_triton", "triton", ("cuda",),
             (*_dense_layer_knobs("DSTP"), Knob("DSTP_ONE_LAUNCH", (0, 1))),
             "the decode step as one persistent launch per layer (as dense_gqa_decode_layer.triton_persistent) "
             "with the embedding and final norm + lm_head in torch, or with DSTP_ONE_LAUNCH 1 all of it in one "
             "persistent launch (5 L + 1 grid barriers)", _dense_layer("DSTP")),
    Template("moe_route.triton", "moe_route", "triton_moe_route.py", "moe_route_triton", "triton", ("cuda",),
             (Knob("MROUTE_ROWS", (1, 2, 4, 8, 16)), Knob("MROUTE_NUM_WARPS", (1, 2, 4, 8))),
             "router scores, bias, top-k (k rounds of argmax) and renormalised weights in one launch (the reference "
             "makes ~7 a MoE layer); grouped routing and sqrt-softplus scoring take a torch path", _moe_route),
    Template("moe_experts.triton_fused", "moe_experts", "triton_moe_experts.py", "moe_experts_triton",
             "triton", ("cuda",), MOE_KNOBS,
             "fused MoE: pairs aligned by expert on device, grouped w13 GEMM with SiLU*up epilogue, grouped "
             "w2 GEMM times the routing weight, deterministic k-sum; per-pair GEMVs for few pairs",
             _moe),
    Template("moe_experts_situ.triton_fused", "moe_experts_situ", "triton_moe_experts.py",
             "moe_experts_situ_triton", "triton", ("cuda",), MOES_KNOBS,
             "fused MoE with Kimi-K3's SiTU-GLU epilogue (moe_experts.triton_fused's kernels otherwise)",
             _moes),
    Template("moe_experts_clamp.triton_fused", "moe_experts_clamp", "triton_moe_experts.py",
             "moe_experts_clamp_triton", "triton", ("cuda",),
             MOEC_KNOBS,
             "DeepSeek-V4's experts as the fused MoE with the clamped SwiGLU (swiglu_limit) in the w13 epilogue",
             _moec),
    Template("attention_decode_window.triton", "attention_decode_window", "triton_attention_window.py",
             "attention_decode_window_triton", "triton", ("cuda",),
             (Knob("ATTW_BLOCK_T", (16, 8, 32, 64)), Knob("ATTW_NUM_WARPS", (4, 8, 2, 1)),
              Knob("ATTW_NUM_STAGES", (2, 1, 3))),
             "sliding-window decode: GQA group per program, online softmax over the window's tokens only, "
             "sinks in the denominator", _attn_window),
    Template("swigluoai_and_mul.triton", "swigluoai_and_mul", "triton_glu_and_mul.py", "swigluoai_and_mul_triton",
             "triton", ("cuda",),
             (Knob("SOAI_BLOCK_I", (1024, 512, 2048, 4096, 256, 128, 64)), Knob("SOAI_NUM_WARPS", POW2_WARPS)),
             "clamped alpha-sigmoid gate times (up + 1) in fp32, one pass, one rounding", _glu("SOAI")),
    Template("gelu_tanh_and_mul.triton", "gelu_tanh_and_mul", "triton_glu_and_mul.py", "gelu_tanh_and_mul_triton",
             "triton", ("cuda",),
             (Knob("GELU_BLOCK_I", (1024, 512, 2048, 4096, 256, 128, 64)), Knob("GELU_NUM_WARPS", POW2_WARPS)),
             "Gemma's GeGLU (tanh-approximated gelu gate times up) in fp32, one pass, one rounding", _glu("GELU")),
    Template("kda_decode.triton", "kda_decode", "triton_kda_decode.py", "kda_decode_triton", "triton", ("cuda",),
             (Knob("KDA_BLOCK_V", (32, 16, 64, 8, 128)), Knob("KDA_NUM_WARPS", (4, 2, 8, 1))),
             "Kimi delta attention decode step in one kernel: gate, l2 norms, decay, delta update and output with "
             "the fp32 state tile in registers (one read and one write of the state)", _kda),
    Template("situ_and_mul.triton", "situ_and_mul", "triton_glu_and_mul.py", "situ_and_mul_triton", "triton",
             ("cuda",), (Knob("SITU_BLOCK_I", (1024, 512, 2048, 4096, 256, 128, 64)), Knob("SITU_NUM_WARPS", POW2_WARPS)),
             "Kimi-K3 SiTU-GLU (tanh-clipped gate and up) in fp32, one pass, one rounding", _glu("SITU", row=False)),
    Template("swiglu_clamp_and_mul.triton", "swiglu_clamp_and_mul", "triton_glu_and_mul.py",
             "swiglu_clamp_and_mul_triton", "triton", ("cuda",),
             (Knob("SWCL_BLOCK_I", (1024, 512, 2048, 4096, 256, 128, 64)), Knob("SWCL_NUM_WARPS", POW2_WARPS)),
             "DeepSeek-V4 clamped SwiGLU (swiglu_limit) in fp32, one pass, one rounding", _glu("SWCL", row=False)),
    Template("hc_post.triton", "hc_post", "triton_hc_post.py", "hc_post_triton", "triton", ("cuda",),
             (Knob("HCP_BLOCK_D", (512, 256, 1024, 2048, 128, 64, 16)), Knob("HCP_NUM_WARPS", POW2_WARPS)),
             "DeepSeek-V4 hyper-connection expand + mix: each D-block of the N streams read once, fp32, one "
             "rounding", _hc_post),
    Template("hc_pre.triton", "hc_pre", "triton_hc_pre.py", "hc_pre_triton", "triton", ("cuda",),
             (Knob("HCPR_SPLIT_K", (16, 8, 32, 4, 2, 1)), Knob("HCPR_BLOCK_K", (128, 64, 256, 512, 32)),
              Knob("HCPR_BLOCK_T", (2, 1, 4)), Knob("HCPR_NUM_WARPS", POW2_WARPS),
              Knob("HCPR_BLOCK_D", (1024, 512, 2048, 4096, 256, 128, 64, 16)),
              Knob("HCPR_COLLAPSE_WARPS", POW2_WARPS)),
             "DeepSeek-V4 hyper-connection weights + collapse: split-K GEMV of the mHC logits (RMS factored out, "
             "deterministic two-stage sum), then per token the sigmoids, softmax and Sinkhorn on N x N in "
             "registers and the pre-weighted collapse of each D-block; fp32, one rounding", _hc_pre),
    Template("sparse_mla_decode.triton", "sparse_mla_decode", "triton_sparse_mla_decode.py",
             "sparse_mla_decode_triton", "triton", ("cuda",),
             (Knob("SMLA_BLOCK_H", (16, 32, 64)), Knob("SMLA_BLOCK_K", (32, 16, 64, 128)),
              Knob("SMLA_NUM_WARPS", (8, 4, 2, 1)), Knob("SMLA_NUM_STAGES", (2, 1, 3))),
             "DSA decode over the indexer's selected latent rows: a head block per program (each row read once "
             "for BLOCK_H heads), online softmax, tl.dot for scores and p @ c", _sparse_mla),
    Template("compressed_attention.triton", "compressed_attention", "triton_compressed_attention.py",
             "compressed_attention_triton", "triton", ("cuda",),
             (Knob("CSAA_BLOCK_H", (16, 32, 64)), Knob("CSAA_BLOCK_T", (32, 16, 64)),
              Knob("CSAA_BLOCK_E", (32, 16, 64, 128)), Knob("CSAA_NUM_WARPS", (8, 4, 16, 2)),
              Knob("CSAA_NUM_STAGES", (2, 1, 3)), Knob("CSAA_SPLITS", (0, 1, 2, 4, 8, 16))),
             "DeepSeek-V4 attention (K = V, one head) over the sliding window and the compressed entries (all, or "
             "the indexer's picks): a head block per program (each row read once for BLOCK_H heads), online "
             "softmax with tl.dot for scores and p @ k, sinks in the denominator; any chunk (decode and prefill); "
             "CSAA_SPLITS: split-KV shares merged by a second kernel (0: when the head blocks fill under half the SMs)",
             _compressed_attn),
    Template("gated_delta_decode.triton", "gated_delta_decode", "triton_gated_delta.py", "gated_delta_decode_triton",
             "triton", ("cuda",), (Knob("GDD_BLOCK_V", (32, 16, 64, 128)), Knob("GDD_NUM_WARPS", (4, 2, 8, 1))),
             "Gated DeltaNet decode: a (sequence, value head, Dv block) per program, the fp32 state tile read "
             "once and written once, q/k L2-normalised in registers", _gated_delta),
)

ANY = ("cpu", "cuda")

TORCH_TEMPLATES: tuple[Template, ...] = (
    Template("rms_norm.torch_fused", "rms_norm", "torch_norms.py", "rms_norm_torch", "torch", ANY,
             (Knob("TRMS_IMPL", ("fused", "fp32_inplace")),), "RMSNorm as one fused torch kernel"),
    Template("fused_add_rms_norm.torch_fused", "fused_add_rms_norm", "torch_fused_add.py",
             "fused_add_rms_norm_torch", "torch", ANY, (Knob("TFARN_IMPL", ("bf16_add", "fp32_add")),),
             "residual add once, then the fused RMSNorm kernel"),
    Template("silu_and_mul.torch_direct", "silu_and_mul", "torch_silu_and_mul.py", "silu_and_mul_torch",
             "torch", ANY, (Knob("TSAM_IMPL", ("direct", "inplace", "fp32_inplace")),),
             "SiLU and product without an fp32 copy of the input"),
    Template("linear.torch_small_m", "linear", "torch_linear.py", "linear_torch", "torch", ("cpu",),
             (Knob("TLIN_FP32_MAX_M", (8, 1, 2, 4, 16, 32)),),
             "few-row GEMMs on CPU through the fp32 BLAS path instead of the bf16 oneDNN set-up"),
    Template("lm_head.torch_prepacked", "lm_head", "torch_lm_head_prepacked.py", "lm_head_prepacked", "torch",
             ("cpu",), (Knob("TLMH_PACK_BATCH", (1, 2, 8, 32)),),
             "vocabulary GEMM on the weight packed once into oneDNN's layout (bit-identical, no per-call re-layout)"),
    Template("rotary_embedding.torch_joint", "rotary_embedding", "torch_rotary.py", "rotary_embedding_torch",
             "torch", ANY, (Knob("TROPE_IMPL", ("joint", "separate")),),
             "q and k rotated in one pass"),
    Template("gated_delta_decode.torch_onepass", "gated_delta_decode", "torch_gated_delta.py",
             "gated_delta_decode_torch", "torch", ANY, (Knob("TGD_MATMUL", ("bmm", "einsum")),),
             "gated delta rule decode reading the state once ([q; k] @ S) and writing it once (baddbmm)"),
    Template("attention_decode.torch_bmm", "attention_decode", "torch_attention_decode.py",
             "attention_decode_torch", "torch", ANY, (Knob("TATT_IMPL", ("bf16_matmul", "fp32_matmul", "sdpa")),),
             "paged decode attention as batched GEMMs (or SDPA) over the gathered pages"),
)


def _composite_knobs(p: str, block_n: tuple, split_k: tuple) -> tuple[Knob, ...]:
    return (Knob(f"{p}_BLOCK_N", block_n), Knob(f"{p}_BLOCK_K", (512, 256, 1024, 128, 64)),
            Knob(f"{p}_BLOCK_M", (1, 2, 4)), Knob(f"{p}_SPLIT_K", split_k),
            Knob(f"{p}_NUM_WARPS", POW2_WARPS), Knob(f"{p}_NUM_STAGES", (3, 2, 4, 1)),
            Knob(f"{p}_MAX_T", (1, 4, 8, 16, 32)), Knob(f"{p}_TILED", (0, 1, 2)), Knob(f"{p}_TILE_M", (64, 32, 16, 128)),
            Knob(f"{p}_TILE_N", (64, 128, 32, 256)), Knob(f"{p}_TILE_K", (64, 32, 128)),
            Knob(f"{p}_TILE_WARPS", (4, 8, 2)), Knob(f"{p}_TILE_STAGES", (3, 4, 2, 5)), Knob(f"{p}_PDL", (0, 1)),
            Knob(f"{p}_FUSED_REDUCE", (0, 1)))


# composite ops (persistent_engine.ops.fused): one kernel instead of norm/activation + linear
COMPOSITE_TEMPLATES: tuple[Template, ...] = (
    Template("add_rms_norm_linear.triton_fused", "add_rms_norm_linear", "triton_add_rms_norm_linear.py",
             "add_rms_norm_linear_triton", "triton", ("cuda",),
             _composite_knobs("ARNL", (8, 16, 4, 32, 2), (1, 2, 4, 8)),
             "residual add + RMSNorm + projection in one pass over W: rms factored out of the dot, "
             "split-K GEMV for decode, norm in the A-tile prologue of a tl.dot GEMM for prefill; "
             "ARNL_PDL: programmatic dependent launch (SM90+), the first W tile loads before waiting on x; "
             "ARNL_FUSED_REDUCE: the last-arriving program of each tile reduces it (no reduce launch)",
             _fused_linear("ARNL", "hidden")),
    Template("silu_mul_linear.triton_fused", "silu_mul_linear", "triton_silu_mul_linear.py",
             "silu_mul_linear_triton", "triton", ("cuda",),
             _composite_knobs("SML", (8, 16, 4, 32, 2), (2, 1, 4, 8, 16)),
             "SiLU(gate) * up computed in the GEMV prologue (never written), split-K with a "
             "deterministic two-pass reduce; tl.dot GEMM with the activation in the A tile for prefill; "
             "SML_PDL: programmatic dependent launch (SM90+), the first W tile loads before waiting on x; "
             "SML_FUSED_REDUCE: the last-arriving program of each tile reduces it (no reduce launch)",
             _fused_linear("SML", "intermediate")),
    Template("add_rms_norm_qkv_rotary.triton_fused", "add_rms_norm_qkv_rotary", "triton_add_rms_norm_qkv_rotary.py",
             "add_rms_norm_qkv_rotary_triton", "triton", ("cuda",), _qkv_rotary_knobs("QKVR"),
             "residual add + RMSNorm + qkv projection + neox rotary: split-K GEMV (rms factored out of the dot, "
             "fp32 partials) whose reduce owns whole heads and rotates q/k there; torch composition for prefill; "
             "QKVR_PDL: programmatic dependent launch (SM90+), the first W tile loads before waiting on x",
             _qkv_rotary("QKVR")),
    # a region op (persistent_engine.ops.layers): dense GQA models without QK-norm call it per layer at decode
    Template("add_rms_norm_qkv_rotary_kv_write.triton_fused", "add_rms_norm_qkv_rotary_kv_write",
             "triton_add_rms_norm_qkv_rotary.py", "add_rms_norm_qkv_rotary_kv_write_triton", "triton", ("cuda",),
             _qkv_rotary_knobs("QKVW"),
             "add_rms_norm_qkv_rotary.triton_fused's GEMV and reduce, the reduce storing the rotated k and the v "
             "heads straight into the paged K/V cache at the token's slot: no K/V write launches, no k/v round "
             "trip; torch composition + index_copy_ for prefill; QKVW_PDL: programmatic dependent launch (SM90+)",
             _qkv_rotary("QKVW")),
    Template("add_rms_norm_linear.torch_fused", "add_rms_norm_linear", "torch_add_rms_norm_linear.py",
             "add_rms_norm_linear_torch", "torch", ANY, (Knob("TARNL_FP32_MAX_M", (8, 0, 1, 16, 64)),),
             "fp32 add, one fused rms_norm kernel and the projection in one composition"),
    Template("silu_mul_linear.torch_fused", "silu_mul_linear", "torch_silu_mul_linear.py",
             "silu_mul_linear_torch", "torch", ANY, (Knob("TSML_FP32_MAX_M", (8, 0, 1, 16, 64)),),
             "SiLU and product in fp32 feeding the projection in one composition"),
)

TEMPLATES: tuple[Template, ...] = TRITON_TEMPLATES + TORCH_TEMPLATES + COMPOSITE_TEMPLATES

_BY_NAME = {t.name: t for t in TEMPLATES}
if len(_BY_NAME) != len(TEMPLATES):
    raise RuntimeError("duplicate template names in the library")


def get_template(name: str) -> Template:
    try:
        return _BY_NAME[name]
    except KeyError:
        raise TemplateError(f"unknown template {name!r}; known: {', '.join(_BY_NAME)}") from None


def templates_for(op: str | None = None, device: str | None = None) -> list[Template]:
    """Templates of ``op`` (all ops when None) worth timing on ``device`` ("cpu"/"cuda"; all when None)."""
    return [t for t in TEMPLATES if (op is None or t.op == op) and (device is None or t.available_on(device))]
