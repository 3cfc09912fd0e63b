"""Hot reload against restart-per-candidate: what one candidate costs on a persistent engine.

    python benchmarks/hot_reload.py --device cuda      # llama-1b, 2-layer fast tier (the H200 run)
    python benchmarks/hot_reload.py --device cpu       # tiny-dense (works anywhere)

One run measures, through the real supervisor and RPC:
  * cold start: spawn -> ready, with the engine's stage breakdown (process, imports, weights,
    kv_cache, warmup, calibration, graph_capture), ``--cold`` times (median);
  * hot-reload cycles on the fast tier: ``--cycles`` candidates, each a fresh source (a correct
    override of linear, fused_add_rms_norm or silu_and_mul in torch, plus Triton fused_add_rms_norm
    variants on CUDA) through load + verify + bench + unload on the same engine.
Then: candidates per hour = 3600 / median cycle; restart-per-candidate seconds = median cold start
+ median cycle; ratio = that / median cycle. Prints tables; writes
``benchmarks/results/<device>-hot_reload.json`` atomically.

With ``--queued N`` each candidate is judged with the next N told to the engine as queued behind it
(``Supervisor.evaluate(queued=...)``), as the optimize loop's fleet does: the judge loads and compiles them
ahead in executors of their own (persistent_engine/judge/executors.py; ``TKCC_AHEAD`` caps how many), and
each row records whether its candidate was compiled ahead. Run with 0 and with 4 in one session to see what
compiling ahead takes off the cycle.

Since issue 20 the engine is a judge and every candidate runs in a fresh sandboxed executor from a warm
pool: each cycle's row also records how long the judge waited for a warm executor, and the run is compared
with the figure before the split (``BEFORE``: the in-process engine on the H200, 0.31 s per cycle): the
difference per phase is printed with its cause and recorded under ``"vs_before"``.
"""

from __future__ import annotations

import argparse
import datetime
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from compiler.plan.artifact import atomic_write_json  # noqa: E402

from persistent_engine.supervisor import STAGES, Supervisor  # noqa: E402

TORCH_LINEAR = '''
import torch
DESCRIPTION = "linear torch variant {k}"
def linear(x, weight, bias):
    y = torch.matmul(x, weight.t()) + {zero}
    return y if bias is None else y + bias
OVERRIDES = {{"linear": linear}}
'''
# a correct loser, as most search candidates are: the product computed twice (the futility stop's case)
TORCH_SLOW_LINEAR = '''
import torch
DESCRIPTION = "linear torch loser {k}: the product twice"
def linear(x, weight, bias):
    y = torch.matmul(x, weight.t())
    y = torch.matmul(x, weight.t()) + 0.0 * y[..., :1] + {zero}
    return y if bias is None else y + bias
OVERRIDES = {{"linear": linear}}
'''
TORCH_FUSED = '''
import torch
DESCRIPTION = "fused_add_rms_norm torch variant {k}"
def fused_add_rms_norm(x, residual, weight, eps):
    r = x.float() + residual.float() + {zero}
    y = r * torch.rsqrt(r.pow(2).mean(-1, keepdim=True) + eps) * weight.float()
    return y.to(x.dtype), r.to(x.dtype)
OVERRIDES = {{"fused_add_rms_norm": fused_add_rms_norm}}
'''
TORCH_SILU = '''
import torch
import torch.nn.functional as F
DESCRIPTION = "silu_and_mul torch variant {k}"
def silu_and_mul(x):
    d = x.shape[-1] // 2
    return (F.silu(x[..., :d].float()) * x[..., d:].float() + {zero}).to(x.dtype)
OVERRIDES = {{"silu_and_mul": silu_and_mul}}
'''
TRITON_FUSED = '''
import torch
import triton
import triton.language as tl
DESCRIPTION = "fused_add_rms_norm Triton variant {k} (num_warps {warps})"
@triton.jit
def _k(x_ptr, r_ptr, w_ptr, o_ptr, s_ptr, D, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    m = cols < D
    x = tl.load(x_ptr + row * D + cols, mask=m, other=0.0).to(tl.float32)
    x += tl.load(r_ptr + row * D + cols, mask=m, other=0.0).to(tl.float32)
    tl.store(s_ptr + row * D + cols, x.to(s_ptr.dtype.element_ty), mask=m)
    inv = 1.0 / tl.sqrt(tl.sum(x * x, axis=0) / D + eps)
    w = tl.load(w_ptr + cols, mask=m, other=0.0).to(tl.float32)
    tl.store(o_ptr + row * D + cols, (x * inv * w).to(o_ptr.dtype.element_ty), mask=m)
def fused_add_rms_norm(x, residual, weight, eps):
    d = x.shape[-1]
    x2, r2 = x.reshape(-1, d).contiguous(), residual.reshape(-1, d).contiguous()
    out, res = torch.empty_like(x2), torch.empty_like(x2)
    if x2.shape[0] > 0:
        _k[(x2.shape[0],)](x2, r2, weight.contiguous(), out, res, d, eps, BLOCK=triton.next_power_of_2(d),
                           num_warps={warps})
    return out.reshape(x.shape), res.reshape(x.shape)
OVERRIDES = {{"fused_add_rms_norm": fused_add_rms_norm}}
'''


# the H200 figure before the judge/executor split (in-process engine; benchmarks/results/h200-hot_reload.log,
# llama-1b layers [0, 1], 24 candidates): 0.297 s median cycle (0.31 s as quoted in issue 20), ~11,500-12,100/h
BEFORE = {"cycle_s": 0.31, "candidates_per_hour": 11500,
          "phase_s": {"load_s": 0.007, "verify_s": 0.086, "bench_s": 0.204, "unload_s": 0.005},
          "source": "benchmarks/results/h200-hot_reload.log (in-process engine, before issue 20)"}
# why each phase costs what it does now (printed beside its difference from BEFORE)
PHASE_CAUSES = {
    "load_s": "a warm executor taken from the pool (waiting when none is warm yet) imports the candidate in its "
              "own process, guard snapshots, one round trip",
    "verify_s": "one op_checks request per op and seed (every shape and dtype; the judge's references computed "
                "meanwhile) and one for every layer-level step; outputs and logits cross the process boundary "
                "(device -> host mailbox -> judge device), host syncs on a GPU the warming pool shares",
    "bench_s": "each sample is the judge's wall clock over a run request of k steps (fresh token ids, every output "
               "cloned), the other side SIGSTOPped; spot-checked outputs fetched; the candidate's graphs captured "
               "in its executor",
    "unload_s": "SIGKILL to the executor's processes (the tree re-scanned and reaped on a thread), the arena's seals "
                "and a window of its bytes checked",
}


def compare_with_before(phase_median: dict, cycle_s: float, pool_wait_s: float) -> dict:
    """Per phase: now, before, difference and its cause; the cycle's difference, and the pool wait's share."""
    rows = {p: {"now_s": phase_median.get(p, 0.0), "before_s": b, "delta_s": phase_median.get(p, 0.0) - b,
                "cause": PHASE_CAUSES[p]} for p, b in BEFORE["phase_s"].items()}
    return {"before": BEFORE, "phases": rows, "cycle_delta_s": cycle_s - BEFORE["cycle_s"],
            "cycle_ratio_now_over_before": cycle_s / BEFORE["cycle_s"], "pool_wait_median_s": pool_wait_s,
            "targets": {"cycle_under_1s": cycle_s < 1.0, "at_least_3600_per_hour": 3600.0 / cycle_s >= 3600}}


def candidates(n: int, triton: bool, loser_every: int = 0) -> list[tuple[str, str]]:
    """``n`` distinct sources (each a fresh module: the engine cannot reuse a previous load); with
    ``loser_every`` N > 0, every Nth is a correct loser (``TORCH_SLOW_LINEAR``) in place of its kind."""
    kinds = [("torch linear", TORCH_LINEAR), ("torch fused_add_rms_norm", TORCH_FUSED),
             ("torch silu_and_mul", TORCH_SILU)]
    if triton:
        kinds.append(("triton fused_add_rms_norm", TRITON_FUSED))
    out = []
    for k in range(n):
        name, tpl = kinds[k % len(kinds)]
        if loser_every > 0 and k % loser_every == loser_every - 1:
            name, tpl = "torch linear (loser)", TORCH_SLOW_LINEAR
        out.append((name, tpl.format(k=k, zero=f"0.0 * {k}", warps=(1, 2, 4, 8)[k % 4])))
    return out


def stops_summary(rows: list[dict]) -> dict:
    """How the timed points' A/B ended (``PointTiming.stopped``): counts per reason, pairs per point
    (median, and median of the futility stops), and the losers' and the others' median bench seconds."""
    timed = [p for r in rows for p in r["points"] if p.get("affected", True)]
    by = {why: [p for p in timed if p.get("stopped", "") == why] for why in ("futility", "settled", "")}
    pairs = lambda ps: statistics.median(p["samples"] for p in ps) if ps else None   # noqa: E731
    bench = lambda rs: statistics.median(r["bench_s"] or 0.0 for r in rs) if rs else None   # noqa: E731
    stopped = [r for r in rows if any(p.get("stopped") == "futility" for p in r["points"])]
    return {"points_timed": len(timed), "stopped_futility": len(by["futility"]),
            "stopped_settled": len(by["settled"]), "all_samples": len(by[""]),
            "median_pairs": pairs(timed), "median_pairs_futility": pairs(by["futility"]),
            "cycles_with_a_futility_stop": len(stopped),
            "bench_median_s_with_a_futility_stop": bench(stopped),
            "bench_median_s_without": bench([r for r in rows if r not in stopped])}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--model", default=None, help="default: llama-1b on cuda, tiny-dense on cpu")
    ap.add_argument("--layers", default=None, help="N or i,j,k (default: 2 on cuda, the covering set on cpu)")
    ap.add_argument("--cycles", type=int, default=None, help="candidates to judge (default 24 cuda, 9 cpu)")
    ap.add_argument("--cold", type=int, default=2, help="cold starts to measure")
    ap.add_argument("--samples", type=int, default=0, help="timed samples per point (0: engine default)")
    ap.add_argument("--no-triton", action="store_true", help="torch candidates only")
    ap.add_argument("--loser-every", type=int, default=0,
                    help="every Nth candidate a correct loser (the linear product twice): the futility stop's "
                         "case, most of a search's candidates (0: none, the figures before issue 23)")
    ap.add_argument("--queued", type=int, default=0,
                    help="tell the engine the next N candidates as queued behind each one (it compiles them "
                         "ahead; 0: none, the figures before)")
    ap.add_argument("--settle-s", type=float, default=120.0,
                    help="wait up to this long for the pool of warm executors to fill before the cycles")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    cuda = args.device.startswith("cuda")
    model = args.model or ("llama-1b" if cuda else "tiny-dense")
    layers_arg = args.layers or ("2" if cuda else None)
    layers = None
    if layers_arg:
        layers = ([int(x) for x in layers_arg.split(",") if x] if "," in layers_arg
                  else list(range(int(layers_arg))))
    cycles = args.cycles or (24 if cuda else 9)
    env = dict(os.environ)
    if not cuda:
        env.setdefault("TRITON_INTERPRET", "1")

    sup = Supervisor(model, layers, args.device, env=env, start_timeout_s=900,
                     log=lambda line: print(line, file=sys.stderr))
    colds = []
    for i in range(max(1, args.cold)):
        if i:
            sup.close()
        t0 = time.monotonic()
        stages = sup.start()
        colds.append({"spawn_to_ready_s": time.monotonic() - t0, "stages": stages})
    status = sup.status()
    t_settle = time.monotonic()                 # steady state: the pool of warm executors full first
    while status.pool_ready < status.pool_size and time.monotonic() - t_settle < args.settle_s:
        time.sleep(0.5)
        status = sup.status()
    settle_s = time.monotonic() - t_settle

    rows = []
    todo = candidates(cycles, triton=cuda and not args.no_triton, loser_every=args.loser_every)
    for k, (name, source) in enumerate(todo):
        queued = [s for _, s in todo[k + 1:k + 1 + max(0, args.queued)]]
        t0 = time.monotonic()
        v = sup.evaluate(source, timeout_s=600, name=f"bench{k}", samples=args.samples, queued=queued)
        wall = time.monotonic() - t0
        st = sup.status()                       # outside the timed cycle
        rows.append({"candidate": name, "correct": v.correct, "reasons": v.reasons, "speedup": v.speedup,
                     "cycle_s": wall, "pool_wait_s": st.pool_wait_s, "executors_used": st.executors_used, **{k2: v.timings.get(k2) for k2 in ("load_s", "verify_s", "bench_s",
                                                                           "unload_s")},
                     "restarted": v.restarted, "compiled_ahead": bool(v.timings.get("compiled_ahead")),
                     "points": [{"label": p.label, "graph": p.graph, "graph_error": p.graph_error,
                                 "baseline_ms": p.baseline_ms, "candidate_ms": p.candidate_ms,
                                 "affected": p.affected, "samples": p.samples, "stopped": p.stopped}
                                for p in v.per_point]})
        print(f"  cycle {k:>3} {name:<26} {wall:7.3f} s  correct={v.correct}  "
              f"speedup={v.speedup if v.speedup is None else round(v.speedup, 3)}", file=sys.stderr)
    pool_size = sup.status().pool_size
    sup.close()

    cold_s = statistics.median(c["spawn_to_ready_s"] for c in colds)
    cycle_s = statistics.median(r["cycle_s"] for r in rows)
    per_kind = {}
    for r in rows:
        per_kind.setdefault(r["candidate"], []).append(r["cycle_s"])
    restart_per_candidate_s = cold_s + cycle_s
    doc = {
        "benchmark": "hot_reload", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(),
        "device": args.device, "host": platform.node(), "python": platform.python_version(),
        "model": model, "layers": status.layers, "points": [p.to_dict() for p in status.points], "samples": args.samples,
        "cold_start": {"runs": colds, "median_spawn_to_ready_s": cold_s,
                       "stages_median": {s: statistics.median(c["stages"].get(s, 0.0) for c in colds)
                                         for s in STAGES}},
        "cycles": rows,
        "cycle_median_s": cycle_s,
        "cycle_median_by_kind_s": {k: statistics.median(v) for k, v in per_kind.items()},
        "phase_median_s": {p: statistics.median(r[p] or 0.0 for r in rows)
                           for p in ("load_s", "verify_s", "bench_s", "unload_s")},
        "all_correct": all(r["correct"] for r in rows),
        "loser_every": args.loser_every,
        "queued": args.queued,
        "compiled_ahead": sum(r["compiled_ahead"] for r in rows),
        "stops": stops_summary(rows),
        # per point label: in how many cycles it was timed as CUDA-graph replays (vs eagerly)
        "graphed_cycles_by_point": {lbl: sum(1 for r in rows for p in r["points"] if p["label"] == lbl and p["graph"])
                                    for lbl in dict.fromkeys(p["label"] for r in rows for p in r["points"])},
        "candidates_per_hour": 3600.0 / cycle_s,
        "sandbox": status.sandbox,
        "restart_per_candidate_s": restart_per_candidate_s,
        "restart_candidates_per_hour": 3600.0 / restart_per_candidate_s,
        "ratio_restart_over_hot": restart_per_candidate_s / cycle_s,
    }
    doc["pool_size"] = pool_size
    doc["pool_settle_s"] = settle_s
    doc["vs_before"] = compare_with_before(doc["phase_median_s"], cycle_s,
                                           statistics.median(r["pool_wait_s"] for r in rows))
    out = Path(args.out) if args.out else ROOT / "benchmarks" / "results" / \
        f"{'cuda' if cuda else 'cpu'}-hot_reload.json"
    atomic_write_json(out, doc)

    print(f"\nhot reload: {model} layers {status.layers} on {args.device}, {len(rows)} candidates")
    print(f"\n{'cold start stage':<22}{'seconds':>10}")
    for s in STAGES:
        print(f"{s:<22}{doc['cold_start']['stages_median'][s]:>10.3f}")
    print(f"{'spawn to ready':<22}{cold_s:>10.3f}")
    print(f"\n{'hot-reload cycle':<22}{'median s':>10}")
    for p, v in doc["phase_median_s"].items():
        print(f"{p[:-2]:<22}{v:>10.3f}")
    print(f"{'cycle (wall)':<22}{cycle_s:>10.3f}")
    print(f"compiled ahead: {doc['compiled_ahead']} of {len(rows)} (told the next {args.queued} as queued)")
    for k, v in doc["cycle_median_by_kind_s"].items():
        print(f"  {k:<26}{v:>10.3f}")
    print(f"\ncandidates per hour, hot reload:          {doc['candidates_per_hour']:>10.0f}")
    print(f"candidates per hour, restart per candidate: {doc['restart_candidates_per_hour']:>8.0f}")
    print(f"seconds per candidate, restart / hot:       {doc['ratio_restart_over_hot']:>8.1f}x")
    for lbl, n in doc["graphed_cycles_by_point"].items():
        print(f"  {lbl:<28} graphed in {n}/{len(rows)} cycles")
    st = doc["stops"]
    print(f"\nA/B stops over {st['points_timed']} timed points: futility {st['stopped_futility']} "
          f"(median {st['median_pairs_futility']} pairs), settled {st['stopped_settled']}, every sample "
          f"{st['all_samples']}; median pairs {st['median_pairs']}; bench median "
          f"{st['bench_median_s_with_a_futility_stop']} s in {st['cycles_with_a_futility_stop']} cycles with a "
          f"futility stop, {st['bench_median_s_without']} s without")
    vb = doc["vs_before"]
    print(f"\njudge/executor split (sandbox: {doc['sandbox']}; pool of {pool_size} warm executors; median wait "
          f"for one {vb['pool_wait_median_s']:.3f} s)")
    print(f"{'phase':<10}{'now s':>9}{'before s':>10}{'delta s':>10}  cause")
    for p, r in vb["phases"].items():
        print(f"{p[:-2]:<10}{r['now_s']:>9.3f}{r['before_s']:>10.3f}{r['delta_s']:>+10.3f}  {r['cause']}")
    print(f"{'cycle':<10}{cycle_s:>9.3f}{BEFORE['cycle_s']:>10.3f}{vb['cycle_delta_s']:>+10.3f}  "
          f"({vb['cycle_ratio_now_over_before']:.2f}x the in-process engine on the H200; "
          f"{doc['candidates_per_hour']:.0f}/h now "
          f"vs {BEFORE['candidates_per_hour']}/h before)")
    print(f"targets: cycle < 1 s: {vb['targets']['cycle_under_1s']}; >= 3,600 candidates/h: "
          f"{vb['targets']['at_least_3600_per_hour']}")
    print(f"all candidates correct: {doc['all_correct']}   -> {out}")
    return 0 if doc["all_correct"] else 1


if __name__ == "__main__":
    sys.exit(main())
