"""``tkcc candidate check FILE --model M [--layers N] [--device D] [--timeout S] [--json]``.

Judges one candidate file the way the optimize loop does: static checks here (no engine is started
for a source the policy refuses), then an engine for the slice under a supervisor, and one
``evaluate`` (load, verify, bench, spot re-check) with a watchdog of ``--timeout`` seconds. A
candidate that crashes or hangs the engine is rejected with the reason; this command never crashes
with it. ``--json``: ``correct``, ``reasons``, ``speedup`` (+ ``per_point``, ``timings``,
``restarted``, ``startup``). Exit 0 correct, 1 rejected, 2 bad input. The file's author is unknown, so
it is judged only in a complete executor sandbox unless ``--unsafe-no-sandbox``.
"""

from __future__ import annotations

import json
import sys


class CandidateInputError(ValueError):
    user_error = True


def register(subparsers) -> None:
    p = subparsers.add_parser("candidate", help="judge candidate forward-pass overrides")
    sub = p.add_subparsers(dest="candidate_command", metavar="{check}")
    sub.required = True
    c = sub.add_parser("check", help="verify and time one candidate file (exit 0 correct, 1 rejected)")
    c.add_argument("file", help="candidate source (OVERRIDES, optional CONFIG and DESCRIPTION)")
    c.add_argument("--model", required=True, help="model alias or config.json path")
    c.add_argument("--layers", default=None, help="N (first N layers) or i,j,k (default: fast tier)")
    c.add_argument("--device", default="auto", help="auto | cpu | cuda[:i]")
    c.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    c.add_argument("--timeout", type=float, default=300.0, help="watchdog seconds for the evaluation")
    c.add_argument("--samples", type=int, default=0, help="timed samples per point (0: engine default)")
    c.add_argument("--json", action="store_true", help="print one JSON document")
    c.add_argument("--unsafe-no-sandbox", action="store_true",
                   help="judge the file even where the executor sandbox is incomplete (tkcc doctor)")
    c.set_defaults(func=check)


def _device(name: str) -> str:
    if name != "auto":
        if not (name == "cpu" or name.startswith("cuda")):
            raise CandidateInputError(f"--device must be auto, cpu or cuda[:i], got {name!r}")
        return name
    import torch
    return "cuda" if torch.cuda.is_available() else "cpu"


def check(args) -> int:
    import inspect

    from persistent_engine.__main__ import parse_layers
    from persistent_engine.candidate import param_names, static_check
    from persistent_engine.executor.sandbox import require_sandbox
    from persistent_engine.models.spec import ModelSpec
    from persistent_engine.supervisor import Supervisor

    with open(args.file, encoding="utf-8", errors="replace") as f:
        source = f.read()
    spec = ModelSpec.from_name(args.model)                 # SpecError: exit 2
    require_sandbox(author_is_llm=True, unsafe=args.unsafe_no_sandbox)   # a file of unknown author: exit 2
    if args.timeout <= 0:
        raise CandidateInputError("--timeout must be positive")
    try:
        layers = parse_layers(args.layers)
    except ValueError as e:
        raise CandidateInputError(str(e)) from None
    if layers is not None and any(i < 0 or i >= spec.num_layers for i in layers):
        raise CandidateInputError(f"--layers out of range: {spec.name} has {spec.num_layers} layers")
    device = _device(args.device)
    from persistent_engine.ops import registry     # torch: only once the input is known good
    op_params = {n: param_names(inspect.signature(registry.get(n).reference)) for n in registry.names()}
    reasons = static_check(source, op_params)
    result: dict = {"correct": False, "reasons": reasons, "speedup": None, "per_point": [],
                    "timings": {}, "restarted": False, "startup": {}}
    if not reasons:
        with Supervisor(args.model, layers, device, dtype=args.dtype, auto_restart=False,
                        log=None if args.json else (lambda line: print(line, file=sys.stderr))) as sup:
            verdict = sup.evaluate(source, timeout_s=args.timeout, samples=args.samples)
            result.update(verdict.to_dict())
            result["startup"] = sup.startup
    if args.json:
        print(json.dumps(result))
    else:
        print(f"candidate: {args.file}")
        print(f"correct:   {'yes' if result['correct'] else 'no'}")
        for r in result["reasons"]:
            print(f"  - {r}")
        if result["speedup"] is not None:
            print(f"speedup:   {result['speedup']:.3f}x")
            for p in result["per_point"]:
                print(f"  {p['label']:<28} baseline {p['baseline_ms']:.3f} ms  candidate "
                      f"{p['candidate_ms']:.3f} ms  {p['speedup']:.3f}x")
    return 0 if result["correct"] else 1
