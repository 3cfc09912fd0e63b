"""tkcc's search agents against a random search of the same budget (issue 41's control).

    python benchmarks/search_vs_random.py --device cpu --models tiny-dense,tiny-moe --seeds 0,1,2 --budget 150s
    python benchmarks/search_vs_random.py --device cuda --models llama-1b --seeds 0,1,2 --budget 5m --hw h200

For every model and seed it runs ``python -m compiler optimize`` twice on the same traffic, budget,
judge and template library, each into a fresh ``--out`` under a temporary directory (removed at the
end): once with ``--agents offline:N`` (tkcc's kernel-search agents: profile, roofline priors, the
board, reward feedback) and once with ``--agents random:N`` (``agents.offline.random_search``: uniform
draws of template and knobs, none of that). ``TKCC_SEARCH_SEED`` carries the seed to both arms; the
arm that runs first alternates with the seed, so a machine that slows during the benchmark does not
favour one arm. From each run's ``plan.json`` it reads the plan speedup on both tiers and the tally
(``run.counts``: judged, fast-passed, accepted, kept) and the fast tier's A/A noise it had to beat,
prints one row per run and, per model and arm, the mean and
the spread (min-max) over seeds, and writes ``benchmarks/results/<device>-search-vs-random.json`` (after
every run, so a benchmark cut short keeps the runs it finished).
A plan that kept nothing runs the baseline: its speedup counts as 1.0 (``kept`` says so).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from compiler.plan.artifact import atomic_write_json  # noqa: E402
from persistent_engine.versions import device_name  # noqa: E402

ARMS = ("offline", "random")
TRAFFIC = "examples/traffic/azure2023_conv.csv"


class BadArgs(ValueError):
    """A bad command line: one line on stderr, exit 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> None:  # argparse's own errors: one line, exit 2
        raise BadArgs(message)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = _Parser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu", help="cpu or cuda")
    ap.add_argument("--models", default="tiny-dense,tiny-moe", help="comma-separated aliases")
    ap.add_argument("--seeds", default="0,1,2", help="comma-separated integers")
    ap.add_argument("--budget", default="150s", help="each run's --budget (90s, 5m...)")
    ap.add_argument("--agents", type=int, default=4, help="agents per arm (offline:N against random:N)")
    ap.add_argument("--hw", default=None, help="--hw of the runs (default: cpu on cpu, h200 on cuda)")
    ap.add_argument("--traffic", default=TRAFFIC)
    ap.add_argument("--max-points", type=int, default=None, help="optimize --max-points (default: optimize's)")
    ap.add_argument("--aa-runs", type=int, default=None, help="optimize --aa-runs (default: optimize's)")
    ap.add_argument("--out", default=None, help="results JSON (default benchmarks/results/<device>-...)")
    args = ap.parse_args(argv)
    if args.device not in ("cpu", "cuda"):
        raise BadArgs(f"--device must be cpu or cuda, got {args.device!r}")
    try:
        args.seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        raise BadArgs(f"--seeds must be comma-separated integers, got {args.seeds!r}") from None
    args.models = [m.strip() for m in args.models.split(",") if m.strip()]
    if not args.seeds or not args.models:
        raise BadArgs("--seeds and --models need at least one entry each")
    for flag, value in (("--agents", args.agents), ("--max-points", args.max_points), ("--aa-runs", args.aa_runs)):
        if value is not None and value < 1:
            raise BadArgs(f"{flag} must be at least 1, got {value}")
    from compiler.commands.optimize import UsageError, parse_duration
    try:
        args.budget_s = parse_duration(args.budget)
    except UsageError as e:
        raise BadArgs(f"--budget: {e}") from None
    from persistent_engine.models.spec import ModelSpec
    for m in args.models:
        try:
            ModelSpec.from_name(m)
        except Exception:  # noqa: BLE001 - whatever the registry raises, the user gets one line
            raise BadArgs(f"--models: unknown model {m!r}") from None
    if not (ROOT / args.traffic).is_file() and not Path(args.traffic).is_file():
        raise BadArgs(f"--traffic: no such file {args.traffic!r}")
    args.hw = args.hw or ("h200" if args.device == "cuda" else "cpu")
    return args


def optimize_command(args: argparse.Namespace, model: str, arm: str, out: Path) -> list[str]:
    return [sys.executable, "-m", "compiler", "optimize", "--model", model, "--hw", args.hw,
            "--device", args.device, "--traffic", args.traffic, "--budget", args.budget,
            "--agents", f"{arm}:{args.agents}", "--out", str(out), "--fresh", "--quiet", "--json",
            *(["--max-points", str(args.max_points)] if args.max_points else []),
            *(["--aa-runs", str(args.aa_runs)] if args.aa_runs else [])]


def newest_plan(out: Path) -> dict | None:
    """The newest version's plan.json under a plan root, None when the run wrote none."""
    plans = sorted(out.glob("v*/plan.json"), key=lambda p: int(p.parent.name[1:] or 0))
    return json.loads(plans[-1].read_text()) if plans else None


def row_of(plan: dict | None, *, model: str, arm: str, seed: int, rc: int, wall_s: float, error: str = "") -> dict:
    """One run's row from its plan.json (None: the run wrote no plan, ``error`` says why)."""
    row = {"model": model, "arm": arm, "seed": seed, "rc": rc, "wall_s": round(wall_s, 1)}
    if plan is None:
        return {**row, "ok": False, "error": error or f"no plan.json (exit {rc})"}
    run = plan.get("run") or {}
    counts = run.get("counts") or {}
    noise = (plan.get("baseline") or {}).get("noise") or {}
    sp = plan.get("plan_speedup") or {}
    kept = int(counts.get("kept", len(plan.get("optimizations") or ())))
    return {**row, "ok": True,
            "speedup_slow": float(sp["slow"]) if kept and sp.get("slow") is not None else 1.0,
            "speedup_fast": float(sp["fast"]) if kept and sp.get("fast") is not None else 1.0,
            "judged": int(counts.get("tried", run.get("tried", 0))), "correct": int(counts.get("correct", 0)),
            "fast_passed": int(counts.get("fast_passed", 0)), "accepted": int(counts.get("accepted", 0)), "kept": kept,
            "noise_fast": noise.get("fast"), "noise_slow": noise.get("slow"),
            "search_s": (run.get("phases_s") or {}).get("searching"),
            "kept_ops": sorted({op for o in plan.get("optimizations") or () for op in o.get("targets", ())}),
            "kept_authors": sorted({o.get("author", "") for o in plan.get("optimizations") or ()}),
            "dropped": [d.get("why", "") for d in counts.get("dropped") or ()]}


def summarize(rows: list[dict]) -> list[dict]:
    """Per (model, arm), over the runs that wrote a plan: mean and min-max of the slow-tier plan speedup,
    mean judged / accepted / kept, and how many runs failed."""
    out = []
    for key in dict.fromkeys((r["model"], r["arm"]) for r in rows):
        mine = [r for r in rows if (r["model"], r["arm"]) == key]
        ok = [r for r in mine if r.get("ok")]
        sp = [r["speedup_slow"] for r in ok]
        out.append({"model": key[0], "arm": key[1], "runs": len(mine), "failed": len(mine) - len(ok),
                    "speedup_slow_mean": statistics.fmean(sp) if sp else None,
                    "speedup_slow_min": min(sp) if sp else None, "speedup_slow_max": max(sp) if sp else None,
                    **{f"{k}_mean": statistics.fmean(r[k] for r in ok) if ok else None
                       for k in ("judged", "accepted", "kept")}})
    return out


def _f(x, fmt: str) -> str:
    return "-" if x is None else format(x, fmt)


def format_table(rows: list[dict], summary: list[dict]) -> str:
    """The per-run table and the per-model, per-arm summary, as text."""
    lines = [f"{'model':<12}{'arm':<9}{'seed':>5}{'slow x':>9}{'fast x':>9}{'judged':>8}{'fast-pass':>10}"
             f"{'accepted':>10}{'kept':>6}{'noise':>8}  kept ops / error"]
    for r in rows:
        if r.get("ok"):
            noise = "-" if r.get("noise_fast") is None else f"{100 * r['noise_fast']:.1f}%"
            lines.append(f"{r['model']:<12}{r['arm']:<9}{r['seed']:>5}{r['speedup_slow']:>9.3f}"
                         f"{r['speedup_fast']:>9.3f}{r['judged']:>8}{r.get('fast_passed', 0):>10}{r['accepted']:>10}"
                         f"{r['kept']:>6}{noise:>8}  " + (",".join(r["kept_ops"]) or "-"))
        else:
            lines.append(f"{r['model']:<12}{r['arm']:<9}{r['seed']:>5}{'failed':>9}  {r.get('error', '')}")
    lines += ["", f"{'model':<12}{'arm':<9}{'runs':>5}{'slow x mean':>13}{'min-max':>15}{'judged':>8}"
                  f"{'accepted':>10}{'kept':>6}"]
    for s in summary:
        spread = "-" if s["speedup_slow_min"] is None else f"{s['speedup_slow_min']:.3f}-{s['speedup_slow_max']:.3f}"
        fails = f" ({s['failed']} failed)" if s["failed"] else ""
        lines.append(f"{s['model']:<12}{s['arm']:<9}{s['runs']:>5}{_f(s['speedup_slow_mean'], '13.3f')}"
                     f"{spread:>15}{_f(s['judged_mean'], '8.1f')}{_f(s['accepted_mean'], '10.1f')}"
                     f"{_f(s['kept_mean'], '6.1f')}{fails}")
    return "\n".join(lines)


def versions() -> dict:
    import torch
    try:
        import triton
        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    return {"python": platform.python_version(), "torch": torch.__version__, "triton": triton_version}


def run_one(args: argparse.Namespace, model: str, arm: str, seed: int, tmp: Path) -> tuple[dict, list[str]]:
    out = tmp / f"{model}-{arm}-{seed}"
    cmd = optimize_command(args, model, arm, out)
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)   # the GPU box's wheels too
    env = {**os.environ, "PYTHONPATH": path, "TKCC_SEARCH_SEED": str(seed)}
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=args.budget_s * 3 + 300)
    wall = time.monotonic() - t0
    err = (proc.stderr.strip().splitlines() or [""])[-1][:300]
    return row_of(newest_plan(out), model=model, arm=arm, seed=seed, rc=proc.returncode, wall_s=wall,
                  error=err), cmd


def document(args: argparse.Namespace, argv: list[str] | None, rows: list[dict], commands: list[str]) -> dict:
    """The results JSON: the machine, the versions, the exact command, every run and the summary."""
    command = ["python", os.path.relpath(__file__, ROOT), *(sys.argv[1:] if argv is None else argv)]
    return {"benchmark": "search_vs_random", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
            "device": args.device, "device_name": device_name(args.device), "host": platform.node(),
            "cpus": os.cpu_count(), **versions(), "command": shlex.join(command), "runs_commands": commands,
            "models": args.models, "seeds": args.seeds, "budget": args.budget, "agents_per_arm": args.agents,
            "max_points": args.max_points, "aa_runs": args.aa_runs, "hw": args.hw, "traffic": args.traffic,
            "rows": rows, "summary": summarize(rows)}


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse_args(argv)
    except BadArgs as e:
        print(f"search_vs_random: error: {e}", file=sys.stderr)
        return 2
    if args.device == "cuda":
        import torch
        if not torch.cuda.is_available():
            print("search_vs_random: error: --device cuda but no CUDA device is visible", file=sys.stderr)
            return 2
    out = Path(args.out) if args.out else ROOT / "benchmarks" / "results" / f"{args.device}-search-vs-random.json"
    rows: list[dict] = []
    commands: list[str] = []
    tmp = Path(tempfile.mkdtemp(prefix="tkcc-search-vs-random-"))
    try:
        for seed in args.seeds:                     # seed outermost: a run cut short has every model's first seeds
            for model in args.models:
                for arm in (ARMS if seed % 2 == 0 else ARMS[::-1]):    # who runs first alternates
                    row, cmd = run_one(args, model, arm, seed, tmp)
                    rows.append(row)
                    run_cmd = shlex.join(["python", *cmd[1:]]).replace(str(tmp), "$TMP")
                    commands.append(f"TKCC_SEARCH_SEED={seed} {run_cmd}")
                    said = f"{row['speedup_slow']:.3f}x slow, judged {row['judged']}" if row["ok"] else \
                        f"failed: {row['error']}"
                    print(f"  {model} {arm} seed {seed}: {said}", file=sys.stderr, flush=True)
                    atomic_write_json(out, document(args, argv, rows, commands))     # a run cut short keeps its rows
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    print(format_table(rows, summarize(rows)))
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
