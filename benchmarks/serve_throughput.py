"""Serving throughput: ``tkcc serve`` with a plan, with the reference engine, and with the reference
under ``torch.compile``, each replaying a trace at its own rate and faster, through the real HTTP
server (``compiler.serve.openai_app.ServeServer`` on loopback) measured by ``tkcc bench serve`` (its own process).

    python benchmarks/serve_throughput.py                                  # H200: llama-1b, random weights
    python benchmarks/serve_throughput.py --device cpu --model tiny-dense --plan '' --requests 8 \\
        --rates 1,4 --max-input 64 --max-output 8 --graph-sizes '' --out /tmp/serve.json   # CPU logic check

Variants (the same seeded weights, engine, scheduler and CUDA-graph decode in all three):
  plan           the plan's overrides (``kernels/composed.py``, hashes verified) and CONFIG knobs
  reference      the plain-torch reference ops
  torch_compile  the reference with the decode forward under ``torch.compile`` (default backend and
                 mode), dynamic in the batch and the block-table width only, the weights' shapes static
                 (``persistent_engine.serving.engine.compiled_decode``, as vLLM marks its token dim),
                 then graph-captured at the reference's ``--graph-sizes`` x 4 block-table widths (the
                 same padding as the reference: a decode replays the smallest size that holds it, and
                 its cost grows with that size). Two compiles: one dynamic graph for sizes >= 2, one
                 for size 1, which torch.compile specialises (widths are >= 2 blocks). A progress line
                 per capture (size, width, seconds, one replay's device time, compiles so far), also
                 kept in the JSON (``startup_log``, ``graph_replay_ms`` by "size x width"); per run,
                 ``decode_rows`` / ``decode_padded_rows``: rows the graphs replayed for real sequences
                 and for padding
Per variant: start-up split into loading and the engine's warm-up (KV pools, CUDA-graph capture and,
for torch_compile, the compiles: ``warmup_s`` and ``compiles``) and an unmeasured warm-up replay of
``--warmup-requests`` requests (first calls of kernels at the trace's shapes; on CPU, where nothing
is captured, torch.compile compiles here: ``compiles_so_far`` per run), never counted in a run; per rate:
output tokens/s, requests/s, TTFT/TPOT/ITL p50/p90/p99, goodput under the SLA, and the replay model's
predicted TTFT/TPOT with its error. The first ``--requests`` requests of the trace are replayed
(arrival times divided by the rate; lengths clipped to ``--max-input``/``--max-output``); every run
draws fresh prompts, so no run finds another's in the prefix cache.
The JSON (``benchmarks/results/h200-serve.json`` on cuda, ``cpu-serve.json`` on CPU, or ``--out``) is
rewritten atomically after every run, ``"complete": false`` until the last one: a run cut short keeps
what finished. Progress lines go to stderr; the table to stdout.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from compiler.plan.artifact import atomic_write_json  # noqa: E402

from compiler.serve.openai_app import ServeServer  # noqa: E402
from compiler.serve.runtime import ServeOptions, build_runtime  # noqa: E402
from persistent_engine.serving.engine import compile_count  # noqa: E402


def newest_version(plan_root: str) -> str:
    from compiler.plan import artifact as plan_mod

    return str(plan_mod.resolve(plan_root))


def log(msg: str) -> None:
    print(f"[serve_throughput {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def variant_options(name: str, args, plan: str | None) -> ServeOptions:
    """The runtime options of one variant: all three capture the same ``--graph-sizes`` (a variant
    padding its decodes to coarser sizes pays for rows it does not serve); torch_compile compiles the reference,
    plan runs as ``tkcc serve --plan`` does (compiled around its overrides on CUDA), reference eagerly."""
    sizes = args.graph_sizes
    return ServeOptions(model=None if plan else args.model, plan=plan, device=args.device,
                        max_model_len=args.max_model_len, compile={"torch_compile": True, "reference": False}.get(name),
                        graphs=bool(sizes), graph_sizes=sizes, max_num_seqs=args.max_num_seqs,
                        kv_cache_bytes=int(args.kv_cache_gib * (1 << 30)) if args.kv_cache_gib else None,
                        spot_check=args.spot_check, mixed_batches=args.mixed_batches if name == "plan" else None)


def graph_kernels(rt, top: int = 8) -> list[dict]:
    """The ``top`` kernels by device time of one replay of the smallest decode graph (a batch of 1 or 2,
    the narrowest table): what a decode step's fixed cost is spent on (CUDA only; about a second)."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    graphs = rt.engine.graphs
    if graphs is None or not torch.cuda.is_available() or not graphs.replay_ms:
        return []
    g = graphs.graphs[(graphs.sizes[0], graphs.widths[0])][0]
    g.replay()
    torch.cuda.synchronize()
    try:
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            g.replay()
            torch.cuda.synchronize()
    except RuntimeError as e:                       # a profiler that cannot start costs the figure only
        return [{"error": str(e)[:200]}]
    rows = [{"kernel": e.key[:120], "calls": e.count, "device_ms": e.device_time_total / 1e3}
            for e in prof.key_averages() if e.device_time_total > 0]
    return sorted(rows, key=lambda r: -r["device_ms"])[:top]


def _graph_rows(rt) -> tuple[int, int]:
    graphs = rt.engine.graphs
    return (graphs.rows, graphs.padded_rows) if graphs is not None else (0, 0)


def run_variant(name: str, args, plan: str | None, on_run) -> dict:
    """Builds the variant's runtime, serves it on loopback and replays every rate; ``on_run(out)``
    after each rate (the caller writes the JSON)."""
    import torch

    opts = variant_options(name, args, plan)
    log(f"{name}: building the runtime (graphs {list(opts.graph_sizes) or 'off'}{', torch.compile' if opts.compile else ''})")
    compiles0 = compile_count()
    startup_log: list[str] = []

    def progress(line: str) -> None:
        startup_log.append(line)
        log(f"{name}: {line}")

    rt = build_runtime(opts, progress)
    out = {"variant": name, "mixed_batches": rt.engine.cfg.mixed_batches, "startup_s": sum(rt.startup_s.values()),
           "load_s": rt.startup_s.get("load_s"),
           "warmup_s": rt.startup_s.get("engine_s"), "compiles": compile_count() - compiles0,
           "plan": rt.plan_dir, "overrides": sorted(rt.plan_overrides),
           "variants": [{"batches": [v.lo, v.hi], "overrides": sorted(o)} for v, o in rt.variants],
           "engine": {"max_num_seqs": rt.engine.cfg.max_num_seqs,
                      "max_num_batched_tokens": rt.engine.cfg.max_num_batched_tokens,
                      "block_size": rt.engine.cfg.block_size, "kv_blocks": rt.engine.kv.num_blocks - 1,
                      "cuda_graph_batch_sizes": list(rt.engine.cfg.cuda_graph_batch_sizes)},
           "graph_replay_ms": {f"{b}x{w}": ms for (b, w), ms in rt.engine.graphs.replay_ms.items()}
           if rt.engine.graphs is not None else {},
           "startup_log": startup_log, "graph_kernels": graph_kernels(rt), "runs": []}
    for k in out["graph_kernels"][:3]:
        log(f"{name}: smallest decode graph's kernel {k}")
    log(f"{name}: ready, load {out['load_s']:.1f} s, engine warm-up (graphs, compiles) {out['warmup_s']:.1f} s, "
        f"{out['compiles']} compiled graphs")
    with ServeServer(rt) as server:
        if args.warmup_requests:
            t0 = time.perf_counter()
            log(f"{name}: warm-up replay of {args.warmup_requests} requests (kernels' first shapes; not measured)")
            bench_client(args, server.url, 8 * max(args.rates), args.warmup_requests, predict=False)
            out["warmup_replay_s"] = time.perf_counter() - t0
        for rate in args.rates:
            t0, rows0 = time.perf_counter(), _graph_rows(rt)
            log(f"{name} {rate}x: calibrating the replay model, then {args.requests} requests")
            res = bench_client(args, server.url, rate)
            res["wall_s"] = time.perf_counter() - t0
            rows = _graph_rows(rt)
            res["decode_rows"], res["decode_padded_rows"] = rows[0] - rows0[0], rows[1] - rows0[1]
            res["compiles_so_far"] = compile_count() - compiles0
            if rt.checker is not None:                   # the spot-check's work so far (tkcc serve --spot-check)
                c = rt.checker
                res["spot_checks"] = {"fraction": c.fraction, "checks": c.checks, "failures": c.failures,
                                      "skipped": c.skipped, "disabled": sorted(c.disabled)}
            out["runs"].append(res)
            print(row(name, res), flush=True)
            on_run(out)
    del rt, server
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    return out


def bench_client(args, url: str, rate: float, requests: int | None = None, predict: bool = True) -> dict:
    """``tkcc bench serve --json`` in its own process: the client's event loop must not share the
    server's GIL (in one process it delays the server's streaming and its own clock readings)."""
    cmd = [sys.executable, "-m", "compiler", "bench", "serve", "--traffic", args.traffic, "--url", url,
           "--rate", str(rate), "--max-requests", str(requests or args.requests), "--max-input", str(args.max_input),
           "--max-output", str(args.max_output), "--ttft-ms", str(args.ttft_ms), "--tpot-ms", str(args.tpot_ms),
           "--json"] + ([] if predict else ["--no-predict"])
    r = subprocess.run(cmd, stdout=subprocess.PIPE, text=True, cwd=ROOT, timeout=args.run_timeout,
                       env={**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])})
    if r.returncode != 0:
        raise RuntimeError(f"tkcc bench serve exited {r.returncode} at {rate}x")
    return json.loads(r.stdout)


def row(name: str, res: dict) -> str:
    p = res.get("predicted", {})
    e = p.get("error", {})
    pct = lambda v: "   -" if v is None else f"{100 * v:+4.0f}%"  # noqa: E731
    return (f"{name:<14} {res['rate']:>4}x  {res['output_tokens_per_s']:9.1f} tok/s  TTFT p50 "
            f"{res['ttft_ms']['p50'] or 0:8.1f} ms (pred {p.get('ttft_ms', {}).get('p50') or 0:8.1f} "
            f"{pct(e.get('ttft_p50'))})  TPOT p50 {res['tpot_ms']['p50'] or 0:7.2f} ms (pred "
            f"{p.get('tpot_ms', {}).get('p50') or 0:7.2f} {pct(e.get('tpot_p50'))})  failed {res['failed']}  "
            f"[{res['wall_s']:.0f} s]")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default="llama-1b")
    ap.add_argument("--plan", default=str(ROOT / "examples/plans/llama-1b-h200"),
                    help="plan root (newest version) or version dir; '' skips the plan variant")
    ap.add_argument("--traffic", default=str(ROOT / "examples/traffic/azure2023_conv.parquet"))
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--rates", default="1,4,8", help="replay speed-ups (default 1,4,8)")
    ap.add_argument("--requests", type=int, default=40, help="requests replayed per run (default 40: 24 s of "
                    "the Azure conversation trace at 1x)")
    ap.add_argument("--warmup-requests", type=int, default=8,
                    help="requests replayed once, unmeasured, before the first rate (default 8; 0: none)")
    ap.add_argument("--run-timeout", type=float, default=300.0, help="seconds one replay may take (default 300)")
    ap.add_argument("--max-input", type=int, default=2048)
    ap.add_argument("--max-output", type=int, default=256)
    ap.add_argument("--max-model-len", type=int, default=2560)
    ap.add_argument("--max-num-seqs", type=int, default=128)
    ap.add_argument("--kv-cache-gib", type=float, default=None,
                    help="KV pools of every variant, GiB (default: half the free device memory)")
    ap.add_argument("--graph-sizes", default="1,2,4,8,16,32,64,128",
                    help="decode CUDA-graph batch sizes ('' disables graphs)")
    ap.add_argument("--variants", default="plan,reference,torch_compile",
                    help="comma-separated, in order: plan, reference, torch_compile")
    ap.add_argument("--ttft-ms", type=float, default=1000.0)
    ap.add_argument("--tpot-ms", type=float, default=50.0)
    ap.add_argument("--spot-check", type=float, default=0.02,
                    help="the plan variant's spot-check fraction (tkcc serve --spot-check; 0 disables)")
    ap.add_argument("--mixed-batches", action=argparse.BooleanOptionalAction, default=None,
                    help="the plan's steps with chunks and decodes as one forward (default: as tkcc serve decides)")
    ap.add_argument("--out", default=None)
    args = ap.parse_args(argv)
    try:
        args.rates = [float(r) for r in args.rates.split(",") if r]
        args.graph_sizes = tuple(int(b) for b in args.graph_sizes.split(",") if b)
    except ValueError as e:
        print(f"serve_throughput: bad number in --rates/--graph-sizes: {e}", file=sys.stderr)
        return 2
    variants = [v for v in args.variants.split(",") if v]
    bad = [v for v in variants if v not in ("plan", "reference", "torch_compile")]
    if bad or not variants or not args.rates or args.requests < 1:
        print(f"serve_throughput: --variants takes plan, reference, torch_compile (got {args.variants!r}); "
              f"--rates and --requests must be non-empty and >= 1", file=sys.stderr)
        return 2
    if not args.plan:
        variants = [v for v in variants if v != "plan"]

    import torch

    from persistent_engine.versions import software_versions

    if args.device == "cuda" and not torch.cuda.is_available():
        print("serve_throughput: no CUDA device (use --device cpu)", file=sys.stderr)
        return 2
    torch.manual_seed(0)
    plan = newest_version(args.plan) if args.plan else None
    out = Path(args.out or ROOT / "benchmarks/results" / ("h200-serve.json" if args.device == "cuda" else "cpu-serve.json"))
    t0 = time.perf_counter()
    doc = {"benchmark": "serve_throughput", "complete": False, "model": args.model, "weights": "random (seed 0)",
           "traffic": os.path.relpath(args.traffic, ROOT), "rates": args.rates, "requests_per_run": args.requests,
           "max_input": args.max_input, "max_output": args.max_output, "device": args.device,
           "spot_check": args.spot_check,
           "variants_requested": variants, "graph_sizes": list(args.graph_sizes),
           "gpu": torch.cuda.get_device_name(0) if args.device == "cuda" else None,
           "software": software_versions(driver=args.device == "cuda"), "wall_s": 0.0, "variants": []}

    def save(variant: dict) -> None:
        done = [v for v in doc["variants"] if v["variant"] != variant["variant"]]
        doc["variants"] = done + [variant]
        doc["wall_s"] = time.perf_counter() - t0
        atomic_write_json(out, doc)

    failed = []
    for v in variants:
        try:
            save(run_variant(v, args, plan if v == "plan" else None, save))
            log(f"{v}: done, {time.perf_counter() - t0:.0f} s so far; {out} updated")
        except (RuntimeError, subprocess.TimeoutExpired, torch.OutOfMemoryError) as e:   # the next variant still runs
            failed.append(v)
            kept = next((x for x in doc["variants"] if x["variant"] == v), {"variant": v, "runs": []})
            save({**kept, "error": f"{type(e).__name__}: {e}"[:500]})
            log(f"{v}: FAILED ({type(e).__name__}: {str(e)[:200]}); the runs it finished are kept")
    doc["complete"] = not failed
    doc["wall_s"] = time.perf_counter() - t0
    atomic_write_json(out, doc)
    print(f"wrote {out} ({doc['wall_s']:.0f} s){'; failed: ' + ', '.join(failed) if failed else ''}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
