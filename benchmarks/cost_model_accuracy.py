"""Cost-model accuracy: measured engine step times against predictions, before and after calibration.

    python benchmarks/cost_model_accuracy.py --device cpu              # tiny + one-layer models, ~1 min
    python benchmarks/cost_model_accuracy.py --device cpu --models tiny-dense --out-dir /tmp/x   # ~10 s
    python benchmarks/cost_model_accuracy.py --device cuda --hw h200   # llama-1b + qwen3-moe slice, 24 points, < 4 min

Each workload point is timed as the engine times it (persistent_engine.measure.suite, persistent_engine.measure.timing):
on GPU a step is captured in a CUDA graph and replayed between CUDA events after an L2 flush, the
median of the replays; a prefill step that syncs with the host (probed eagerly first: the MoE expert
loop) runs eagerly and the calibration gives its extra per-kernel launch cost its own factor; the
table's ``graph`` column says which. The GPU rounds stop after ``--budget-s`` seconds (default 90). On CPU: eager steps, one thread, the fastest sample (other processes share the
cores). Predictions use the per-op formulas of the engine's reference ops
(``cost_model.ops_reference``). The held-out split is fixed before
fitting and stratified: within each (model, phase) group, in suite order, points alternate between
the calibration set and the held-out set; the factors are fitted on the first and the error is
reported on both. Prints a table, writes ``benchmarks/results/cost_model_accuracy_<hw>.json``
(per point: measured, predicted before and after) and the fitted calibration
``benchmarks/results/cost_model_calibration_<hw>.json``; ``--install`` also copies it to
``cost_model/calibrations/<hw>.json`` so that ``tkcc parallelism`` uses it.

    python benchmarks/cost_model_accuracy.py --refit benchmarks/results/cost_model_accuracy_h200.json --install

re-fits the measured rows stored in a previous result file (no device needed; the measured fields
of each row are kept as they were) and re-writes the results, marked ``refit`` with the date the
rows were measured.

    python benchmarks/cost_model_accuracy.py --report          # no device, ~10 s

reports, from committed measurements only: (1) the H200 end-to-end error of the shipped calibration
(cost_model/calibrations/h200.json) against tkcc's own measured steps: the held-out rows of
cost_model_accuracy_h200.json, and the reference steps the e2e-decode, forward and step-kernel
benchmarks measured (h200-*.json; never used in any fit); (2) the per-op held-out errors of the
curves fitted on AIConfigurator's H100/H200 vLLM measurements (cost_model/data, the full held-out
split as the regeneration script recorded it) and the H100 -> H200 transfer error on the shipped
rows; (3) beside each tkcc plan step, the projection for vLLM-grade kernels (the fused formulas on
the curves; informative, not an error). Writes benchmarks/results/cost_model_accuracy_report_h200.json.
"""

from __future__ import annotations

import argparse
import datetime
import json
import statistics
import sys
from pathlib import Path

from compiler.plan.artifact import atomic_write_json
from persistent_engine.io_struct import WorkloadPoint

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"


def _d(b, c):
    return WorkloadPoint("decode", b, c, 1, 1.0)


def _p(n, c=0):
    return WorkloadPoint("prefill", 1, c, n, 1.0)


# (model, layers, points): on CPU persistent_engine.measure.suite.CPU_SUITE (tiny models whole, one llama-1b layer)
GPU_SUITE = [
    ("llama-1b", None, [_d(1, 1024), _d(4, 1024), _d(16, 2048), _d(64, 4096), _d(128, 1024), _d(256, 2048),
                        _d(1, 8192), _d(8, 16384), _d(1, 32768), _d(32, 8192), _p(512), _p(2048),
                        _p(8192), _p(2048, 8192)]),
    ("qwen3-moe", 4, [_d(1, 1024), _d(8, 2048), _d(32, 4096), _d(128, 1024), _d(256, 2048), _d(16, 16384),
                      _d(4, 32768), _p(1024), _p(4096), _p(2048, 4096)]),
]


def run_suite(suite, device: str, samples: int | None = None, budget_s: float | None = None) -> list[dict]:
    """Interleaved measurements of every point (persistent_engine.measure.suite: on CPU one thread, thread CPU
    time, the fastest sample; on GPU the engine's CUDA-event timer, the median)."""
    from persistent_engine.measure.suite import measure_suite

    rounds = samples or (12 if device == "cpu" else 50)
    return measure_suite(suite, device=device, rounds=rounds, min_rounds=min(rounds, 6),
                         budget_s=budget_s if budget_s is not None else (60.0 if device == "cpu" else 90.0))


def select_models(suite: list, models: list[str] | None) -> list:
    """The entries of ``suite`` for ``models`` (None: all); an unknown name is a user error."""
    from cost_model import CostModelError

    if not models:
        return suite
    known = [m for m, _, _ in suite]
    bad = [m for m in models if m not in known]
    if bad:
        raise CostModelError(f"--models {','.join(bad)}: not in this device's suite ({', '.join(known)})")
    return [e for e in suite if e[0] in models]


def split_sets(rows: list[dict]) -> list[str]:
    """'train' or 'held_out' per row, fixed before any fit: within each (model, phase) group, in
    order, the points alternate (the first of each group trains), so both sets cover every model
    and phase."""
    seen: dict[tuple, int] = {}
    out = []
    for r in rows:
        key = (r["model"], r["point"].get("phase", "decode"))
        out.append("train" if seen.get(key, 0) % 2 == 0 else "held_out")
        seen[key] = seen.get(key, 0) + 1
    return out


def accuracy(rows: list[dict], hw) -> dict:
    """Fit on half the rows, report median |error| before/after on the fit set and the held-out set."""
    from cost_model import evaluate, fit

    sets = split_sets(rows)
    train = [r for r, s in zip(rows, sets) if s == "train"]
    test = [r for r, s in zip(rows, sets) if s == "held_out"]
    calib = fit(train, hw, source="benchmarks/cost_model_accuracy.py")
    res = {"hw": hw.name, "points": len(rows), "calibration": calib.to_dict(),
           "train": {"before": evaluate(None, train, hw)["median_abs_error"],
                     "after": evaluate(calib, train, hw)["median_abs_error"]},
           "held_out": {"before": evaluate(None, test, hw)["median_abs_error"],
                        "after": evaluate(calib, test, hw)["median_abs_error"]}}
    before, after = evaluate(None, rows, hw), evaluate(calib, rows, hw)
    res["all"] = {"before": before["median_abs_error"], "after": after["median_abs_error"]}
    res["rows"] = [{**r, "predicted_before_s": b, "predicted_after_s": a, "set": s}
                   for r, b, a, s in zip(rows, before["predicted_s"], after["predicted_s"], sets)]
    return res, calib


DERIVED = ("predicted_before_s", "predicted_after_s", "set")     # per-row keys a fit writes, not measured


def load_rows(path: Path) -> tuple[dict, list[dict], str]:
    """(previous result document, its measured rows without the fitted keys, the date they were
    measured: the document's ``measured_on``, else the file's modification date)."""
    from cost_model import CostModelError

    try:
        doc = json.loads(path.read_text())
        rows = [{k: v for k, v in r.items() if k not in DERIVED} for r in doc["rows"]]
        if not rows or not all(isinstance(r, dict) and r.get("seconds", 0) > 0 for r in rows):
            raise ValueError("no measured rows")
    except (OSError, UnicodeDecodeError, json.JSONDecodeError, KeyError, TypeError, AttributeError, ValueError) as e:
        raise CostModelError(f"cannot re-fit {path}: {e}") from None
    measured_on = doc.get("measured_on") or datetime.date.fromtimestamp(path.stat().st_mtime).isoformat()
    return doc, rows, str(measured_on)


def print_table(res: dict) -> None:
    print(f"{'model':<11} {'layers':>8} {'phase':>7} {'batch':>5} {'ctx':>6} {'chunk':>5} {'graph':>5} "
          f"{'measured ms':>12} {'before ms':>10} {'after ms':>10} {'err after':>9} set")
    for r in res["rows"]:
        p = r["point"]
        lay = "all" if r["layers"] is None else (str(len(r["layers"])) if len(r["layers"]) > 2 else str(r["layers"]))
        err = abs(r["predicted_after_s"] - r["seconds"]) / r["seconds"]
        graph = {None: "-", True: "yes", False: "eager"}[r.get("graph")]
        print(f"{r['model']:<11} {lay:>8} {p['phase']:>7} {p['batch']:>5} {p['context']:>6} {p['chunk']:>5} "
              f"{graph:>5} {r['seconds'] * 1e3:>12.3f} {r['predicted_before_s'] * 1e3:>10.3f} {r['predicted_after_s'] * 1e3:>10.3f} "
              f"{err:>9.1%} {r['set']}")
    for k in ("train", "held_out", "all"):
        print(f"median |error| {k:<9} before {res[k]['before']:.1%}  after {res[k]['after']:.1%}")
    c = res["calibration"]
    if c.get("loo_errors"):
        print("leave-one-out median |error| per form:", {k: f"{v:.1%}" for k, v in c["loo_errors"].items()})
    print("form:", c["form"], "factors:", {k: [round(x, 3) for x in v] if isinstance(v, list) else round(v, 3)
                                          for k, v in (c["split"] or c["factors"]).items()},
          "kernel overhead us:", round(res["calibration"]["kernel_overhead_s"] * 1e6, 2),
          "eager overhead factor:", round(res["calibration"]["eager_overhead_factor"], 3))
    eager = [r for r in res["rows"] if r.get("graph") is False]
    if eager:
        print(f"eager (not capturable) points: {len(eager)} of {len(res['rows'])}: "
              + ", ".join(f"{r['model']} {r['point']['phase']} {r['point']['batch']}x{r['point']['chunk']}@"
                          f"{r['point']['context']}" + (f" ({r['graph_error']})" if r.get("graph_error") else "")
                          for r in eager))


E2E_FILES = ("h200-e2e-decode.json", "h200-e2e-decode-qwen3-moe-plan.json", "h200-e2e-decode-llama-plan-v2.json",
             "h200-forward.json", "h200-step-kernels.json", "h200-step-kernels-llama-v5.json",
             "h200-step-kernels-deepseek-v4.json")


def measured_steps(results: Path = RESULTS) -> tuple[list[dict], list[dict]]:
    """(reference steps, tkcc plan steps) measured on the H200 by the e2e-decode, forward and
    step-kernel benchmarks: {source, model, layers, point, seconds}; the reference steps are the
    engine's reference ops replayed in a CUDA graph, what the calibration models."""
    ref, plan = [], []
    for name in E2E_FILES:
        path = results / name
        if not path.exists():
            continue
        doc = json.loads(path.read_text())
        for c in doc.get("cases", []) + doc.get("rows", []):
            point = {"phase": "decode", "batch": int(c["batch"]), "context": int(c["context"]), "chunk": 1}
            row = {"source": name, "model": c["model"], "layers": c["layers"], "point": point}
            if c.get("reference_graph_ms"):
                ref.append({**row, "seconds": c["reference_graph_ms"] / 1e3})
            if c.get("graph_ms"):
                ref.append({**row, "seconds": c["graph_ms"] / 1e3})
            if c.get("variant") == "reference" and c.get("span_us"):       # the profiled span of one step
                ref.append({**row, "seconds": c["span_us"] / 1e6})
            if c.get("tkcc_ms"):
                plan.append({**row, "seconds": c["tkcc_ms"] / 1e3, "plan": c.get("plan")})
    return ref, plan


def report(results: Path = RESULTS, hw_name: str = "h200") -> dict:
    """The no-device accuracy report (module docstring)."""
    import numpy as np

    from cost_model import Layout, estimate_step, get_hardware, load_calibration
    from cost_model.calibration import Measurement
    from cost_model.efficiency import FAMILIES, curve_efficiency, load_tables, modelled_seconds
    from persistent_engine.models.spec import ModelSpec

    hw = get_hardware(hw_name)
    calib = load_calibration(hw.name, path=ROOT / "cost_model" / "calibrations" / f"{hw.name}.json")
    out: dict = {"hw": hw.name, "calibration": calib.summary(), "e2e": {}, "per_op": {}, "plans": []}
    # (1) end to end: the accuracy suite's held-out rows, then the other benchmarks' reference steps
    acc = json.loads((results / f"cost_model_accuracy_{hw.name}.json").read_text())
    held = [r for r in acc["rows"] if r.get("set") == "held_out"]
    ms = [Measurement.from_dict({k: v for k, v in r.items() if k in ("model", "layers", "point", "seconds", "dtype",
                                                                      "impl", "graph")}) for r in held]
    err = np.abs(calib.predict(ms, hw) - [m.seconds for m in ms]) / [m.seconds for m in ms]
    out["e2e"]["accuracy_suite_held_out"] = {"rows": len(ms), "median": float(np.median(err)),
                                             "p90": float(np.percentile(err, 90)), "max": float(err.max())}
    ref, plan = measured_steps(results)
    rows = []
    for r in ref:
        m = Measurement.from_dict({**{k: r[k] for k in ("model", "layers", "point", "seconds")}, "impl": "reference",
                                   "graph": True})
        pred = float(calib.predict([m], hw)[0])
        rows.append({**r, "predicted_s": pred, "error": abs(pred - r["seconds"]) / r["seconds"]})
    e = np.array([r["error"] for r in rows])
    out["e2e"]["benchmark_reference_steps"] = {"rows": len(rows), "median": float(np.median(e)),
                                               "p90": float(np.percentile(e, 90)), "max": float(e.max())}
    both = np.concatenate([err, e])
    out["e2e"]["all"] = {"rows": len(both), "median": float(np.median(both)), "p90": float(np.percentile(both, 90))}
    out["e2e_rows"] = rows
    # (2) per op: the full held-out split (recorded by the regeneration script) and the transfer check
    for gpu in ("h100", "h200"):
        for fam, per in load_tables(gpu)["held_out"].items():
            for dt, rec in per.items():
                out["per_op"][f"{gpu} {fam} {dt}"] = rec
    tables = load_tables("h200")["samples"]
    transfer = {}
    for fam in FAMILIES:
        s = tables[fam]
        errs = []
        for dt in sorted({r[0] for r in s["rows"]}):
            mine = [r for r in s["rows"] if r[0] == dt]
            w, _, kv = dt.partition("/")
            pred = modelled_seconds(fam, hw, [dict(zip(s["columns"], r[1:-1])) for r in mine], w, kv or None,
                                    source="h100", exact=True)
            errs += list(np.abs(pred - [r[-1] for r in mine]) / [r[-1] for r in mine])
        transfer[fam] = {"rows": len(errs), "median": float(np.median(errs)), "p90": float(np.percentile(errs, 90))}
    out["transfer_h100_to_h200"] = transfer
    # (3) tkcc's plans beside a vLLM-kernel projection of the same step (fused formulas on the curves)
    eff = curve_efficiency(hw)
    for r in plan:
        spec = ModelSpec.from_name(r["model"])
        proj = estimate_step(spec, hw, Layout(), WorkloadPoint.from_dict(r["point"]), r["layers"], eff=eff).latency_s
        out["plans"].append({"source": r["source"], "model": r["model"], "plan": r["plan"], "point": r["point"],
                             "tkcc_ms": r["seconds"] * 1e3, "vllm_kernels_projected_ms": proj * 1e3})
    return out


def print_report(rep: dict) -> None:
    e = rep["e2e"]
    print(f"H200 end to end, shipped calibration ({rep['calibration']['source'].split('/')[-1]}) against tkcc's "
          f"measured reference steps:")
    print(f"  accuracy suite, held-out rows : {e['accuracy_suite_held_out']['rows']:>3}  median "
          f"{e['accuracy_suite_held_out']['median']:6.1%}  p90 {e['accuracy_suite_held_out']['p90']:6.1%}")
    print(f"  e2e/forward/step-kernel steps : {e['benchmark_reference_steps']['rows']:>3}  median "
          f"{e['benchmark_reference_steps']['median']:6.1%}  p90 {e['benchmark_reference_steps']['p90']:6.1%}")
    print(f"  all                           : {e['all']['rows']:>3}  median {e['all']['median']:6.1%}  "
          f"p90 {e['all']['p90']:6.1%}   (goal <= 5% median)")
    print(f"  {'source':<38} {'model':<10} {'batch':>5} {'ctx':>6} {'measured ms':>11} {'model ms':>9} {'error':>7}")
    for r in rep["e2e_rows"]:
        print(f"  {r['source']:<38} {r['model']:<10} {r['point']['batch']:>5} {r['point']['context']:>6} "
              f"{r['seconds'] * 1e3:>11.3f} {r['predicted_s'] * 1e3:>9.3f} {r['error']:>7.1%}")
    print("per-op held-out error of the curves on AIConfigurator's vLLM measurements (median / p90):")
    for k, v in rep["per_op"].items():
        print(f"  {k:<36} {v['rows']:>6} shapes  median {v['median']:6.1%}  p90 {v['p90']:6.1%}")
    print("transfer check, H100 curves predicting H200 (shipped rows):")
    for k, v in rep["transfer_h100_to_h200"].items():
        print(f"  {k:<20} {v['rows']:>4} shapes  median {v['median']:6.1%}  p90 {v['p90']:6.1%}")
    print("tkcc plan steps beside the projection for vLLM-grade kernels (fused formulas on the curves):")
    for r in rep["plans"]:
        print(f"  {r['model']:<10} b{r['point']['batch']:<4} ctx {r['point']['context']:<6} tkcc {r['tkcc_ms']:8.3f} ms"
              f"   vLLM-kernel projection {r['vllm_kernels_projected_ms']:8.3f} ms   ({r['plan']})")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    ap.add_argument("--hw", default=None, help="catalogue name of the device (default: cpu, or h200 on cuda)")
    ap.add_argument("--samples", type=int, default=None, help="rounds of samples (default 12 CPU, 50 GPU)")
    ap.add_argument("--budget-s", type=float, default=None,
                    help="stop sampling rounds after this many seconds (default 60 CPU, 90 GPU)")
    ap.add_argument("--models", default=None, help="comma-separated models of the suite to measure (default all)")
    ap.add_argument("--install", action="store_true", help="also write cost_model/calibrations/<hw>.json")
    ap.add_argument("--refit", metavar="FILE", type=Path, default=None,
                    help="re-fit the measured rows of a previous result JSON instead of measuring")
    ap.add_argument("--out-dir", type=Path, default=RESULTS, help="where the result JSON files go")
    ap.add_argument("--report", action="store_true",
                    help="no device: the H200 end-to-end and per-op error report from committed measurements")
    args = ap.parse_args(argv)
    sys.path.insert(0, str(ROOT))
    from cost_model import CostModelError, get_hardware

    if args.report:
        rep = report(RESULTS, args.hw or "h200")
        print_report(rep)
        out = args.out_dir / f"cost_model_accuracy_report_{rep['hw']}.json"
        atomic_write_json(out, rep, indent=1)
        print(f"wrote {out}")
        return 0

    try:
        if args.refit:
            prev, rows, measured_on = load_rows(args.refit)
            hw = get_hardware(args.hw or prev.get("hw") or "h200")
            res, calib = accuracy(rows, hw)
            res["device"] = prev.get("device")
            res["measured_on"] = measured_on
            res["refit"] = {"of": str(args.refit), "measured_on": measured_on,
                            "note": f"re-fit of the measurements of {measured_on}; rows' measured fields unchanged"}
        else:
            hw = get_hardware(args.hw or ("cpu" if args.device == "cpu" else "h200"))
            from persistent_engine.measure.suite import CPU_SUITE

            suite = select_models(CPU_SUITE if args.device == "cpu" else GPU_SUITE,
                                  args.models.split(",") if args.models else None)
            rows = run_suite(suite, args.device, args.samples, args.budget_s)
            res, calib = accuracy(rows, hw)
            res["device"] = args.device
            res["measured_on"] = datetime.date.today().isoformat()
    except Exception as e:  # noqa: BLE001 - user errors (bad --models, model, point) are one line, exit 2
        if not (isinstance(e, CostModelError) or getattr(e, "user_error", False)):
            raise
        print(f"error: {e}", file=sys.stderr)
        return 2
    res["noise_median_spread"] = statistics.median(r.get("spread", 0.0) for r in rows)   # (median - fastest) / fastest
    res["eager_points"] = sum(r.get("graph") is False for r in rows)
    print_table(res)
    out = args.out_dir / f"cost_model_accuracy_{hw.name}.json"
    atomic_write_json(out, res, indent=1)
    calib.save(args.out_dir / f"cost_model_calibration_{hw.name}.json")
    if args.install:
        calib.save(ROOT / "cost_model" / "calibrations" / f"{hw.name}.json")
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
