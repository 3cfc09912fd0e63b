"""``tkcc candidate check FILE --model M [--layers N] [--device D] [--timeout S] [--json]`` and
``tkcc ops --model M``: the ops a model calls (the names a candidate's ``OVERRIDES`` may use).

Judges one candidate file the way the optimize loop does: static checks here (no engine is started
for a source the policy refuses), then an engine for the slice under a supervisor, and one
``evaluate`` (load, verify, bench, spot re-check) with a watchdog of ``--timeout`` seconds. A
candidate that crashes or hangs the engine is rejected with the reason; this command never crashes
with it. ``--json``: ``correct``, ``reasons``, ``speedup`` (+ ``applicable``, ``not_called``,
``per_point``, ``timings``, ``restarted``, ``startup``). Exit 0 correct, 1 rejected, 2 bad input. The text
prints each timed point's medians with their spread (IQR, % of the median), the ratio and the lower quartile
of the pairs' ratios, and whether the gain is above the measured noise (that quartile above 1).

``correct`` says only whether the code is correct. A correct override of an op this model never calls
(the engine's "kernel actually ran" guard) is ``correct: true`` with ``applicable: false`` and its ops
in ``not_called`` (exit 0, speedup null: there is nothing to time on this model). The file's author is unknown, so
it is judged only in a complete executor sandbox unless ``--unsafe-no-sandbox``.
"""

from __future__ import annotations

import json
import re
import sys

from compiler.validate import count, input_file, positive_float


class CandidateInputError(ValueError):
    user_error = True


# the engine's reason for an override of an op the model never calls (persistent_engine guards.never_called)
_NOT_CALLED = re.compile(r"override (\S+) never called: the model does not call")


def applicability(result: dict) -> dict:
    """``result`` with ``applicable`` and ``not_called`` split off the reasons: an override of an op the
    model does not call at any point says nothing against the code (its op-level checks ran and the
    slice's outputs matched, or the engine would have stopped earlier)."""
    not_called = [m.group(1) for r in result["reasons"] if (m := _NOT_CALLED.search(r))]
    others = [r for r in result["reasons"] if not _NOT_CALLED.search(r)]
    out = {**result, "not_called": not_called, "applicable": not not_called}
    if not_called and not others:
        out.update(correct=True, reasons=[])
    return out


def register(subparsers) -> None:
    p = subparsers.add_parser("candidate", help="judge candidate forward-pass overrides")
    sub = p.add_subparsers(dest="candidate_command", metavar="{check}")
    sub.required = True
    c = sub.add_parser("check", help="verify and time one candidate file (exit 0 correct, 1 rejected)")
    c.add_argument("file", help="candidate source (OVERRIDES, optional CONFIG and DESCRIPTION)")
    c.add_argument("--model", required=True, help="model alias or config.json path")
    c.add_argument("--tiny", action="store_true", help="the model's architecture at toy size (every feature kept)")
    c.add_argument("--layers", default=None, help="N (first N layers) or i,j,k (default: fast tier)")
    c.add_argument("--device", default="auto", help="auto | cpu | cuda[:i]")
    c.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    c.add_argument("--timeout", type=positive_float, default=300.0, help="watchdog seconds for the evaluation")
    c.add_argument("--samples", type=count(0), default=0, help="timed samples per point (0: engine default)")
    c.add_argument("--json", action="store_true", help="print one JSON document")
    c.add_argument("--unsafe-no-sandbox", action="store_true",
                   help="judge the file even where the executor sandbox is incomplete (tkcc doctor)")
    c.set_defaults(func=check)
    o = subparsers.add_parser("ops", help="the ops a model calls, with their share of step time")
    o.add_argument("--model", required=True, help="model alias or config.json path")
    o.add_argument("--tiny", action="store_true", help="the model's architecture at toy size (every feature kept)")
    o.add_argument("--layers", default=None, help="N (first N layers) or i,j,k (default: the fast tier's covering set)")
    o.add_argument("--device", default="auto", help="auto | cpu | cuda[:i]")
    o.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    o.add_argument("--json", action="store_true", help="print one JSON document")
    o.set_defaults(func=ops)


def _layers(text: str | None, spec) -> list[int] | None:
    """``--layers`` of ``spec``'s model (None: the default), a bad or out-of-range one as an input error."""
    from persistent_engine import parse_layers

    try:
        layers = parse_layers(text)
    except ValueError as e:
        raise CandidateInputError(str(e)) from None
    if layers is not None and any(i < 0 or i >= spec.num_layers for i in layers):
        raise CandidateInputError(f"--layers out of range: {spec.name} has {spec.num_layers} layers")
    return layers


def _device(name: str) -> str:
    if name != "auto":
        if not (name == "cpu" or name.startswith("cuda")):
            raise CandidateInputError(f"--device must be auto, cpu or cuda[:i], got {name!r}")
        return name
    import torch
    return "cuda" if torch.cuda.is_available() else "cpu"


def check(args) -> int:
    import inspect

    from persistent_engine import param_names, static_check
    from persistent_engine import require_sandbox
    from persistent_engine.models.spec import ModelSpec, tiny_name
    from persistent_engine import Supervisor

    input_file(args.file, "candidate file")
    args.model = tiny_name(args.model, args.tiny)
    with open(args.file, encoding="utf-8", errors="replace") as f:
        source = f.read()
    spec = ModelSpec.from_name(args.model)                 # SpecError: exit 2
    if spec.extra.get("text_only") and not args.json:      # a multimodal wrapper: what is not compiled, one line
        print(spec.extra["text_only"], file=sys.stderr)
    require_sandbox(author_is_llm=True, unsafe=args.unsafe_no_sandbox)   # a file of unknown author: exit 2
    if args.timeout <= 0:
        raise CandidateInputError("--timeout must be positive")
    layers = _layers(args.layers, spec)
    device = _device(args.device)
    from persistent_engine.ops import registry     # torch: only once the input is known good
    op_params = {n: param_names(inspect.signature(registry.get(n).reference)) for n in registry.names()}
    reasons = static_check(source, op_params)
    result: dict = {"correct": False, "reasons": reasons, "speedup": None, "applicable": True, "not_called": [],
                    "per_point": [], "timings": {}, "restarted": False, "startup": {}}
    timings = []                                            # the verdict's PointTiming per point
    if not reasons:
        with Supervisor(args.model, layers, device, dtype=args.dtype, auto_restart=False,
                        log=None if args.json else (lambda line: print(line, file=sys.stderr))) as sup:
            verdict = sup.evaluate(source, timeout_s=args.timeout, samples=args.samples)
            result.update(verdict.to_dict())
            timings = list(verdict.per_point)
            result["startup"] = sup.startup
        result = applicability(result)
    if args.json:
        print(json.dumps(result))
    else:
        print(f"candidate: {args.file}")
        print(f"correct:   {'yes' if result['correct'] else 'no'}")
        if not result["applicable"]:
            print(f"no effect on {spec.name}: it never calls {', '.join(result['not_called'])}")
        for r in result["reasons"]:
            print(f"  - {r}")
        for n in result.get("notes", []):
            print(f"  note: {n}")
        if result.get("untimed"):
            print(f"speedup:   {result['untimed']}")
        if result["speedup"] is not None:
            print(f"speedup:   {result['speedup']:.3f}x  ({noise_summary(timings)})")
            for p in timings:
                print(point_line(p))
    return 0 if result["correct"] else 1


def above_noise(p) -> bool | None:
    """Whether a point's gain (a ``PointTiming``) is above the noise the A/B measured: three quarters of its
    pairs faster (the pairs' lower-quartile ratio above 1). None: the point was not timed (no override runs
    there)."""
    if not p.affected or p.speedup_q1 is None:
        return None
    return float(p.speedup_q1) > 1.0


def _spread(iqr_ms: float, ms: float) -> str:
    return f"IQR {100 * iqr_ms / ms:.1f}%" if ms > 0 else "IQR -"


def point_line(p) -> str:
    """One timed point: both sides' medians and spreads, the ratio, its lower quartile and the noise call."""
    base, cand = p.baseline_ms, p.candidate_ms
    line = (f"  {p.label:<28} baseline {base:.3f} ms ({_spread(p.baseline_iqr_ms, base)})"
            f"  candidate {cand:.3f} ms ({_spread(p.candidate_iqr_ms, cand)})  {p.speedup:.3f}x")
    call = above_noise(p)
    if call is None:
        return line + "  (not timed: no override runs here)"
    return line + f"  q1 {float(p.speedup_q1):.3f}: {'above the noise' if call else 'within the noise'}"


def noise_summary(timings) -> str:
    """How many of the timed points (``PointTiming``) gained beyond the noise."""
    calls = [c for c in (above_noise(p) for p in timings) if c is not None]
    if not calls:
        return "no point timed"
    return f"above the measured noise at {sum(calls)} of {len(calls)} timed point(s)"


def ops(args) -> int:
    """``tkcc ops``: every op the model's step calls at the judge's default points (seeded weights), with its
    calls per step and its share of the step's time per point and weighted by the points' weights: the names
    an ``OVERRIDES`` entry must use to run at all, and where the time goes. Timed per op with a device sync
    (``profile_point``): shares, not what a CUDA graph of the step takes."""
    import torch

    from persistent_engine import build_model, make_workload, profile_point
    from persistent_engine.judge import default_points
    from persistent_engine.models.spec import ModelSpec, tiny_name

    spec = ModelSpec.from_name(tiny_name(args.model, args.tiny))          # SpecError: exit 2
    layers = _layers(args.layers, spec)
    device = torch.device(_device(args.device))
    torch.set_grad_enabled(False)
    dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
    model = build_model(spec, layers=layers or spec.covering_layers(), device=device, dtype=dtype, seed=0)
    points = default_points(device.type)
    profiles = [profile_point(model, make_workload(model, p, seed=1), device) for p in points]
    table = op_shares(points, profiles)
    if args.json:
        print(json.dumps({"model": spec.name, "points": [p.label() for p in points], "ops": table}))
        return 0
    print(f"{spec.name}: ops its step calls (seeded weights, {device.type}; share of the step's op time)")
    print(f"  {'op':<30} {'calls':>5}  " + "  ".join(f"{p.label():>22}" for p in points) + "  weighted")
    for row in table:
        print(f"  {row['op']:<30} {row['calls']:>5}  " + "  ".join(f"{100 * s:>21.1f}%" for s in row["share"])
              + f"  {100 * row['weighted']:>7.1f}%" + (f"  (runs {', '.join(row['parts'])})" if row["parts"] else ""))
    print("A composite runs the finer ops it lists through the registry: overriding one of those reaches it too.")
    return 0


def op_shares(points, profiles: list[dict]) -> list[dict]:
    """Rows {op, calls (per step, the first point's), share (per point), weighted, parts (the finer ops a
    composite runs)}, heaviest first; the weighted share is sum over points of weight x ms over sum of weight
    x step ms."""
    names = sorted({n for prof in profiles for n in prof})
    total = sum(float(p.weight) * sum(v["ms"] for v in prof.values()) for p, prof in zip(points, profiles)) or 1.0
    rows = [{"op": n, "calls": next((prof[n]["calls"] for prof in profiles if n in prof), 0),
             "share": [prof.get(n, {}).get("share", 0.0) for prof in profiles],
             "weighted": sum(float(p.weight) * prof.get(n, {}).get("ms", 0.0)
                             for p, prof in zip(points, profiles)) / total,
             "parts": sorted({q for prof in profiles for q in prof.get(n, {}).get("parts", {})})} for n in names]
    return sorted(rows, key=lambda r: -r["weighted"])
