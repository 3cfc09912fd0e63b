"""cost_model: hardware catalogue, per-op roofline, parallelism search and calibration.

    from cost_model import get_hardware, search, SLA
    hw = get_hardware("h200")
    result = search(ModelSpec.from_name("deepseek-v3"), hw, gpus=8, sla=SLA(tpot_ms=50))
    result.best, result.message

Step times come from per-op efficiency curves fitted on measured vLLM kernels (NVIDIA
AIConfigurator, H100/H200; ``cost_model.efficiency``, shipped under ``cost_model/data``) and
transferred to other GPUs by datasheet ratios; ``cost_model.calibration`` fits tkcc's own engine.
Pure numpy + stdlib (no torch): it runs wherever the compiler runs.
"""

from cost_model.efficiency import CurveEfficiency, OpLatency, collective_latency, curve_efficiency, op_latency
from cost_model.calibration import (Calibration, Measurement, evaluate, fit, load_calibration,
                                    load_measurements)
from cost_model.estimate import Efficiency, StepEstimate, estimate_points, estimate_step, op_parts, op_table
from cost_model.hardware import CostModelError, Hardware, get_hardware, known_hardware, probe_cpu
from cost_model.layout import Layout, MemoryFit, max_batch, memory_fit
from cost_model.ops_reference import reference_step_ops
from cost_model.ops import OP_CLASSES, OpCost, expert_load, step_ops, summarize
from cost_model.queueing import wait_s
from cost_model.search import (DEFAULT_OBJECTIVE, SLA, ConfigResult, SearchResult, enumerate_layouts, pareto_front,
                               search)
from cost_model.traffic import TrafficShape, roofline_step_time

__all__ = [
    "Calibration", "ConfigResult", "CostModelError", "CurveEfficiency", "DEFAULT_OBJECTIVE", "Efficiency", "OpLatency",
    "collective_latency", "curve_efficiency", "op_latency", "wait_s", "Hardware", "Layout", "Measurement",
    "MemoryFit", "OP_CLASSES", "OpCost", "SLA", "SearchResult", "StepEstimate", "TrafficShape",
    "enumerate_layouts", "estimate_points", "estimate_step", "evaluate", "expert_load", "fit",
    "get_hardware", "known_hardware", "load_calibration", "load_measurements", "max_batch", "memory_fit",
    "op_parts", "op_table", "pareto_front", "reference_step_ops", "roofline_step_time", "probe_cpu", "search", "step_ops", "summarize",
]
