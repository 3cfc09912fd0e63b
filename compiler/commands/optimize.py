"""``tkcc optimize``, ``tkcc recompile`` and ``tkcc plan show|apply``.

    tkcc optimize  --model M --hw H --traffic FILE [--budget 10m] [--agents offline:auto] [--board URL]
                   [--out DIR] [--device auto|cpu|cuda] [--fast-layers N] [--slow-layers N]
                   [--fleet local|ray] [--ray-address ADDR] [--gpus N] [--aa-runs N] [--json]
                   [--routing-skew ALPHA | --routing-histogram FILE] [--weights PATH]
                   [--llm-budget-usd X] [--llm-budget-tokens N] [--ttft-ms X] [--tpot-ms Y]
    tkcc recompile --plan DIR --traffic FILE [--budget 10m] [--force] [--json]
                   exit 0 either way (no drift: nothing written; drift: a new version beside the old)
    tkcc plan show DIR [--json]      (or --plan DIR, as plan apply and recompile spell it)
    tkcc plan apply --plan DIR [--model M] [--layers i,j] [--device cpu|cuda] [--json]
                   runs the model with the plan's overrides at its workload points against the
                   reference; exit 1 when the outputs differ beyond tolerance
    tkcc plan export --plan DIR --to vllm OUT [--json]
                   writes a pip-installable vLLM plugin package (compiler.export.vllm_package)
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from pathlib import Path


from compiler.validate import UsageError, board_url, count, input_file, output_dir, positive_float

MAX_BUDGET_S = 7 * 24 * 3600.0


def parse_duration(text: str) -> float:
    """``90``, ``90s``, ``10m``, ``1.5h`` -> seconds (more than 0, at most a week)."""
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([smh]?)\s*", str(text))
    if not m:
        raise UsageError(f"bad duration {text!r} (examples: 90s, 10m, 1h)")
    seconds = float(m.group(1)) * {"": 1, "s": 1, "m": 60, "h": 3600}[m.group(2)]
    if not 0 < seconds <= MAX_BUDGET_S:
        raise UsageError(f"bad duration {text!r}: it must be more than 0 and at most {MAX_BUDGET_S / 3600:g}h")
    return seconds


TINY_HELP = "the same architecture at toy size (widths, experts, vocabulary shrunk; every feature kept)"


def _aliases() -> str:
    from persistent_engine.models.spec import alias_help

    return alias_help().replace("%", "%%")


def register(sub: argparse._SubParsersAction) -> None:
    _register_optimize(sub)
    _register_recompile(sub)
    _register_plan(sub)


def _register_optimize(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("optimize", help="search, verify and measure a faster forward pass; write a plan")
    p.add_argument("--model", required=True, help="alias or config.json; aliases: " + _aliases())
    p.add_argument("--tiny", action="store_true", help=TINY_HELP)
    p.add_argument("--hw", required=True, help="target hardware the cost model projects for (h200, b200, cpu...); "
                                               "timings are measured on --device, and outputs name both when they differ")
    p.add_argument("--traffic", required=True, help="traffic log (parquet, Azure CSV, Mooncake JSONL...)")
    p.add_argument("--budget", default="10m", help="wall time of the whole run: start-up, baseline, search, "
                                                    "composition, writing (default 10m)")
    p.add_argument("--agents", default="offline:auto",
                   help="e.g. offline:4, random:4 (the control search), anthropic:2, files:DIR "
                        "(default offline:auto: 4 on CPU, up to 8 on a GPU)")
    p.add_argument("--board", default=None, help="board URL (default sqlite:///OUT/board.db)")
    p.add_argument("--out", default=None, help="plan root directory, versions inside (default plans/<model>)")
    p.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"])
    p.add_argument("--fast-layers", type=count(1), default=None,
                   help="first N layers for the fast tier (default: one layer of each kind)")
    p.add_argument("--slow-layers", type=count(1), default=None,
                   help="first N layers for the slow tier (default 8, fewer where the weights would not fit the GPU)")
    p.add_argument("--fleet", default="local", choices=["local", "ray"])
    p.add_argument("--ray-address", default=None, help="existing Ray cluster (default: RAY_ADDRESS or local)")
    p.add_argument("--max-points", type=count(1), default=4, help="workload points measured (heaviest first)")
    p.add_argument("--gpus", type=count(1), default=None, help="GPUs of the target deployment for the parallelism "
                                                           "layout (default: the GPUs visible, or 1)")
    p.add_argument("--timeout", type=positive_float, default=None,
                   help="engine watchdog per evaluation, seconds (default: a third of --budget, 120 to 300)")
    p.add_argument("--aa-runs", type=count(1), default=3, help="reference-vs-itself runs per tier (noise)")
    p.add_argument("--vs-torch-compile", action="store_true",
                   help="also measure the plan against torch.compile of the slow-tier slice")
    p.add_argument("--fresh", action="store_true",
                   help="do not continue from the newest plan version already in --out (default: re-verify its "
                        "optimizations first and build on them)")
    p.add_argument("--routing-skew", type=float, default=None,
                   help="slow tier's MoE expert load: power-law exponent (default 1.2; 0: uniform random routers)")
    p.add_argument("--routing-histogram", default=None,
                   help="slow tier's MoE expert load from measured per-expert counts (JSON or text, per layer)")
    p.add_argument("--weights", default=None,
                   help="HF safetensors checkpoint (file or directory) both tiers load instead of random weights")
    p.add_argument("--llm-budget-usd", type=float, default=None,
                   help="dollars all LLM agents of the run may spend together (default: no limit)")
    p.add_argument("--llm-budget-tokens", type=int, default=None,
                   help="tokens all LLM agents of the run may spend together (default: no limit)")
    p.add_argument("--ttft-ms", type=positive_float, default=None,
                   help="the deployment's time-to-first-token SLO per request: engine settings are then scored by "
                        "their goodput (tokens/s of requests within the SLO) and the layout meets it")
    p.add_argument("--tpot-ms", type=positive_float, default=None,
                   help="the deployment's time-per-output-token SLO per request (as --ttft-ms)")
    p.add_argument("--quiet", action="store_true", help="no progress view")
    p.add_argument("--json", action="store_true", help="the result as JSON on stdout (progress stays on stderr)")
    p.add_argument("--unsafe-no-sandbox", action="store_true",
                   help="run LLM-written candidates even where the executor sandbox is incomplete (tkcc doctor)")
    p.set_defaults(func=_optimize)


def _register_recompile(sub: argparse._SubParsersAction) -> None:
    r = sub.add_parser("recompile", help="recompile a plan when its traffic drifted")
    r.add_argument("--plan", required=True, help="plan root directory written by optimize (its next version "
                   "is written there)")
    r.add_argument("--traffic", required=True, help="the new traffic log, compared with the plan's profile")
    r.add_argument("--budget", default="10m", help="wall time of the recompile when the traffic drifted")
    r.add_argument("--force", action="store_true", help="recompile even without drift")
    r.add_argument("--agents", default=None, help="agent pool as for optimize (default: the plan's run)")
    r.add_argument("--board", default=None, help="board URL (default sqlite:///PLAN/board.db)")
    r.add_argument("--device", default="auto", choices=["auto", "cpu", "cuda"], help="device the engines use")
    r.add_argument("--fleet", default="local", choices=["local", "ray"], help="where the engines run")
    r.add_argument("--quiet", action="store_true", help="no progress view")
    r.add_argument("--json", action="store_true", help="the result as JSON on stdout")
    r.set_defaults(func=_recompile)


def _register_plan(sub: argparse._SubParsersAction) -> None:
    pl = sub.add_parser("plan", help="inspect or apply a plan")
    psub = pl.add_subparsers(dest="plan_command", metavar="COMMAND")
    psub.required = True
    s = psub.add_parser("show", help="summary of a plan (newest version, or a vN directory)")
    s.add_argument("plan", nargs="?", default=None, help="plan directory (or give it as --plan)")
    s.add_argument("--plan", dest="plan_opt", default=None, help="plan directory, as plan apply spells it")
    s.add_argument("--json", action="store_true", help="the summary as JSON on stdout")
    s.set_defaults(func=_show)
    a = psub.add_parser("apply", help="run the model with the plan's overrides and check them")
    a.add_argument("--plan", required=True, help="plan directory (root or vN) whose kernels are checked")
    a.add_argument("--model", default=None,
                   help="alias, config.json or HF checkpoint directory (its weights are loaded; default: the "
                        "plan's model, seeded random weights unless it is a checkpoint)")
    a.add_argument("--layers", default=None, help="layer indices, e.g. 0,1 (default: the fast tier)")
    a.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    a.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    a.add_argument("--vs-torch-compile", action="store_true",
                   help="also time the plan against torch.compile of the same slice (compiler.plan.compare)")
    a.add_argument("--json", action="store_true", help="the checks as JSON on stdout")
    a.set_defaults(func=_apply)
    e = psub.add_parser("export", help="write the plan as a package another engine loads (vLLM: a plugin)")
    e.add_argument("out", metavar="OUT", help="package directory to create (absent or empty)")
    e.add_argument("--plan", required=True, help="plan directory (root or vN) whose kernels are exported")
    e.add_argument("--to", required=True, choices=["vllm"],
                   help="target engine: vllm (a vllm.general_plugins package of out-of-tree CustomOps)")
    e.add_argument("--json", action="store_true", help="the package's manifest as JSON on stdout")
    e.set_defaults(func=_export)


def _print_json(doc: dict) -> None:
    print(json.dumps(doc, indent=2, sort_keys=True, default=str))


def watchdog_s(budget_s: float) -> float:
    """Default watchdog per evaluation: a third of the search budget, within [120, 300] s. One hanging
    candidate (on the H200 a Triton kernel whose LLVM pass never finished) then costs at most a third of
    a short search (it took 300 of a 6-minute one), while a first compile of a many-kernel candidate
    (tens of seconds) stays far inside it."""
    return min(300.0, max(120.0, budget_s / 3))


def _optimize(args: argparse.Namespace) -> int:
    from compiler.search.agent_spec import writes_llm_code
    from compiler.search.loop import optimize
    from compiler.search.run_state import OptimizeConfig
    from compiler.search.startup_estimate import StartupTooSlow
    from persistent_engine import require_sandbox

    from persistent_engine.models.spec import tiny_name

    args.model = tiny_name(args.model, args.tiny)
    budget = parse_duration(args.budget)
    for flag, v in (("--llm-budget-usd", args.llm_budget_usd), ("--llm-budget-tokens", args.llm_budget_tokens)):
        if v is not None and not v > 0:
            raise UsageError(f"{flag} must be positive, got {v}")
    require_sandbox(author_is_llm=writes_llm_code(args.agents), unsafe=args.unsafe_no_sandbox)   # exit 2
    out = args.out or str(Path("plans") / (re.sub(r"[^A-Za-z0-9_.-]+", "_", Path(args.model).stem) or "model"))
    input_file(args.traffic, "traffic file")          # kinds of every path before any work starts
    output_dir(out)
    if args.board is not None:
        args.board = board_url(args.board)
    cfg = OptimizeConfig(model=args.model, hw=args.hw, traffic=args.traffic, out=out, budget_s=budget, wall_s=budget,
                         agents=args.agents, board=args.board, device=args.device,
                         fast_layers=args.fast_layers, slow_layers=args.slow_layers, fleet=args.fleet,
                         ray_address=args.ray_address, max_points=args.max_points,
                         timeout_s=args.timeout if args.timeout is not None else watchdog_s(budget),
                         aa_runs=args.aa_runs, gpus=args.gpus,
                         vs_torch_compile=args.vs_torch_compile, continue_plan=not args.fresh,
                         quiet=args.quiet, routing_skew=args.routing_skew,
                         routing_histogram=args.routing_histogram, weights=args.weights,
                         llm_budget_usd=args.llm_budget_usd, llm_budget_tokens=args.llm_budget_tokens,
                         ttft_ms=args.ttft_ms, tpot_ms=args.tpot_ms)
    try:
        res = optimize(cfg)
    except StartupTooSlow as e:                     # before anything started or was written
        print(f"tkcc optimize: {e}", file=sys.stderr)
        return 2
    judged = int(res.plan.run.get("tried", 0) or 0)
    warning = None if judged or res.interrupted else _nothing_judged(res.plan.run, args.budget)
    _summary(res.plan_dir, res.plan, args.json, interrupted=res.interrupted, judged=judged,
             **({"warning": warning} if warning else {}))
    if warning:
        print(f"tkcc optimize: warning: {warning}", file=sys.stderr)
    return 130 if res.interrupted and not args.json else 0


def _nothing_judged(run: dict, budget: str) -> str:
    """Why a finished run judged no candidate: its agents had nothing new to propose (all exhausted: what
    they know for this workload was judged by earlier runs into this --out), or the budget went to start-up."""
    reports = run.get("agent_reports") or []
    if reports and all(r.get("stopped") == "exhausted" for r in reports):
        return ("no new candidate was judged: the agents had nothing new to propose (every setting they know for "
                "this workload was judged by an earlier run into this --out, its verdict remembered); the plan is "
                "the newest one's; --fresh judges again from scratch")
    return (f"no candidate was judged within --budget {budget}: the engines' start-up and the baseline took the "
            "budget, and the plan is the baseline; give a longer --budget")


def _summary(vdir, plan, as_json: bool, **extra) -> None:
    from compiler.plan.report import hw_words, measured_on

    ps = plan.plan_speedup
    if as_json:
        _print_json({"plan_dir": str(vdir), "report": str(vdir / "report.md"), "version": plan.version,
                     "hw": plan.hw, "measured_on": measured_on(plan),
                     "optimizations": [o.to_dict() for o in plan.optimizations],
                     "plan_speedup": {k: ps.get(k) for k in ("fast", "slow")}, "variants": list(plan.variants),
                     "counts": plan.run.get("counts"), "agents": plan.run.get("agent_reports", []), **extra})
        return
    fmt = lambda v: "n/a" if v is None else f"{v:.3f}x"  # noqa: E731
    counts = plan.run.get("counts")
    kept = (f"kept {counts['kept']} of {counts['accepted']} accepted ({counts['tried']} tried)" if counts
            else f"{len(plan.optimizations)} optimization(s)")
    print(f"plan v{plan.version} ({hw_words(plan)}): {kept}; plan speedup fast {fmt(ps.get('fast'))}, "
          f"slow {fmt(ps.get('slow'))}")
    for o in plan.optimizations:
        print(f"  {o.name}: {', '.join(o.targets) or 'config'}  fast {fmt(o.speedup.get('fast'))}  "
              f"slow {fmt(o.speedup.get('slow'))}")
    from compiler.plan.buckets import UNBOUNDED

    for v in plan.bucket_variants(str(vdir)):
        print(f"  decode batches {v.lo}-{v.hi if v.hi < UNBOUNDED else ''}: "
              f"{', '.join(v.members) or 'the reference'} ({v.kernel})")
    for a in plan.run.get("agent_reports", []):
        if a.get("requests"):
            print(f"  {a['name']}: {a['input_tokens'] + a['cached_tokens'] + a['output_tokens']} tokens, "
                  f"${a['cost_usd']:.4f}, {a['tried']} candidates, {a['accepted']} accepted")
    print(f"plan:   {vdir / 'plan.json'}")
    print(f"report: {vdir / 'report.md'}")


def _recompile(args: argparse.Namespace) -> int:
    from compiler.search.recompile import recompile

    budget = parse_duration(args.budget)
    input_file(args.traffic, "traffic file")
    if args.board is not None:
        args.board = board_url(args.board)
    res = recompile(args.plan, args.traffic, budget_s=budget, force=args.force,
                    agents=args.agents, device=args.device, board=args.board, fleet=args.fleet,
                    quiet=args.quiet, wall_s=budget)
    drifted = [f["name"] for f in res.features if f.get("drifted")]
    if res.result is None:
        if args.json:
            _print_json({"drift": False, "features": list(res.features), "written": None})
        else:
            print(f"no drift against {res.old_version_dir}: the plan is current; nothing written")
        return 0
    if args.json:
        _print_json({"drift": res.drift, "drifted": drifted, "features": list(res.features),
                     "written": str(res.result.plan_dir), "version": res.result.plan.version,
                     "parent_version": res.result.plan.parent_version})
    else:
        why = f"traffic drifted ({', '.join(drifted)})" if res.drift else "forced"
        print(f"{why}: recompiled {res.old_version_dir.name} -> {res.result.plan_dir.name}")
        _summary(res.result.plan_dir, res.result.plan, False)
    return 0


def _show(args: argparse.Namespace) -> int:
    from compiler.plan import artifact as plan_mod

    if (args.plan is None) == (args.plan_opt is None):
        raise plan_mod.PlanError("plan show: give the plan directory once, as PATH or --plan PATH")
    plan, vdir = plan_mod.load(args.plan or args.plan_opt)
    if args.json:
        _print_json({"plan_dir": str(vdir), **plan.to_dict()})
    else:
        from compiler.plan.report import hw_words, measured_on

        where = hw_words(plan) + (f" (measured on {measured_on(plan)})" if hw_words(plan).startswith("on ") else "")
        print(f"{plan.model} {where}, traffic {plan.traffic.get('source')}")
        _summary(vdir, plan, False)
    return 0


def _apply(args: argparse.Namespace) -> int:
    from compiler.plan import artifact as plan_mod
    from compiler.plan.apply import check_plan

    layers = None
    if args.layers:
        try:
            layers = [int(x) for x in args.layers.split(",")]
        except ValueError:
            raise UsageError(f"--layers wants comma-separated integers, got {args.layers!r}") from None
    loaded, checks = check_plan(args.plan, model=args.model, layers=layers, device=args.device, dtype=args.dtype)
    ok = all(c.ok for c in checks)
    versus = _versus_compile(args, loaded, layers) if ok and args.vs_torch_compile else None
    if args.json:
        _print_json({"plan_dir": str(loaded.version_dir), "ops": sorted(loaded.overrides), "config": loaded.config,
                     "weights": loaded.weights, "ok": ok, "points": [c.__dict__ for c in checks], "vs_torch_compile": versus})
    else:
        print(f"loaded {loaded.version_dir}: overrides {', '.join(sorted(loaded.overrides)) or 'none'}")
        print(f"weights: the checkpoint at {loaded.weights}" if loaded.weights else
              "weights: seeded random (the model is not a checkpoint directory): outputs compare, they mean nothing")
        if not loaded.plan.optimizations:
            print("the plan holds no optimization (the run kept none): plan below = the baseline step")
        if loaded.config:
            print("config applied: " + ", ".join(f"{k}={v}" for k, v in sorted(loaded.config.items())))
        for c in checks:
            by = "" if c.served_by.endswith(f"/{plan_mod.COMPOSED_KERNEL}") else f"  (by {c.served_by})"
            print(f"  {c.point.label()}: "
                  f"max |diff| {c.max_abs_diff:.2e}  reference {c.reference_ms:.3f} ms  plan {c.plan_ms:.3f} ms{by}")
        print("outputs match the reference" if ok else "outputs DIFFER from the reference", file=sys.stderr)
        if versus:
            for r in versus["points"]:
                p = r["point"]
                print(f"  {p.get('phase')} b{p.get('batch')} ctx{p.get('context')}: " + (
                      f"left out ({r['error']})" if "error" in r else
                      f"plan {r['plan_ms']:.3f} ms ({r['how']})  torch.compile {r['torch_compile_ms']:.3f} ms  "
                      f"reference {r['reference_ms']:.3f} ms"))
            print(f"plan vs torch.compile ({versus['torch_compile_mode']}) of layers {versus['layers']}: "
                  f"{versus['plan_vs_torch_compile']:.3f}x, vs the reference {versus['plan_vs_reference']:.3f}x "
                  f"(weighted over {100 * versus['weight_covered']:.0f}% of the traffic)")
    return 0 if ok else 1


def _export(args: argparse.Namespace) -> int:
    from compiler.export.vllm_package import export, flags_line

    output_dir(args.out, "OUT")
    m = export(args.plan, args.out)
    if args.json:
        _print_json({"out": str(args.out), **m})
        return 0
    print(f"wrote {args.out}: vLLM plugin {m['package']} (pip install {args.out})")
    for e in m["exported"]:
        layers = ", ".join(lay["class"] for lay in m["layers"] if e["op"] in lay["ops"])
        print(f"  exported {e['op']} -> {layers}  ({e['kernel']})")
    for s in m["not_exported"]:
        print(f"  not exported {s['op']}: {s['reason']}")
    print("serve: " + flags_line(m))
    for s in m["flags_not_exported"]:
        print(f"  not a flag: {s['setting']}={s['value']} ({s['reason']})")
    return 0


def _versus_compile(args: argparse.Namespace, loaded, layers: list[int] | None) -> dict:
    from compiler.plan import artifact as plan_mod
    from compiler.plan.apply import verified_bytes
    from compiler.plan.compare import compare_with_torch_compile
    from compiler.plan.compose import compose
    from persistent_engine.models.spec import ModelSpec

    plan = loaded.plan
    spec = ModelSpec.from_name(args.model or plan.model)
    layers = layers or list(plan.tiers.get("fast", {}).get("layers") or [0])
    kfile = loaded.version_dir / "kernels" / plan_mod.COMPOSED_KERNEL
    source = (verified_bytes(kfile, plan.kernel_sha256.get(f"kernels/{plan_mod.COMPOSED_KERNEL}", "")).decode()
              if kfile.is_file() else compose([]))
    return compare_with_torch_compile(spec, layers, list(plan.workload_points), source,
                                      device=args.device, dtype=args.dtype)
