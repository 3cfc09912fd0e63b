"""What an expert kernel engineer looks at before writing a kernel, as plain JSON-able dicts for the
LLM tools (``agents.llm.tools``): where the time goes per op and per workload point against its
roofline, the hardware's facts, and the template library as worked examples.

Roofline (``roofline``): for each workload point the cost model's FLOPs and bytes of the engine's
*reference* forward (``cost_model.ops_reference``: the torch ops the engine runs without overrides,
one layer of each distinct kind, as the fast tier holds) are grouped by the registry op they belong
to (GEMM rows such as ``qkv_proj`` or ``mlp_down`` are ``linear``; ``final_norm`` is a
``fused_add_rms_norm``; ``moe_experts_dense`` is ``moe_experts``). Per op: ``flops``, ``bytes``,
``roofline_ms`` = max(bytes / HBM bandwidth, FLOPs / peak) summed over its occurrences (no kernel
launch cost: the floor a perfect kernel would reach), ``measured_ms`` from the engine's profile at
that point, ``achieved`` = roofline / measured (1.0 is at the roofline; 0.05 leaves 20x on the table)
and ``bound`` (memory or compute). Cost: one cost-model walk per point (microseconds).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from persistent_engine import WorkloadPoint, point_key

# cost-model reference op name -> registry op (names that are registry ops map to themselves)
_AS_REGISTRY = {"final_norm": "fused_add_rms_norm", "qk_norm": "rms_norm", "q_a_norm": "rms_norm",
                "kv_a_norm": "rms_norm", "shared_silu": "silu_and_mul", "moe_experts_dense": "moe_experts",
                "moe_experts_loop": "moe_experts", "router": "linear"}


def registry_op(name: str, cls: str, known: Sequence[str]) -> str | None:
    """The registry op a cost-model row belongs to; None for glue the engine does not dispatch
    (embedding residual zeros, splits, KV cache writes, the fp32 logits copy)."""
    if name in known:
        return name
    mapped = _AS_REGISTRY.get(name)
    if mapped is None and cls == "gemm" and name.endswith(("_proj", "_up", "_down", "gate_up")):
        mapped = "linear"
    return mapped if mapped in known else None


def _measured(profile: Mapping[str, Any], point: WorkloadPoint) -> dict[str, float]:
    """``{op: ms}`` of the profile row for ``point`` (matched on phase, batch, context, chunk)."""
    for row in (profile.get("per_point") or []) if isinstance(profile, Mapping) else []:
        if point_key(row.get("point") or {}) == point.key:        # the profile's rows: JSON maps
            out = {}
            for op, v in (row.get("ops") or {}).items():
                ms = v.get("ms") if isinstance(v, Mapping) else v
                if isinstance(ms, (int, float)) and not isinstance(ms, bool):
                    out[op] = float(ms)
            return out
    return {}


def hardware(hw_name: str | None) -> dict:
    """The facts of ``hw_name`` from the cost model's catalogue (``cpu`` is probed here)."""
    from cost_model import get_hardware

    hw = get_hardware(hw_name or "cpu")
    return {"name": hw.name, "label": hw.label, "hbm_gib": round(hw.hbm_bytes / 2 ** 30, 1),
            "hbm_gb_per_s": round(hw.hbm_bw / 1e9, 1), "usable_gb_per_s": round(hw.mem_bw / 1e9, 1),
            "peak_tflops": {k: v for k, v in hw.tflops.items()}, "compute_efficiency": hw.compute_efficiency,
            "kernel_overhead_us": round(hw.kernel_overhead_s * 1e6, 2), "scale_up_gpus": hw.domain,
            "measured": hw.measured,
            "ridge_flops_per_byte": {k: round(v * 1e12 * hw.compute_efficiency / hw.mem_bw, 1)
                                     for k, v in hw.tflops.items() if v}}


def roofline(spec: Any, hw_name: str | None, points: Sequence[WorkloadPoint],
             profile: Mapping[str, Any], known_ops: Sequence[str], op: str | None = None) -> dict:
    """Per workload point, per registry op: FLOPs, bytes, roofline vs measured ms (see the module
    docstring); ``op`` keeps one op. Points are ordered as given (with their traffic weight)."""
    from cost_model import Layout, get_hardware
    from cost_model import op_parts
    from cost_model import reference_step_ops

    if spec is None:
        raise ValueError("no model spec in this run: the roofline needs one")
    hw = get_hardware(hw_name or "cpu")
    layers: dict[str, int] = {}
    for i in range(spec.num_layers):
        layers.setdefault(spec.layer_kind(i), i)
    out = []
    for p in points:
        batch, ctx = int(p.batch), int(p.context)
        n = int(p.chunk) if p.phase == "prefill" else 1
        rows: dict[str, dict] = {}
        for o in reference_step_ops(spec, Layout(), batch, n, ctx, sorted(layers.values()), 1.0):
            name = registry_op(o.name, o.cls, known_ops)
            if name is None or (op is not None and name != op):
                continue
            t_mem, t_comp = op_parts(o, hw)
            r = rows.setdefault(name, {"flops": 0.0, "bytes": 0.0, "roofline_ms": 0.0, "memory_ms": 0.0,
                                       "parts": []})
            r["flops"] += o.flops * o.count
            r["bytes"] += o.bytes * o.count
            r["roofline_ms"] += max(t_mem, t_comp) * o.count * 1e3
            r["memory_ms"] += t_mem * o.count * 1e3
            r["parts"].append(o.name)
        measured = _measured(profile, p)
        for name in measured:               # measured ops the cost model has no row for
            if name not in rows and (op is None or name == op):
                rows[name] = None
        ops = []
        for name, r in sorted(rows.items(), key=lambda kv: -measured.get(kv[0], 0.0)):
            ms = measured.get(name)
            if r is None:
                ops.append({"op": name, "measured_ms": ms, "roofline_ms": None, "achieved": None,
                            "note": "not in the cost model's reference step"})
                continue
            ops.append({"op": name, "measured_ms": ms, "roofline_ms": float(f"{r['roofline_ms']:.6g}"),
                        "achieved": None if not ms else float(f"{r['roofline_ms'] / ms:.4g}"),
                        "bound": "memory" if r["memory_ms"] >= r["roofline_ms"] - 1e-12 else "compute",
                        "flops": r["flops"], "bytes": r["bytes"],
                        "flops_per_byte": round(r["flops"] / r["bytes"], 2) if r["bytes"] else None,
                        "cost_model_rows": sorted(set(r["parts"]))})
        out.append({"point": p.to_dict(), "ops": ops})
    return {"hardware": hw.name, "layers": layers, "points": out,
            "note": "roofline_ms: max(bytes/bandwidth, flops/peak) of the reference op's traffic, no launch "
                    "cost; achieved = roofline_ms / measured_ms (1 is at the roofline)"}


def template_index(device: str | None) -> list[dict]:
    """The template library: name, op, backend, knobs (first value is the default), description."""
    from agents.templates import templates_for

    return [{"name": t.name, "op": t.op, "backend": t.backend, "devices": list(t.devices),
             "knobs": {k.name: list(k.values) for k in t.knobs}, "description": t.description}
            for t in templates_for(device=device)]


def template_source(name: str, knobs: Mapping[str, Any] | None = None) -> dict:
    """A template rendered as a complete candidate (its default knobs, or ``knobs``): a worked
    example of a kernel the engine accepts, with its knob space."""
    from agents.templates import Choice, get_template, render_candidate

    t = get_template(name)
    chosen = {**t.default(), **dict(knobs or {})}
    bad = t.check(chosen, {})
    if bad:
        raise ValueError("invalid knobs: " + "; ".join(bad))
    return {"name": t.name, "op": t.op, "backend": t.backend, "knobs": chosen,
            "knob_space": {k.name: list(k.values) for k in t.knobs}, "description": t.description,
            "source": render_candidate([Choice(t, chosen)])}
