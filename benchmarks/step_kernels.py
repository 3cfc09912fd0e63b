"""What one decode step's device time is made of: kernels per step, time per kernel, idle gaps.

    python benchmarks/step_kernels.py --device cuda --cases llama-1b:all@1/1024 --plan examples/plans/llama-1b-h200
    python benchmarks/step_kernels.py --device cpu --cases tiny-dense:all@1/64

The question it answers: is a step slow because its kernels move bytes slowly, or because the device
idles between them (launch and dependency latency, ~150 small kernels in a llama-1b step)? Per case
(``e2e_decode.py``'s case syntax) the step runs two ways, each as ``e2e_decode.py`` times it: the
reference captured in a CUDA graph, and the plan's overrides captured in a CUDA graph. ``torch.profiler``
records ``--steps`` graph replays, each inside a ``record_function`` window that ends after a device
sync, so a kernel belongs to the replay whose window holds its start. Per replay:

  kernels  count of device kernels (CUPTI also reports the kernels launched by a graph replay)
  busy     length of the union of the kernel intervals: time at least one kernel runs
  span     first kernel start to last kernel end;  idle = span - busy (gaps between kernels)

The profiling itself is ``persistent_engine/measure/kernel_profile.py`` (``e2e_decode.py`` uses it too).
``floor_us`` (``e2e_decode.py``'s bytes / the measured copy bandwidth) against ``busy`` is how far the
kernels themselves are from the bandwidth floor; ``idle`` is what fusing launches away could win.
Per kernel name: calls and microseconds per step, the heaviest first. Per op: the engine's step profile
(``persistent_engine/measure/step_profile.py``, what the agents rank ops by): each op's share of the replay
(its kernels and the gaps before them) beside its sync-timed figure. On CPU (no kernels) the
top-level ``aten::`` ops of an eager step stand in for kernels, so the logic runs in CI.
Writes ``benchmarks/results/<h200|cpu>-step-kernels.json``.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from benchmarks import e2e_decode as e2e  # noqa: E402
from benchmarks.forward import bytes_read  # noqa: E402
from persistent_engine.measure.kernel_profile import (MARK, by_window, profile_intervals,  # noqa: E402,F401
                                                      summarize, union_us)
from compiler.plan import artifact as plan_mod  # noqa: E402
from compiler.plan.compare import capture  # noqa: E402
from persistent_engine.models.decoder import build_model  # noqa: E402
from persistent_engine.models.spec import ModelSpec  # noqa: E402
from persistent_engine.measure import profiler, step_profile  # noqa: E402
from persistent_engine.ops import registry  # noqa: E402
from persistent_engine.inputs.workloads import make_workload  # noqa: E402
from persistent_engine.io_struct import WorkloadPoint  # noqa: E402

def run_case(case: e2e.Case, model, plans: dict, steps: int, copy_gbs: float, seed: int) -> list[dict]:
    cuda = model.device.type == "cuda"
    wl = make_workload(model, WorkloadPoint(phase="decode", batch=case.batch, context=case.context), seed)
    moved = bytes_read(model, wl)
    floor_us = moved["total"] / (copy_gbs * 1e9) * 1e6
    parts = plans.get(case.model)
    variants = [("reference", {})] + ([("tkcc", dict(parts.loaded.overrides))] if parts else [])
    rows = []
    with torch.no_grad():
        for variant, overrides in variants:
            if cuda:
                g, out = capture(model, wl, overrides)
                run = lambda: (g.replay(), out)[1]  # noqa: E731
            else:
                def run(o=overrides):
                    with registry.override(o):
                        return model.step(wl)
            s = summarize(*profile_intervals(run, steps, cuda))
            with registry.override(overrides):
                per_op = per_op_profile(model, wl, steps)
            rows.append({"model": case.model, "layers": list(model.layers), "batch": case.batch,
                         "context": case.context, "variant": variant, "timed": "cuda_graph" if cuda else "eager",
                         "plan": str(parts.loaded.version_dir) if parts and variant == "tkcc" else None,
                         "floor_us": floor_us, "busy_pct_floor": 100 * floor_us / s["busy_us"], **s, **per_op})
            if cuda:
                del g
    return rows


def per_op_profile(model, wl, steps: int) -> dict:
    """The engine's step profile of the current forward (``measure.step_profile``): per op the replay's time
    (its kernels and the gaps before them) beside the sync-timed one, the ops sorted by replay time."""
    sync_ops = profiler.profile_point(model, wl, model.device, reps=steps)
    replay = step_profile.replay_profile(model, wl, model.device, steps)
    ops, outside = step_profile.merge(sync_ops, replay)
    keep = ("ms", "sync_ms", "busy_ms", "idle_ms", "kernels", "calls")
    return {"per_op": {op: {k: row[k] for k in keep if k in row} for op, row in ops.items()},
            "per_op_outside_ms": outside, "per_op_matched": replay["matched"],
            "per_op_sync_total_ms": sum(row["ms"] for row in sync_ops.values())}


def print_row(r: dict) -> None:
    print(f"{r['model']:<10} b{r['batch']:<4} ctx {r['context']:<5} {r['variant']:<9} {r['kernels']:>5.0f} kernels  "
          f"span {r['span_us']:8.1f} us  busy {r['busy_us']:8.1f} us  idle {r['idle_us']:7.1f} us "
          f"({100 * r['idle_us'] / max(r['span_us'], 1e-9):4.1f}%)  floor {r['floor_us']:7.1f} us "
          f"(busy at {r['busy_pct_floor']:.1f}% of it)", flush=True)
    for k in r["top"][:8]:
        print(f"    {k['us_per_step']:8.1f} us/step  {k['calls_per_step']:5.1f} x {k['us_per_call']:6.2f} us  {k['kernel']}")
    replayed = "sync_ms" in next(iter(r["per_op"].values()), {})
    print(f"  per op ({'graph replay' if replayed else 'sync-timed: the replay matched'} "
          f"{100 * r['per_op_matched']:.0f}% of kernels; sync-timed ops sum to "
          f"{1e3 * r['per_op_sync_total_ms']:.1f} us, kernels outside ops {1e3 * r['per_op_outside_ms']:.1f} us):")
    for op, row in list(r["per_op"].items())[:10]:
        print(f"    {op:<34} {1e3 * row['ms']:8.1f} us  (idle {1e3 * row.get('idle_ms', 0.0):6.1f}, "
              f"{row.get('kernels', 0):4.0f} kernels; sync-timed {1e3 * row.get('sync_ms', row['ms']):8.1f} us)")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plan", action="append", default=[], help="plan directory (root or vN); repeat per model")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"])
    ap.add_argument("--cases", nargs="*", help="MODEL[:all|cover|N|i,j][@B1,B2][/CONTEXT] (e2e_decode.py's)")
    ap.add_argument("--dtype", default="bf16", choices=list(e2e.DTYPES))
    ap.add_argument("--steps", type=int, default=5, help="profiled replays per variant")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None, help="JSON path (default benchmarks/results/<h200|cpu>-step-kernels.json)")
    a = ap.parse_args(argv)
    cuda = a.device == "cuda"
    try:
        if cuda and not torch.cuda.is_available():
            raise e2e.BenchError("--device cuda but no CUDA device is visible")
        plans = e2e.load_plans(a.plan)
        cases = e2e.parse_cases(a.cases or ["llama-1b:all@1/1024" if cuda else "tiny-dense:all@1/64"],
                                1024 if cuda else 64, e2e.DEFAULT_TRAFFIC, "h200", 4)
    except (ValueError, plan_mod.PlanError) as err:
        print(f"step_kernels: {err}", file=sys.stderr)
        return 2
    device = torch.device(a.device)
    copy_gbs = e2e.copy_bandwidth_gbs(device, (1 << 30) if cuda else (64 << 20))
    info = e2e.device_info(device)
    print(f"{info['gpu']}: copy bandwidth {copy_gbs:.0f} GB/s; {a.steps} profiled steps per variant", flush=True)
    rows = []
    model, key = None, None
    for case in cases:
        if key != (case.model, case.layers):           # one model per slice, its batches share it
            model = None
            model = build_model(ModelSpec.from_name(case.model), layers=list(case.layers) if case.layers else None,
                                device=device, dtype=e2e.DTYPES[a.dtype], seed=a.seed)
            key = (case.model, case.layers)
        for r in run_case(case, model, plans, a.steps, copy_gbs, a.seed):
            rows.append(r)
            print_row(r)
    doc = {**info, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "device": a.device, "dtype": a.dtype,
           "copy_bandwidth_gbs": copy_gbs, "cases": rows}
    out = Path(a.out or ROOT / "benchmarks" / "results" / f"{'h200' if cuda else 'cpu'}-step-kernels.json")
    plan_mod.atomic_write_text(out, json.dumps(doc, indent=1) + "\n")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
