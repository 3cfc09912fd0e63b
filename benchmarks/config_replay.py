"""The config search's judge on a plan's measured step times: which engine/scheduler settings win on a trace,
without an SLO (no trade allowed) and under one (goodput).

    python benchmarks/config_replay.py --plan benchmarks/results/h200-optimize-llama-7m-v1-plan.json \\
        --traffic examples/traffic/azure2023_code.csv --tpot-ms 50

Reads the plan's baseline profile (the step time the engine measured at each workload point, the fast tier's
slice), fits the config judge to it as ``tkcc optimize`` does (``compiler/search/config_plan.py``: full model = slice x
layers ratio, the eager factor of the plan's device, arrivals slowed where the measured engine cannot keep up),
replays the trace's first 2,000 requests for ``--settings`` knob settings drawn from the search space (the
default first) and prints the best ones and the default's figures, for no SLO and for the SLO given. Writes
``benchmarks/results/config-replay.json`` (or ``--out``) atomically. Nothing here touches a device: the figures
are projections from measured step times, labelled so.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import random
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from compiler.plan.artifact import atomic_write_json  # noqa: E402

from agents.offline import ConfigJudge  # noqa: E402
from compiler.search.config_plan import make_judge, slo_of  # noqa: E402
from persistent_engine.models.spec import ModelSpec  # noqa: E402

FIGURES = ("ttft_mean_s", "ttft_p99_s", "tpot_mean_s", "tokens_per_busy_s", "slo_attained", "goodput_tokens_per_s")


def judge_for(plan: dict, traffic: str, slo) -> ConfigJudge:
    """The config judge ``tkcc optimize`` would build from this plan's measured profile (module doc)."""
    layers = ModelSpec.from_name(plan["model"]).num_layers / max(len(plan["tiers"]["fast"]["layers"]), 1)
    return make_judge(traffic, plan["baseline"]["profile"], layers,
                      str((plan.get("detected_device") or {}).get("kind") or "cpu"), slo)


def search(judge: ConfigJudge, settings: int, seed: int) -> list[dict]:
    """The default setting and ``settings - 1`` others drawn from the live knobs, best score first."""
    knobs = judge.live_knobs()
    combos = list(itertools.product(*knobs.values()))
    random.Random(seed).shuffle(combos)
    rows = []
    for combo in [tuple(judge.space.default()[k] for k in knobs)] + combos[:max(0, settings - 1)]:
        setting = {**judge.space.default(), **dict(zip(knobs, combo))}
        r = judge.evaluate(setting)
        rows.append({"knobs": {k: setting[k] for k in knobs}, "score": round(r["score"], 4),
                     "feasible": r["feasible"], "ratios": {k: round(v, 4) for k, v in r["ratios"].items()},
                     **{f: (None if r.get(f) is None else round(r[f], 6)) for f in FIGURES}})
    return sorted(rows, key=lambda row: -row["score"])


def _table(title: str, base: dict, rows: list[dict], top: int) -> None:
    print(f"\n{title}: default TTFT mean {base['ttft_mean_s']:.3f} s, TPOT mean {1e3 * base['tpot_mean_s']:.1f} ms"
          + (f", SLO met by {base['slo_attained']:.1%}" if base.get("slo_attained") is not None else ""))
    print(f"{'score':>7} {'feasible':>8}  {'TTFT s':>7} {'TPOT ms':>8} {'SLO met':>8}  knobs")
    for r in rows[:top]:
        met = f"{r['slo_attained']:.1%}" if r["slo_attained"] is not None else "-"
        print(f"{r['score']:>7.3f} {str(r['feasible']):>8}  {r['ttft_mean_s']:>7.3f} {1e3 * r['tpot_mean_s']:>8.1f} "
              f"{met:>8}  {r['knobs']}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--plan", required=True, help="a plan.json with a measured baseline profile")
    ap.add_argument("--traffic", required=True)
    ap.add_argument("--ttft-ms", type=float, default=None)
    ap.add_argument("--tpot-ms", type=float, default=None)
    ap.add_argument("--settings", type=int, default=150, help="knob settings replayed per judge (default 150)")
    ap.add_argument("--top", type=int, default=5)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    plan = json.loads(Path(args.plan).read_text())
    doc = {"benchmark": "config_replay", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
           "plan": args.plan, "model": plan["model"], "hw": plan["hw"], "traffic": args.traffic,
           "label": "projected: traffic replay with the plan's measured step times", "judges": {}}
    slo = slo_of(args.ttft_ms, args.tpot_ms)
    for name, s in (("no SLO", None), *([(slo.describe(), slo)] if slo is not None else [])):
        judge = judge_for(plan, args.traffic, s)
        rows = search(judge, args.settings, args.seed)
        base = next(r for r in rows if r["knobs"] == {k: judge.space.default()[k] for k in judge.live_knobs()})
        winners = [r for r in rows if r["feasible"] and r["score"] > 1.01]
        doc["judges"][name] = {"time_scale": judge.time_scale, "default": base, "best": rows[:args.top],
                               "settings": len(rows), "better_than_default_by_1pct": len(winners)}
        _table(f"{plan['model']} on {Path(args.traffic).name}, {name} ({len(winners)} of {len(rows)} settings "
               "beat the default by 1%)", base, rows, args.top)
    out = Path(args.out) if args.out else ROOT / "benchmarks" / "results" / "config-replay.json"
    atomic_write_json(out, doc)
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
