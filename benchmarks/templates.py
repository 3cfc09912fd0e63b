"""Each kernel template against its reference op at a model's workload shapes: knob search, best
configuration, time, GB/s and % of peak bandwidth.

    python benchmarks/templates.py --device cuda --models llama-1b     # then --models qwen3-moe (rows merge)
    python benchmarks/templates.py --device cpu                        # tiny-dense + tiny-moe, torch templates

Per model, per workload point (decode batches and one prefill chunk), per op with templates on the
device, per shape the registry feeds that op (``OpDef.shapes``): the reference is timed, then each
template's knob space is searched (default first, then mutations of the best so far, at most
``--budget`` valid settings); a setting counts only when its output matches the reference within the
op's tolerance. Timing: on CUDA, CUDA events around a CUDA-graph replay of the call (eager when the
call cannot be captured), L2 flushed before every sample, median of ``--samples``; on CPU,
``perf_counter_ns`` medians. Bytes are what the op must move at least (weights and activations read,
outputs written; for attention the context's K/V only, for MoE the selected experts only). Peak
bandwidth is measured (device-to-device copy, read + write) and also the datasheet figure
(``--peak-gbs``; H200 4800). Prints a table; writes JSON to
``benchmarks/results/<device>-templates.json`` (atomically).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import random
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from agents.offline.strategy import mutate  # noqa: E402
from agents.templates import Choice, dims_of, load_candidate, render_candidate, templates_for  # noqa: E402
from persistent_engine.io_struct import WorkloadPoint  # noqa: E402
from persistent_engine.models.spec import ModelSpec  # noqa: E402
from persistent_engine.ops import registry  # noqa: E402
from persistent_engine.ops.contract import compare_outputs  # noqa: E402
from persistent_engine.versions import driver_version, package_version  # noqa: E402

DATASHEET_GBS = {"cuda": 4800.0, "cpu": None}


# ----------------------------------------------------------------------------- timing
class Timer:
    """Median seconds of one call. CUDA: graph replay (when capturable) between L2 flushes."""

    def __init__(self, device: str, samples: int):
        self.device, self.samples = device, samples
        self.flush = torch.empty(256 << 20, dtype=torch.uint8, device=device) if device == "cuda" else None

    def __call__(self, fn, args) -> float:
        if self.device != "cuda":
            for _ in range(3):
                fn(*args)
            ts = []
            for _ in range(self.samples):
                t0 = time.perf_counter_ns()
                fn(*args)
                ts.append(time.perf_counter_ns() - t0)
            return statistics.median(ts) * 1e-9
        run = self._graphed(fn, args)
        start = [torch.cuda.Event(enable_timing=True) for _ in range(self.samples)]
        end = [torch.cuda.Event(enable_timing=True) for _ in range(self.samples)]
        for i in range(self.samples):
            self.flush.zero_()
            start[i].record()
            run()
            end[i].record()
        torch.cuda.synchronize()
        return statistics.median(s.elapsed_time(e) for s, e in zip(start, end)) * 1e-3

    def _graphed(self, fn, args):
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                fn(*args)
        torch.cuda.current_stream().wait_stream(stream)
        torch.cuda.synchronize()
        try:
            graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(graph):
                fn(*args)
            torch.cuda.synchronize()
            return graph.replay
        except Exception:  # noqa: BLE001 - host syncs (e.g. .tolist()) cannot be captured
            torch.cuda.synchronize()
            return lambda: fn(*args)


def copy_bandwidth_gbs(device: str) -> float:
    """Device-to-device copy bandwidth (read + write), GB/s."""
    n = (1 << 30) if device == "cuda" else (64 << 20)
    a = torch.empty(n, dtype=torch.uint8, device=device)
    b = torch.empty_like(a)
    t = Timer(device, 10)(lambda x, y: y.copy_(x), (a, b))
    return 2 * n / t / 1e9


# ----------------------------------------------------------------------------- bytes moved
def bytes_moved(op: str, args: tuple, out, writes: tuple = ()) -> float:
    """Bytes an op must move at least: its tensor arguments read once and its outputs written; a pool it
    writes in place (``writes``: the OpDef's SlotWrites, e.g. the K/V cache) counts its written rows only."""
    outs = out if isinstance(out, (tuple, list)) else (out,)
    out_b = sum(o.numel() * o.element_size() for o in outs)
    pools = {w.pool for w in writes}
    for w in writes:                    # a pool [NB, BS, *row], or a tuple of them written at the same rows
        for pool in args[w.pool] if isinstance(args[w.pool], tuple) else (args[w.pool],):
            out_b += args[w.slots].numel() * pool[0, 0].numel() * pool.element_size()
    args = tuple(a for i, a in enumerate(args) if i not in pools)
    if op in ("attention_decode", "attention_prefill"):       # each sequence's context read once
        q, kc, vc, cl = args[0], args[1], args[2], args[-2]
        per_tok = kc.shape[2] * (kc.shape[3] + vc.shape[3]) * kc.element_size()
        return float(cl.long().sum()) * per_tok + q.numel() * q.element_size() + out_b
    if op == "moe_experts":
        x, w13, w2, tw, ids = args
        used = int(torch.unique(ids).numel())
        per_e = (w13[0].numel() + w2[0].numel()) * w13.element_size()
        return used * per_e + x.numel() * x.element_size() + out_b
    return float(sum(a.numel() * a.element_size() for a in args if isinstance(a, torch.Tensor)) + out_b)


# ----------------------------------------------------------------------------- search
def fit_seed(template, shape: dict, programs: int = 264) -> dict | None:
    """The default fitted to this shape: the row-block knob (``*_BLOCK_D``, ``*_BLOCK_I``) to the
    smallest value that holds the row in one block; for the composite GEMVs (``*_BLOCK_N`` with
    ``*_SPLIT_K``, shapes with ``N``) the smallest SPLIT_K, then the widest BLOCK_N up to 16, that
    give at least ``programs`` programs (2 per SM), and MAX_T raised to cover the shape's rows."""
    row = shape.get("x", [0])[-1] // (2 if template.op == "silu_and_mul" else 1) if "x" in shape else 0
    knobs = template.default()
    names = {k.name: k for k in template.knobs}
    for k in template.knobs:
        if row and k.name.endswith(("_BLOCK_D", "_BLOCK_I")):
            fits = [v for v in k.values if v >= row]
            knobs[k.name] = min(fits) if fits else max(k.values)
    pre = template.knobs[0].name.split("_")[0]
    bn, sk, mt = names.get(f"{pre}_BLOCK_N"), names.get(f"{pre}_SPLIT_K"), names.get(f"{pre}_MAX_T")
    if bn and sk and mt and "N" in shape and "T" in shape:
        grid = sorted(((-b, s) for b in bn.values if b <= 16 for s in sk.values
                       if -(-shape["N"] // b) * s >= programs), key=lambda bs: (bs[1], bs[0]))
        b, s = (-grid[0][0], grid[0][1]) if grid else (min(bn.values), max(sk.values))
        knobs[bn.name], knobs[sk.name] = b, s
        fits = [v for v in mt.values if v >= shape["T"]]
        if fits and knobs[mt.name] < shape["T"]:
            knobs[mt.name] = min(fits)
    return knobs if knobs != template.default() else None


def search(template, op_def, args, ref_hi, timer, dims, budget: int, rng: random.Random,
           start: dict | None = None, fit: dict | None = None):
    """(best_knobs, best_s, tried, rejected): the default, ``fit`` (row-fitted blocks) and ``start``
    (the best at the previous point) first, then mutations of the best so far."""
    atol, rtol = op_def.tolerance(args_dtype(args))
    tried, best, best_t, rejected = set(), None, float("inf"), 0
    seeds = [template.default()] + [dict(k) for k in (fit, start) if k]
    attempts = 0
    while len(tried) < budget and attempts < 20 * budget:
        attempts += 1
        knobs = seeds.pop() if seeds else mutate(template, best or template.default(), rng, n=rng.choice((1, 1, 2)))
        key = Choice(template, knobs).key()
        if key in tried or template.check(knobs, dims):
            continue
        tried.add(key)
        try:
            fn = load_candidate(render_candidate([Choice(template, knobs)]))["OVERRIDES"][template.op]
            out = fn(*args)
            outs = out if isinstance(out, (tuple, list)) else (out,)
            if compare_outputs(tuple(outs), ref_hi, atol, rtol):
                rejected += 1
                continue
            t = timer(fn, args)
        except Exception as exc:  # noqa: BLE001 - a setting that fails to compile or run is skipped
            rejected += 1
            print(f"    {key}: {type(exc).__name__}: {str(exc).splitlines()[0][:120] if str(exc) else ''}",
                  file=sys.stderr)
            continue
        if t < best_t:
            best, best_t = dict(knobs), t
    return best, best_t, len(tried), rejected


def args_dtype(args) -> torch.dtype:
    for a in args:
        if isinstance(a, torch.Tensor) and a.is_floating_point():
            return a.dtype
    return torch.float32


def points_for(device: str, batches: list[int], context: int, chunk: int) -> list[WorkloadPoint]:
    return [*(WorkloadPoint("decode", b, context, 1, 1.0) for b in batches), WorkloadPoint("prefill", 1, 0, chunk, 1.0)]


def _upcast(args):
    return tuple(a.to(torch.float32) if isinstance(a, torch.Tensor) and a.is_floating_point() else a for a in args)


def run(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--models", default=None, help="comma list (default llama-1b,qwen3-moe on cuda; tiny-dense,tiny-moe on cpu)")
    p.add_argument("--batches", default=None, help="decode batches (default 1,4,16,64 on cuda; 1,8,64 on cpu)")
    p.add_argument("--context", type=int, default=None, help="tokens in the KV cache at decode (1024 cuda, 256 cpu)")
    p.add_argument("--chunk", type=int, default=None, help="prefill chunk (512 cuda, 64 cpu)")
    p.add_argument("--ops", default=None, help="comma list of ops (default: every op with a template)")
    p.add_argument("--budget", type=int, default=None, help="knob settings per template and shape (8 cuda, 3 cpu)")
    p.add_argument("--samples", type=int, default=None, help="timed samples per measurement (50 cuda, 50 cpu)")
    p.add_argument("--max-minutes", type=float, default=9.0, help="stop searching after this long")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (--device cpu)")
    p.add_argument("--peak-gbs", type=float, default=None, help="datasheet bandwidth (4800 for the H200)")
    p.add_argument("--out", default=None)
    p.add_argument("--seed", type=int, default=0)
    a = p.parse_args(argv)
    if a.device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda but no CUDA device is visible", file=sys.stderr)
        return 2
    cuda = a.device == "cuda"
    models = (a.models or ("llama-1b,qwen3-moe" if cuda else "tiny-dense,tiny-moe")).split(",")
    batches = [int(b) for b in (a.batches or ("1,4,16,64" if cuda else "1,8,64")).split(",")]
    context, chunk = a.context or (1024 if cuda else 256), a.chunk or (512 if cuda else 64)
    budget, samples = a.budget or (8 if cuda else 3), a.samples or 50
    peak = a.peak_gbs if a.peak_gbs is not None else DATASHEET_GBS[a.device]
    only = set(a.ops.split(",")) if a.ops else None
    if not cuda:
        torch.set_num_threads(a.threads)         # one thread, as the engine runs: no oversubscription
    out_path = Path(a.out or ROOT / "benchmarks" / "results" / f"{a.device}-templates.json")
    timer = Timer(a.device, samples)
    sms = torch.cuda.get_device_properties(0).multi_processor_count if cuda else 1
    measured = copy_bandwidth_gbs(a.device)
    rng = random.Random(a.seed)
    deadline = time.monotonic() + 60 * a.max_minutes
    rows, truncated = [], False
    carried: dict[tuple, dict] = {}      # (model, template, shape index) -> best knobs at the last point
    print(f"device {a.device}; copy bandwidth {measured:.0f} GB/s; datasheet {peak or '-'} GB/s", flush=True)
    for model in models:
        spec = ModelSpec.from_name(model)
        dims = dims_of(spec)
        for point in points_for(a.device, batches, context, chunk):
            for op in sorted({t.op for t in templates_for(device=a.device)}):
                if only and op not in only:
                    continue
                d = registry.get(op)
                for si, shape in enumerate(d.shapes(spec, point)):
                    if time.monotonic() > deadline:
                        truncated = True
                        break
                    args = d.make_inputs(shape, torch.bfloat16, a.device, a.seed)
                    ref_out = d.reference(*args)
                    ref_hi = d.reference(*_upcast(args))
                    ref_hi = tuple(ref_hi) if isinstance(ref_hi, (tuple, list)) else (ref_hi,)
                    moved = bytes_moved(op, args, ref_out, d.writes)
                    ref_t = timer(d.reference, args)
                    for t in templates_for(op, a.device):
                        knobs, best_t, tried, rejected = search(t, d, args, ref_hi, timer, dims, budget, rng,
                                                                start=carried.get((model, t.name, si)),
                                                                fit=fit_seed(t, shape, 2 * sms))
                        if knobs is not None:
                            carried[(model, t.name, si)] = knobs
                        row = {"model": model, "phase": point.phase, "batch": point.batch,
                               "chunk": point.chunk, "op": op, "shape": shape, "template": t.name,
                               "reference_us": ref_t * 1e6, "best_us": None if knobs is None else best_t * 1e6,
                               "speedup": None if knobs is None else ref_t / best_t, "best_knobs": knobs,
                               "settings_tried": tried, "settings_rejected": rejected, "bytes": moved,
                               "reference_gbs": moved / ref_t / 1e9,
                               "best_gbs": None if knobs is None else moved / best_t / 1e9}
                        row["pct_of_measured_bw"] = None if knobs is None else 100 * row["best_gbs"] / measured
                        row["pct_of_datasheet_bw"] = (None if knobs is None or not peak
                                                      else 100 * row["best_gbs"] / peak)
                        rows.append(row)
                        _print_row(row)
    doc = {"benchmark": "templates", "device": a.device, "device_name": _device_name(a.device),
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "torch": torch.__version__, "triton": package_version("triton"), "python": platform.python_version(),
           "driver": driver_version() if torch.cuda.is_available() else None, "copy_bandwidth_gbs": measured, "datasheet_bandwidth_gbs": peak,
           "timing": "cuda events around CUDA-graph replays, L2 flushed" if cuda else "perf_counter_ns medians",
           "samples": samples, "budget": budget, "truncated": truncated,
           "rows": _kept_rows(out_path, models) + rows}
    _write_atomic(out_path, json.dumps(doc, indent=1))
    print(f"wrote {out_path} ({len(rows)} rows{', truncated by --max-minutes' if truncated else ''})")
    return 0


def _kept_rows(path: Path, models: list[str]) -> list[dict]:
    """Rows of other models from an earlier run into the same file (one model per call fits better
    in a time limit); rows of the models measured now are replaced."""
    try:
        old = json.loads(path.read_text())
    except (OSError, ValueError):
        return []
    return [r for r in old.get("rows", []) if isinstance(r, dict) and r.get("model") not in models]


def _print_row(r: dict) -> None:
    shape = ",".join(f"{k}={v}" for k, v in r["shape"].items())
    if r["best_us"] is None:
        print(f"{r['model']:10s} {r['phase']:7s} b={r['batch']:<3d} {r['op']:18s} {r['template']:34s} "
              f"ref {r['reference_us']:9.1f}us  no valid setting  [{shape}]", flush=True)
        return
    pct = r["pct_of_datasheet_bw"] if r["pct_of_datasheet_bw"] is not None else r["pct_of_measured_bw"]
    print(f"{r['model']:10s} {r['phase']:7s} b={r['batch']:<3d} {r['op']:18s} {r['template']:34s} "
          f"ref {r['reference_us']:9.1f}us best {r['best_us']:9.1f}us x{r['speedup']:5.2f} "
          f"{r['best_gbs']:8.1f} GB/s {pct:5.1f}%  [{shape}]", flush=True)


def _device_name(device: str) -> str:
    return torch.cuda.get_device_name() if device == "cuda" else (platform.processor() or platform.machine())


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    os.replace(tmp, path)


if __name__ == "__main__":
    sys.exit(run())
