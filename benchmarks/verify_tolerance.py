"""How loose the calibrated layer-level bound is: per tier of a plan, the re-rounded reference's error (the
slice's rounding noise, ``persistent_engine/verification/tolerance.py``), the bound the engine derives from it, and the
error of the plan's own composed kernels, all at the plan's workload points.

    python benchmarks/verify_tolerance.py --device cuda --plan examples/plans/qwen3-moe-h200
    python benchmarks/verify_tolerance.py --device cpu --plan PLAN --model tiny-dense

Each tier's engine is built as ``tkcc optimize`` builds it (the plan's tier layers and workload points, seed 0,
two input variants), so the noise and bound are the ones its candidates were judged by. The plan's error is
measured as layer-level verification measures it: its overrides active, routing replay on MoE slices, relative
L2 error of the logits against the start-up reference. ``plan / noise`` near or above 1 means correct kernels
would be rejected; far below 1 means the bound leaves room a wrong kernel could use (op-level verification's
fixed per-op bounds still apply). Writes ``benchmarks/results/<h200|cpu>-verify-tolerance.json``.
"""

from __future__ import annotations

import argparse
import gc
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from benchmarks import e2e_decode as e2e  # noqa: E402
from compiler.plan import apply as plan_apply  # noqa: E402
from compiler.plan import artifact as plan_mod  # noqa: E402
from persistent_engine.judge import engine as eng  # noqa: E402
from persistent_engine.verification import tolerance, verify  # noqa: E402
from persistent_engine.io_struct import WorkloadPoint  # noqa: E402


def plan_errors(e: eng.Engine, overrides: dict) -> list[list[float]]:
    """[point][variant] relative logits error of ``overrides`` against the engine's reference, the way
    layer-level verification runs them (routing replay where the slice routes and the plan keeps the router)."""
    errs = []
    for i, ws in enumerate(e.workloads):
        row = []
        for v, w in enumerate(ws):
            if verify.decides(e.ops_at[i]):
                refs = e.moe_routes.get((i, v), e.model, w, e.ref[i][v], e.dtype)
                out, _ = verify.routed_step(e.registry, e.model, w, overrides, refs)
            else:
                with e.registry.override(overrides):
                    out = e.model.step(w)
            row.append(verify.rel_err(out, e.ref[i][v]))
            e.model.step(w)                     # the reference's K/V back in the new-token slots
        errs.append(row)
    return errs


def measure_tier(model: str, tier: str, layers: list[int], points: list[WorkloadPoint], overrides: dict,
                 device: str, dtype: str) -> list[dict]:
    e = eng.Engine(eng.EngineConfig(model=model, layers=list(layers), device=device, dtype=dtype,
                                    points=list(points), cuda_graph=False))
    errs = plan_errors(e, overrides)
    rows = [{"tier": tier, "layers": list(layers), "point": p.label(), "variant": v,
             "noise": e.logit_noise[i][v], "bound": e.logit_tol[i][v], "plan_error": errs[i][v],
             "plan_over_noise": errs[i][v] / e.logit_noise[i][v] if e.logit_noise[i][v] > 0 else None}
            for i, p in enumerate(e.points) for v in range(len(e.workloads[i]))]
    del e
    gc.collect()
    if device == "cuda":
        torch.cuda.empty_cache()
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plan", required=True, help="plan directory (root or vN)")
    ap.add_argument("--model", default=None, help="model alias or config (default: the plan's)")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"])
    ap.add_argument("--dtype", default="bf16", choices=list(e2e.DTYPES))
    ap.add_argument("--out", default=None,
                    help="JSON path (default benchmarks/results/<h200|cpu>-verify-tolerance.json)")
    a = ap.parse_args(argv)
    cuda = a.device == "cuda"
    try:
        if cuda and not torch.cuda.is_available():
            raise e2e.BenchError("--device cuda but no CUDA device is visible")
        loaded = plan_apply.load(a.plan)
        model = a.model or loaded.plan.model
        tiers = {t: v.get("layers") for t, v in loaded.plan.tiers.items() if v.get("layers")}
        if not tiers:
            raise e2e.BenchError(f"plan {loaded.version_dir} names no tier layers")
        rows = []
        print(f"{'tier':<5} {'point':<28} {'v':>2} {'noise':>8} {'bound':>7} {'plan':>8} {'plan/noise':>10}")
        for tier, layers in tiers.items():
            for r in measure_tier(model, tier, layers, loaded.plan.workload_points, loaded.overrides, a.device,
                                  a.dtype):
                rows.append(r)
                ratio = f"{r['plan_over_noise']:.2f}" if r["plan_over_noise"] is not None else "-"
                print(f"{tier:<5} {r['point']:<28} {r['variant']:>2} {r['noise']:8.4f} {r['bound']:7.4f} "
                      f"{r['plan_error']:8.4f} {ratio:>10}", flush=True)
    except (ValueError, plan_mod.PlanError) as err:
        print(f"verify_tolerance: {err}", file=sys.stderr)
        return 2
    info = e2e.device_info(torch.device(a.device))
    doc = {**info, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "model": model,
           "plan": str(loaded.version_dir), "noise_factor": tolerance.NOISE_FACTOR, "tol_cap": tolerance.TOL_CAP,
           "rows": rows}
    out = Path(a.out or ROOT / "benchmarks" / "results" / f"{'h200' if cuda else 'cpu'}-verify-tolerance.json")
    plan_mod.atomic_write_text(out, json.dumps(doc, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
