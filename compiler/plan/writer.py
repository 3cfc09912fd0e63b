"""The writing phase of the optimize loop: the composition's per-op profile and its torch.compile
comparison (child processes: candidate code never runs in the orchestrator), plan.json's record of the
run, the plan version on disk and the accepted optimizations on the board."""

from __future__ import annotations

import dataclasses
import datetime as _dt
import logging
import time
from pathlib import Path
from typing import Any

from persistent_engine import WorkloadPoint, baseline_words, compiled_default

from compiler.search import inputs
from compiler.plan import artifact as plan_mod
from compiler.plan import report
from compiler.search.budget import Budget
from compiler.plan.buckets import BucketVariant, variant_path
from compiler.plan.compose import compose
from compiler.fleet.isolated import run_isolated
from compiler.search.progress import Progress
from compiler.search.acceptance import Composition
from compiler.search.run_state import OptimizeConfig, Outcome, RunContext, RunInputs, best_effort
from compiler.search.throughput import run_fields

log = logging.getLogger("tkcc.loop")
# the plan's per-op profile and its torch.compile comparison run in a child process (compiler.fleet.isolated);
# past this they are left out of the plan (they are optional, the plan is not)
ISOLATED_TIMEOUT_S = 900.0


def write_plan(run: RunContext, run_in: RunInputs, outcome: Outcome) -> Path:
    """The plan version: the composition's per-op profile and torch.compile comparison (child processes,
    skipped after Ctrl-C), plan.json + kernels + report, the accepted optimizations on the board."""
    progress, cfg, composition = run.progress, run.cfg, outcome.composition
    progress.phase("writing")
    # after Ctrl-C the plan is written at once: no per-op profile of the composition
    after = {} if outcome.interrupted else op_ms_after(
        run_in.spec, run_in.fast_layers, run_in.points, composition, run_in.device,
        isolated_time(run.budget, progress, "the per-op profile of the plan"))
    if cfg.vs_torch_compile and composition is not None and composition.parts and not outcome.interrupted:
        outcome.torch_compile = vs_torch_compile(
            run_in.spec, run_in.slow_layers, run_in.points, composition, run_in.device, progress,
            isolated_time(run.budget, progress, "the torch.compile comparison"))
    plan = build_plan(cfg, run_in, outcome, after, time.monotonic() - run.t_start, progress.snapshot().phases)
    plan = dataclasses.replace(plan, run={**plan.run, "deployment_hash": run.deployment_hash,
                                          **run_fields(run.board, run.run_id, outcome.clock,
                                                                   run.memory.hits, [
        o.to_dict() for o in plan.optimizations if o.projected]),
        **({"agent_reports": outcome.agent_reports} if outcome.agent_reports else {})})
    parts = composition.parts if composition else ()
    sources = {o.kernel: a.source for o, a in zip(plan.optimizations, parts)}
    sources.update({variant_path(lo, hi): v.source for lo, hi, v in (composition.variants if composition else ())})
    vdir = plan_mod.write_version(Path(cfg.out), plan, sources=sources,
                                  composed_source=composition.source if composition else compose([]),
                                  profile=run_in.traffic.profile, extra_files=report.render)
    for o, a in zip(plan.optimizations, parts):
        if a.candidate_id is not None:
            best_effort(run.board.add_optimization, run.run_id, a.candidate_id, name=o.name,
                        targets=list(o.targets), speedups=o.speedup, per_point=[p.to_dict() for p in o.per_point],
                        plan_version=written_version(vdir))
    record_baseline(run.board, run.run_id, plan.plan_speedup, plan.run.get("counts"))
    progress.phase("done")
    snap = progress.snapshot()
    best_effort(run.board.update_run, run.run_id, status="interrupted" if outcome.interrupted else "done",
                message=f"plan {vdir}", candidates_tried=snap.tried, candidates_accepted=snap.accepted,
                best_speedup=snap.best_speedup, engine_restarts=outcome.restarts)
    return vdir


def record_baseline(board: Any, run_id: Any, plan_speedup: dict, counts: dict | None = None) -> None:
    """The run's plan speedups, what they are measured against (in words) and its tally (``run.counts`` of
    plan.json, compiler/search/tally.py) for the UI's run page."""
    try:
        row = board.get_run(run_id)
        if row is not None:
            board.update_run(run_id, config={**(row.config or {}), "baseline": plan_speedup.get("baseline"),
                                             "plan_speedup": {k: plan_speedup.get(k) for k in ("fast", "slow")},
                                             **({"counts": counts} if counts else {})})
    except Exception:  # noqa: BLE001 - board bookkeeping never stops a run
        pass


def written_version(vdir: Path) -> int:
    return int(vdir.name.lstrip("v"))


def isolated_time(budget: Budget, progress: Progress, what: str, least_s: float = 10.0) -> float:
    """Seconds an optional child measurement of the writing phase may take (0: left out, said so)."""
    left = min(ISOLATED_TIMEOUT_S, budget.left() - 3.0)
    if left < least_s:
        progress.event(f"{what} is left out: {max(left, 0):.0f} s of the budget remain")
        return 0.0
    return left


def op_ms_after(spec: Any, layers: list[int], points: list[WorkloadPoint], composition: Composition | None,
                 device: dict, timeout_s: float = ISOLATED_TIMEOUT_S) -> dict[str, dict[str, float]]:
    """Per-op time of the fast-tier slice before and after the composed plan, measured the same way
    in a child process (candidate code never runs in the orchestrator; the engine's profile covers the
    reference only)."""
    if composition is None or not composition.parts or timeout_s <= 0:
        return {}
    try:
        from compiler.plan.apply import op_times_with
        return run_isolated(op_times_with, spec, layers, points, composition.source,
                            device="cpu" if device["kind"] == "cpu" else "cuda", timeout_s=timeout_s)
    except Exception as e:  # noqa: BLE001 - the plot is optional; the plan is not
        log.warning("per-op timing with the plan failed: %s", e)
        return {}


def vs_torch_compile(spec: Any, layers: list[int], points: list[WorkloadPoint], composition: Composition,
                      device: dict, progress: Progress, timeout_s: float = ISOLATED_TIMEOUT_S) -> dict:
    if timeout_s <= 0:
        return {"error": "left out: the run's budget was spent"}
    try:
        from compiler.plan.compare import compare_with_torch_compile
        res = run_isolated(compare_with_torch_compile, spec, layers, points, composition.source,   # a child process
                           device="cpu" if device["kind"] == "cpu" else "cuda", timeout_s=timeout_s)
    except Exception as e:  # noqa: BLE001 - a comparison that fails is recorded, the plan stands
        return {"error": f"{type(e).__name__}: {e}"[:300]}
    left_out = [f"{r['point'].get('phase')} b{r['point'].get('batch')}: {r['error']}" for r in res["points"] if "error" in r]
    progress.event(f"plan ({res['plan_timing']}) vs torch.compile ({res['torch_compile_mode']}) of the slow-tier "
                   f"slice: {res['plan_vs_torch_compile']}x (vs reference eager {res['plan_vs_reference']}x), "
                   f"{100 * res['weight_covered']:.0f}% of the traffic weight"
                   + "".join(f"; left out {p}" for p in left_out))
    return res


def build_plan(cfg: OptimizeConfig, run_in: RunInputs, outcome: Outcome, after: dict, elapsed_s: float,
                phases: dict) -> plan_mod.Plan:
    """plan.json's record of the run (DESIGN.md "Plan artifact"); ``after``: the per-op profile before
    and after the composition (``_op_ms_after``), empty when not measured."""
    import math

    composition, baseline = outcome.composition, outcome.baseline
    opts = []
    for a in (composition.parts if composition else ()):
        opts.append(plan_mod.PlanOptimization(
            name=a.name, targets=a.targets, speedup={"fast": round(a.fast, 4), "slow": round(a.slow, 4)},
            per_point=a.per_point, kernel=plan_mod.kernel_path(a.source, a.targets),
            author=a.author, description=a.description, noise=a.noise, projected=getattr(a, "projected", None),
            parent=plan_mod.seed_parent(a.author)))

    def num(x: float) -> float | None:
        return None if x is None or not math.isfinite(x) else round(x, 4)

    if composition is None:
        plan_speedup = {"fast": 1.0, "slow": 1.0, "per_point": [], "note": "nothing accepted: the baseline"}
    else:
        plan_speedup = {"fast": num(composition.fast), "slow": num(composition.slow),
                        "per_point": [p.to_dict() for p in composition.per_point],
                        "dropped": [list(d) for d in composition.dropped]}
        if outcome.interrupted:
            plan_speedup["note"] = "interrupted: composition not re-measured"
        if composition.pdl:
            plan_speedup["pdl"] = "on in every template kernel (plan-wide: measured faster on both tiers)"
        tc = outcome.torch_compile or {}
        if tc.get("plan_vs_torch_compile") is not None:
            plan_speedup["vs_torch_compile"] = tc["plan_vs_torch_compile"]
            plan_speedup["vs_reference_in_process"] = tc["plan_vs_reference"]
    plan_speedup["baseline"] = baseline_words(compiled_default("cpu" if run_in.device["kind"] == "cpu" else "cuda"))
    traffic, projected = run_in.traffic, run_in.projected
    return plan_mod.Plan(
        model=cfg.model, hw=cfg.hw, detected_device={k: v for k, v in run_in.device.items() if k != "target"},
        software=inputs.software_versions(),
        traffic={"source": traffic.source, "hash": traffic.hash, "summary": traffic.summary},
        workload_points=tuple(run_in.points), optimizations=tuple(opts), plan_speedup=plan_speedup,
        parallelism=run_in.layout, projected={**projected, "label": f"projected for {cfg.hw} by the cost model, not measured"}
        if projected else None,
        tiers={t: {"layers": layers, **outcome.tier_info.get(t, {})}
               for t, layers in (("fast", run_in.fast_layers), ("slow", run_in.slow_layers))},
        baseline={"op_ms": after.get("before") or baseline.op_ms or {},
                  "op_ms_after": after.get("after") or {}, "noise": baseline.noise,
                  "torch_compile": outcome.torch_compile, "profile": baseline.profile},
        run={"budget_s": cfg.budget_s, "wall_s": cfg.wall_s, "phases_s": dict(phases),
             "elapsed_s": round(elapsed_s, 1), "interrupted": outcome.interrupted,
             "tried": outcome.tried, "accepted": len(outcome.accepted), "restarts": outcome.restarts,
             **({"counts": outcome.tally.to_dict(), "tried": outcome.tally.tried,
                 "accepted": outcome.tally.accepted} if outcome.tally else {}),
             "agents": cfg.agents, "fleet": cfg.fleet, "layout_note": run_in.layout_note, "origin": _origin(cfg),
             "slo": {"ttft_ms": cfg.ttft_ms, "tpot_ms": cfg.tpot_ms}},
        parent_version=cfg.parent_version,
        created_at=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
        variants=tuple(BucketVariant(lo, hi, tuple(a.name for a in v.parts), variant_path(lo, hi),
                                     v.per_point).to_dict() for lo, hi, v in (composition.variants if composition else ())))


def _origin(cfg: OptimizeConfig) -> str:
    """Why this version exists: "new" (first in its root), "continued" (optimize into an existing root:
    the newest version's optimizations re-verified as seeds), "drift" or "forced" (tkcc recompile)."""
    if cfg.drift is not None:
        return "forced" if cfg.drift.get("forced") else "drift"
    return "continued" if cfg.parent_version is not None else "new"
