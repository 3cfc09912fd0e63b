"""``tkcc parallelism --model M --hw H --gpus N [--traffic FILE] [--ttft-ms X] [--tpot-ms Y] [--framework F] [--json]``

Searches TP / PP / EP / DP-attention / DCP layouts, weight and KV-cache dtypes, batch sizes and
prefill/decode disaggregation with the cost model (per-op curves fitted on measured vLLM kernels,
cost_model.efficiency; ``--calibration`` replaces them with a fitted per-class calibration); prints a
table (or one JSON document with ``configs`` and ``best``, plus ``objective``). With no SLA the
objective is stated (cost_model.search.DEFAULT_OBJECTIVE). Quantized weights (below the checkpoint's
dtype) and an fp8 KV cache are quality trade-offs, chosen only with ``--allow-quantized``. Exit 0
when a config fits and meets the objective, 1 when none does (the reason is printed plainly), 2 on
bad input. Layouts follow one framework's sharding (``--framework``, vLLM by default; docs/parallelism.md
says how to read the label, the memory and the flags); the best config's launch flags are printed per
framework, and every JSON config carries them under ``serving``.

``--traffic`` takes a trace (any format traffic_profiles reads), a saved traffic profile JSON, or
a JSON list of workload points (``{"points": [...]}`` also works).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from compiler.validate import count, input_file, positive_float

TABLE_ROWS = 15


def register(sub) -> None:
    p = sub.add_parser("parallelism", help="choose a parallelism layout with the cost model")
    p.add_argument("--model", required=True, help="model alias or path to an HF config.json")
    p.add_argument("--hw", required=True, help="hardware name (h100, h200, b200, b300, gb200, gb300, "
                                                "mi300x, mi355x, cpu) or alias")
    p.add_argument("--gpus", type=count(1, 1 << 20), required=True, help="GPUs to lay the model out on")
    p.add_argument("--traffic", help="trace, traffic profile JSON or workload points JSON")
    p.add_argument("--ttft-ms", type=positive_float, default=None, help="time-to-first-token SLA")
    p.add_argument("--tpot-ms", type=positive_float, default=None, help="time-per-output-token SLA")
    p.add_argument("--calibration", help="per-class calibration JSON instead of the measured-kernel curves")
    p.add_argument("--allow-quantized", action="store_true",
                   help="let the best config quantize weights below the checkpoint's dtype or the KV cache to fp8")
    p.add_argument("--framework", choices=("vllm", "sglang"), default="vllm",
                   help="serving framework whose sharding and flags the layouts follow (default vllm)")
    p.add_argument("--json", action="store_true", help="print one JSON document (each config's serving flags "
                                                        "per framework under 'serving')")
    p.set_defaults(func=handle)


def load_traffic(path: str):
    """TrafficShape from a points JSON, a profile JSON or a trace file."""
    from cost_model import CostModelError, TrafficShape
    from persistent_engine import WorkloadPoint

    f = Path(path)
    if not f.exists():
        raise FileNotFoundError(2, "No such file or directory", path)
    if f.suffix == ".json":
        try:
            doc = json.loads(f.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise CostModelError(f"{path}: not valid JSON: {e}") from None
        points = doc.get("points") if isinstance(doc, dict) and "kind" not in doc else doc
        if isinstance(points, list):
            if not all(isinstance(p, dict) for p in points):
                raise CostModelError(f"{path}: workload points must be JSON objects")
            try:
                return TrafficShape.from_points([WorkloadPoint.from_dict(p) for p in points])   # the file's boundary
            except (KeyError, TypeError, ValueError) as e:
                raise CostModelError(f"{path}: bad workload point: {e!r}") from None
        return TrafficShape.from_profile(doc)
    import traffic_profiles
    read_trace = getattr(traffic_profiles, "read_trace", None)
    build_profile = getattr(traffic_profiles, "build_profile", None)
    if read_trace is None or build_profile is None:
        from traffic_profiles import build_profile
        from traffic_profiles import read_trace
    return TrafficShape.from_profile(build_profile(read_trace(path)))


def handle(args) -> int:
    from cost_model import SLA, CostModelError, get_hardware, load_calibration, search
    from persistent_engine.models.spec import ModelSpec

    if args.gpus < 1:
        raise CostModelError(f"--gpus must be >= 1, got {args.gpus}")
    for name in ("ttft_ms", "tpot_ms"):
        v = getattr(args, name)
        if v is not None and v <= 0:
            raise CostModelError(f"--{name.replace('_', '-')} must be > 0, got {v:g}")
    for flag, path in (("--traffic", args.traffic), ("--calibration", args.calibration)):
        if path is not None:
            input_file(path, flag)
    spec = ModelSpec.from_name(args.model)
    hw = get_hardware(args.hw)
    traffic = load_traffic(args.traffic) if args.traffic else None
    calib = load_calibration(hw.name, path=args.calibration) if args.calibration else None
    result = search(spec, hw, args.gpus, traffic, SLA(args.ttft_ms, args.tpot_ms),
                    eff=calib.efficiency if calib else None, allow_quantized=args.allow_quantized,
                    framework=args.framework)
    if args.json:
        d = result.to_dict()
        d["calibration"] = calib.summary() if calib else None
        json.dump(d, sys.stdout)
        sys.stdout.write("\n")
    else:
        print(format_table(result, calib))
    return 0 if result.best is not None else 1


def format_table(result, calib=None) -> str:
    t = result.traffic
    how = ("calibrated (" + calib.summary()["source"] + ")" if calib else
           "uncalibrated roofline" if result.hw == "cpu" else "per-op curves of measured vLLM kernels")
    rate = f", {t.rate:g} req/s (CV {t.interarrival_cv:.2f})" if t.rate else ""
    lines = [f"{result.model} on {result.gpus}x {result.hw}; traffic: {t.isl} in / {t.osl} out tokens{rate}, "
             f"prefix hit {t.prefix_hit:.0%}; {how}",
             f"objective: {result.objective}" + ("" if result.allow_quantized else
                                                 "; quantized configs (q) are listed, not chosen (--allow-quantized)"),
             f"{'layout':<26} {'inst':>4} {'pd':>9} {'batch':>6} {'mem GB':>7} {'TTFT ms':>9} {'TPOT ms':>9} "
             f"{'tok/s/GPU':>10} {'tok/s/user':>10}  flags"]
    rows = [c for c in result.configs if c.fits][:TABLE_ROWS]
    if result.best is not None and result.best not in rows:
        rows.append(result.best)
    for c in rows:
        flags = " ".join(f for f, on in (("best", c is result.best), ("pareto", c.pareto),
                                         ("sla-miss", not c.meets_sla), ("q", bool(c.quality)),
                                         ("overloaded", not c.stable)) if on)
        label = c.layout.label() + (f" kv-{c.layout.kv_dtype}" if c.layout.kv_dtype != "bf16" else "")
        ttft = f"{c.ttft_ms:>9.2f}" if c.stable else f"{'inf':>9}"
        lines.append(f"{label:<26} {c.replicas:>4} {c.pd:>9} {c.batch:>6} {c.memory.total / 1e9:>7.1f} "
                     f"{ttft} {c.tpot_ms:>9.2f} {c.tokens_per_s_per_gpu:>10.1f} "
                     f"{c.tokens_per_s_per_user:>10.1f}  {flags}")
    unfit = sum(1 for c in result.configs if not c.fits)
    if unfit:
        lines.append(f"({unfit} layouts do not fit in memory)")
    lines.append(result.message)
    if result.best is not None:
        lines += serve_lines(result.best)
    return "\n".join(lines)


def serve_lines(config) -> list[str]:
    """The best config's launch flags per framework, or why that framework cannot launch it."""
    out = []
    for fw, s in config.serving.items():
        if s.get("flags") is None:
            out.append(f"  {fw}: no flags: {s['reason']}")
        else:
            out.append(f"  {fw} flags: {' '.join(s['flags'])}  ({s['weights_gb']:.1f} GB weights per GPU)")
    return out
