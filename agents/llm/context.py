"""What an expert kernel engineer looks at before writing a kernel, as plain JSON-able dicts for the
LLM tools (``agents.llm.tools``): where the time goes per op and per workload point against its
roofline, the hardware's facts, and the template library as worked examples.

Roofline (``roofline``, from :mod:`agents.roofline`, which the offline search priors share): per
workload point and registry op, the cost model's FLOPs, bytes and roofline ms against the profile's
measured ms (``achieved`` = roofline / measured; 1.0 is at the roofline).
"""

from __future__ import annotations

from typing import Any, Mapping

from agents.roofline import registry_op, roofline

__all__ = ["hardware", "registry_op", "roofline", "template_index", "template_source"]


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
