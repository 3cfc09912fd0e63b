"""Where each registry op stands against its roofline, per workload point: the cost model's FLOPs and
bytes of the engine's *reference* forward (``cost_model.reference_step_ops``: the torch ops the engine
runs without overrides, one layer of each distinct kind, as the fast tier holds) grouped by the
registry op they belong to (GEMM rows such as ``qkv_proj`` or ``mlp_down`` are ``linear``;
``final_norm`` is a ``fused_add_rms_norm``; ``moe_experts_dense`` is ``moe_experts``).

Per op: ``flops``, ``bytes``, ``roofline_ms`` = max(bytes / HBM bandwidth, FLOPs / peak) summed over its
occurrences (no kernel launch cost: the floor a perfect kernel would reach), ``measured_ms`` from the
engine's profile at that point, ``achieved`` = roofline / measured (1.0 is at the roofline; 0.05 leaves
20x on the table) and ``bound`` (memory or compute). Cost: one cost-model walk per point (microseconds).

Imports neither an LLM SDK nor torch: the LLM tools (``agents.llm.context``) and the offline search
priors (``agents.offline.strategy.op_priors``) both read it.
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

from persistent_engine import WorkloadPoint, point_key

__all__ = ["HEADROOM_UNKNOWN", "headroom", "measured_calls", "op_rooflines", "registry_op", "roofline"]

HEADROOM_UNKNOWN = 0.5     # headroom of an op the cost model has no roofline for: neither favoured nor dropped

# cost-model reference op name -> registry op (names that are registry ops map to themselves)
_AS_REGISTRY = {"final_norm": "fused_add_rms_norm", "qk_norm": "rms_norm", "q_a_norm": "rms_norm",
                "kv_a_norm": "rms_norm", "shared_silu": "silu_and_mul", "moe_experts_dense": "moe_experts",
                "moe_experts_loop": "moe_experts", "router": "linear"}

# registry op -> the op whose cost-model row models its traffic: the cost model walks a GLU or an MoE
# with one activation (SiLU), and an activation's arithmetic does not change the bytes moved
_VARIANT_OF = {"moe_experts_situ": "moe_experts", "moe_experts_clamp": "moe_experts",
               "situ_and_mul": "silu_and_mul", "swiglu_clamp_and_mul": "silu_and_mul",
               "swigluoai_and_mul": "silu_and_mul", "gelu_tanh_and_mul": "silu_and_mul"}


def registry_op(name: str, cls: str, known: Sequence[str]) -> str | None:
    """The registry op a cost-model row belongs to; None for glue the engine does not dispatch
    (embedding residual zeros, splits, KV cache writes, the fp32 logits copy)."""
    if name in known:
        return name
    mapped = _AS_REGISTRY.get(name)
    if mapped is None and cls == "gemm" and name.endswith(("_proj", "_up", "_down", "gate_up")):
        mapped = "linear"
    return mapped if mapped in known else None


def measured_calls(profile: Mapping[str, Any], point: Mapping[str, Any] | WorkloadPoint) -> dict[str, tuple[float, int | None]]:
    """``{op: (ms, calls)}`` of the profile row for ``point`` (matched on phase, batch, context, chunk);
    ``calls`` is None where the profile does not count them."""
    key = point.key if isinstance(point, WorkloadPoint) else point_key(point)
    for row in (profile.get("per_point") or []) if isinstance(profile, Mapping) else []:
        if point_key(row.get("point") or {}) == key:        # the profile's rows: JSON maps
            out = {}
            for op, v in (row.get("ops") or {}).items():
                ms = v.get("ms") if isinstance(v, Mapping) else v
                calls = v.get("calls") if isinstance(v, Mapping) else None
                if isinstance(ms, (int, float)) and not isinstance(ms, bool):
                    out[op] = (float(ms), int(calls) if isinstance(calls, int) and not isinstance(calls, bool) else None)
            return out
    return {}


def op_rooflines(spec: Any, hw: Any, point: WorkloadPoint, known_ops: Sequence[str],
                 op: str | None = None) -> dict[str, dict]:
    """``{registry op: {"flops", "bytes", "roofline_ms", "memory_ms", "parts", "rows"}}`` of the cost
    model's reference step at ``point`` on ``hw`` (a ``cost_model`` Hardware); ``rows`` counts the
    op's occurrences (kernel calls) in that step."""
    from cost_model import Layout, op_parts, reference_step_ops

    layers: dict[str, int] = {}
    for i in range(spec.num_layers):
        layers.setdefault(spec.layer_kind(i), i)
    n = int(point.chunk) if point.phase == "prefill" else 1
    rows: dict[str, dict] = {}
    for o in reference_step_ops(spec, Layout(), int(point.batch), n, int(point.context), sorted(layers.values()), 1.0):
        name = registry_op(o.name, o.cls, known_ops)
        if name is None or (op is not None and name != op):
            continue
        t_mem, t_comp = op_parts(o, hw)
        r = rows.setdefault(name, {"flops": 0.0, "bytes": 0.0, "roofline_ms": 0.0, "memory_ms": 0.0,
                                   "parts": [], "rows": 0})
        r["flops"] += o.flops * o.count
        r["bytes"] += o.bytes * o.count
        r["roofline_ms"] += max(t_mem, t_comp) * o.count * 1e3
        r["memory_ms"] += t_mem * o.count * 1e3
        r["parts"].append(o.name)
        r["rows"] += o.count
    return rows


def roofline(spec: Any, hw_name: str | None, points: Sequence[WorkloadPoint],
             profile: Mapping[str, Any], known_ops: Sequence[str], op: str | None = None) -> dict:
    """Per workload point, per registry op: FLOPs, bytes, roofline vs measured ms (see the module
    docstring); ``op`` keeps one op. Points are ordered as given (with their traffic weight)."""
    from cost_model import get_hardware

    if spec is None:
        raise ValueError("no model spec in this run: the roofline needs one")
    hw = get_hardware(hw_name or "cpu")
    layers: dict[str, int] = {}
    for i in range(spec.num_layers):
        layers.setdefault(spec.layer_kind(i), i)
    out = []
    for p in points:
        rows: dict[str, dict | None] = dict(op_rooflines(spec, hw, p, known_ops, op))
        measured = {name: ms for name, (ms, _calls) in measured_calls(profile, p).items()}
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


def headroom(spec: Any, hw_name: str | None, point: WorkloadPoint, profile: Mapping[str, Any],
             known_ops: Sequence[str], default: float = HEADROOM_UNKNOWN) -> dict[str, float]:
    """``{op: 1 - achieved}`` for each op the profile measured at ``point`` (matched to the profile's row):
    what a kernel at the roofline would take off the op's time, in [0, 1]; ``default`` where the cost
    model has no row for the op, or there is no spec or known hardware.

    ``achieved`` = roofline / measured, clipped to [0, 1]. An op measured under an activation variant
    (``moe_experts_situ``) takes its base op's row (``moe_experts``) where the base was not measured.
    Where the profile counts the op's calls and they differ from the reference step's rows, the roofline
    is the rows' mean times the calls: the Kimi-K3 slice's fast tier runs an MLA layer, a layer kind the
    cost model does not walk (23 ``linear`` calls against 9 rows), and llama-1b's composite ops run 3 of
    its 4 GEMMs per layer (1 ``linear`` call left against 4 rows).
    """
    from cost_model import get_hardware

    measured = measured_calls(profile, point)
    if spec is None or not hw_name:
        return {op: default for op in measured}
    try:
        hw = get_hardware(hw_name)
    except (KeyError, ValueError):
        return {op: default for op in measured}
    known = set(known_ops) | set(measured) | {_VARIANT_OF[op] for op in measured if op in _VARIANT_OF}
    rows = op_rooflines(spec, hw, point, sorted(known))
    out = {}
    for op, (ms, calls) in measured.items():
        r = rows.get(op)
        if r is None and op in _VARIANT_OF and _VARIANT_OF[op] not in measured:
            r = rows.get(_VARIANT_OF[op])
        if r is None or ms <= 0 or r["roofline_ms"] <= 0:
            out[op] = default
            continue
        floor = r["roofline_ms"] * (calls / r["rows"] if calls and r["rows"] else 1.0)
        out[op] = 1.0 - min(max(floor / ms, 0.0), 1.0)
    return out
