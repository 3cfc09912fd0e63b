"""Multi-GPU: collective bandwidth and TP/EP decode step time, each against the cost model.

    python benchmarks/multi_gpu.py                  # >= 2 GPUs: NCCL all-reduce / all-to-all bus bandwidth
                                                    # over sizes, llama-8b decode at TP 1/2/4, a qwen3-moe
                                                    # slice (4 layers) at EP 2/4 -> results/<device>-multi-gpu.json
    python benchmarks/multi_gpu.py --cpu-check      # gloo on CPU processes: all-reduce time over sizes and
                                                    # the sharded forward vs the reference -> cpu-multi-gpu.json
    python benchmarks/multi_gpu.py --formulas       # cost_model's all-reduce / all-to-all on 8 x H200 NVLink vs
                                                    # published nccl-tests figures -> h200-multi-gpu-formulas.json

One process per GPU (persistent_engine.parallel.launch); NCCL_NVLS_ENABLE=0 and
TORCH_SYMM_MEM_DISABLE_MULTICAST=1 are forced for every child (NVLink multicast stays off).
Bus bandwidth follows nccl-tests: all-reduce S/t * 2(n-1)/n, all-to-all S/t * (n-1)/n, S the bytes
per rank; t is the slowest rank's mean over ``iters`` back-to-back collectives. Decode steps are
timed per rank with CUDA events around CUDA-graph replays (eager when capture fails), median of
samples, the slowest rank reported. Predictions: cost_model.estimate_step with Layout(tp, ep)
(the packaged calibration for the device when there is one), skew 0 (the seeded random router
spreads tokens evenly); collectives with cost_model.comm. Error = |pred - meas| / meas.
The engine's EP is the simple form (all tokens to every rank, one all-reduce), while the cost
model prices DeepEP-style all-to-all dispatch/combine: the EP rows show that gap as measured.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import torch

from compiler.plan.artifact import atomic_write_json
from persistent_engine.io_struct import WorkloadPoint

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
RESULTS = ROOT / "benchmarks" / "results"

GPU_SIZES = [2 ** p for p in range(13, 31, 2)]          # 8 KiB .. 1 GiB per rank
CPU_SIZES = [2 ** p for p in range(12, 25, 2)]          # 4 KiB .. 16 MiB per rank


def _d(b: int, c: int) -> WorkloadPoint:
    return WorkloadPoint("decode", b, c, 1, 1.0)


DECODE_POINTS = [_d(1, 1024), _d(32, 1024), _d(128, 2048)]
# (model, layers, [(tp, ep)]): llama-8b whole at TP 1/2/4; qwen3-moe 4 layers at EP 2/4 (tp = ep)
DECODE_SUITE = [("llama-8b", None, [(1, 1), (2, 1), (4, 1)]), ("qwen3-moe", [0, 1, 2, 3], [(2, 2), (4, 4)])]

# published nccl-tests bus bandwidth at large messages (>= 256 MiB), 8 GPUs, NVLink 4 + NVSwitch
PUBLISHED = {
    "all_reduce": {"busbw_gbs": (360.0, 480.0), "source": (
        "published (approximate): nccl-tests all_reduce_perf on 8xH100/H200 SXM NVLink reaches ~360-480 GB/s "
        "busbw at large messages; e.g. Alaya NeW 'NCCL-tests in practice' (2026) lists 460-480 GB/s for "
        "8xH100 SXM5 NVLink-only; H200 has the same NVLink 4 (450 GB/s per direction)")},
    "all_to_all": {"busbw_gbs": (300.0, 400.0), "source": (
        "published (approximate, lower confidence): nccl-tests alltoall_perf on 8xH100 SXM NVLink is commonly "
        "reported at ~300-400 GB/s busbw at large messages; no single cited table, verify on hardware")},
}


# ----------------------------------------------------------------------------- workers (one per rank)
def _sync(dev: str) -> None:
    if dev.startswith("cuda"):
        torch.cuda.synchronize(dev)


def collective_worker(rank: int, world: int, sizes: list[int], iters: int, device: str) -> list[dict]:
    import torch.distributed as dist

    dev = f"cuda:{rank}" if device == "cuda" else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    esize = torch.tensor([], dtype=dtype).element_size()
    rows = []
    for op in ("all_reduce", "all_to_all"):
        for size in sizes:
            n = max(world, size // esize // world * world)
            x = torch.ones(n, dtype=dtype, device=dev)
            y = torch.empty_like(x)

            def run():
                if op == "all_reduce":
                    dist.all_reduce(x)
                else:
                    dist.all_to_all_single(y, x)
            try:
                for _ in range(3):
                    run()
            except RuntimeError as e:                   # e.g. a backend without all-to-all
                rows.append({"op": op, "bytes": n * esize, "error": str(e).splitlines()[0]})
                break
            _sync(dev)
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(iters):
                run()
            _sync(dev)
            t = torch.tensor([(time.perf_counter() - t0) / iters], dtype=torch.float64, device=dev)
            dist.all_reduce(t, op=dist.ReduceOp.MAX)    # the slowest rank sets the time (NCCL: on the GPU)
            rows.append({"op": op, "bytes": n * esize, "time_s": float(t)})
    return rows


def _time_step(model, wl, samples: int, dev: str) -> tuple[list[float], str]:
    for _ in range(3):
        model.step(wl)
    if dev.startswith("cuda"):
        torch.cuda.synchronize(dev)
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            model.step(wl)
        torch.cuda.current_stream().wait_stream(s)
        graph, mode = torch.cuda.CUDAGraph(), "graph"
        try:
            with torch.cuda.graph(graph):
                model.step(wl)
            run = graph.replay
        except RuntimeError:
            mode, run = "eager", (lambda: model.step(wl))
        for _ in range(3):
            run()
        out = []
        for _ in range(samples):
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            run()
            b.record()
            b.synchronize()
            out.append(a.elapsed_time(b) / 1e3)
        return out, mode
    out = []
    for _ in range(samples):
        t = time.perf_counter()
        model.step(wl)
        out.append(time.perf_counter() - t)
    return out, "eager"


def decode_worker(rank: int, world: int, model_name: str, layers, ep: int, points: list[WorkloadPoint], samples: int,
                  device: str) -> list[dict]:
    import torch.distributed as dist

    from persistent_engine.parallel import ParallelConfig, build_sharded
    from persistent_engine.inputs.workloads import make_workload

    dev = f"cuda:{rank}" if device == "cuda" else "cpu"
    dtype = torch.bfloat16 if device == "cuda" else torch.float32
    model = build_sharded(model_name, ParallelConfig(tp=world, ep=ep), rank, layers=layers, device=dev, dtype=dtype,
                          seed=0, group=dist.group.WORLD)
    rows = []
    for i, point in enumerate(points):
        wl = make_workload(model, point, seed=i)
        dist.barrier()
        times, mode = _time_step(model, wl, samples, dev)
        med = torch.tensor([statistics.median(times)], dtype=torch.float64, device=dev)
        dist.all_reduce(med, op=dist.ReduceOp.MAX)
        rows.append({**point.to_dict(), "measured_s": float(med), "timing": mode, "samples": samples})
        del wl
    return rows


# ----------------------------------------------------------------------------- helpers
def _busbw(op: str, n: int, nbytes: float, t: float) -> float:
    factor = 2 * (n - 1) / n if op == "all_reduce" else (n - 1) / n
    return nbytes / t * factor / 1e9


def _predict_collective(hw, op: str, n: int, nbytes: float) -> float:
    from cost_model.comm import all_reduce_time, all_to_all_time

    if op == "all_reduce":
        return all_reduce_time(hw, n, nbytes)
    return all_to_all_time(hw, n, nbytes * (n - 1) / n)      # bytes each rank sends to remote peers


def _median_err(rows: list[dict]) -> float | None:
    errs = [r["abs_err"] for r in rows if r.get("abs_err") is not None]
    return statistics.median(errs) if errs else None


def _device_slug() -> str:
    name = torch.cuda.get_device_name(0).lower().replace("nvidia", "").strip()
    return name.split()[0].replace("-", "") if name else "cuda"


def _fmt_bytes(b: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if b < 1024 or unit == "GiB":
            return f"{b:.0f} {unit}"
        b /= 1024
    return f"{b:.0f}"


# ----------------------------------------------------------------------------- modes
def run_formulas(args) -> dict:
    from cost_model import get_hardware

    hw, n = get_hardware(args.hw), 8
    rows = []
    print(f"cost_model {hw.name}: {n} GPUs, scale-up {hw.scale_up_bw / 1e9:.0f} GB/s per direction, "
          f"alpha {hw.message_latency_s * 1e6:.0f} us, hop {hw.hop_latency_s * 1e6:.0f} us")
    print(f"{'op':<11}{'bytes':>10}{'pred us':>11}{'pred busbw':>12}{'published':>14}{'ratio':>8}")
    for op in ("all_reduce", "all_to_all"):
        lo, hi = PUBLISHED[op]["busbw_gbs"]
        for size in [2 ** p for p in range(20, 34, 2)]:               # 1 MiB .. 4 GiB
            t = _predict_collective(hw, op, n, size)
            bw = _busbw(op, n, size, t)
            large = size >= 256 * 2 ** 20
            ratio = bw / ((lo + hi) / 2) if large else None
            rows.append({"op": op, "gpus": n, "bytes": size, "predicted_s": t, "predicted_busbw_gbs": bw,
                         "published_busbw_gbs": [lo, hi] if large else None, "ratio_to_published_mid": ratio,
                         "within_published_range": (lo <= bw <= hi) if large else None})
            pub = f"{lo:.0f}-{hi:.0f}" if large else "-"
            print(f"{op:<11}{_fmt_bytes(size):>10}{t * 1e6:>11.1f}{bw:>12.1f}{pub:>14}"
                  f"{(f'{ratio:.2f}' if ratio else '-'):>8}")
    for op in PUBLISHED:
        print(f"{op}: {PUBLISHED[op]['source']}")
    return {"mode": "formulas", "hw": hw.name, "gpus": n, "published": PUBLISHED, "rows": rows}


def run_cpu_check(args) -> dict:
    from persistent_engine.parallel import check_sharded, launch

    out: dict = {"mode": "cpu-check", "backend": "gloo", "cpu_count": os.cpu_count(), "collectives": [],
                 "sharded_forward": []}
    print(f"{'ranks':>5} {'op':<11}{'bytes':>10}{'time us':>11}{'busbw GB/s':>12}")
    for world in args.worlds:
        for r in launch(collective_worker, world, "gloo", args=(CPU_SIZES, args.iters, "cpu"))[0]:
            r = {**r, "ranks": world}
            if "time_s" in r:
                r["busbw_gbs"] = _busbw(r["op"], world, r["bytes"], r["time_s"])
                print(f"{world:>5} {r['op']:<11}{_fmt_bytes(r['bytes']):>10}{r['time_s'] * 1e6:>11.1f}"
                      f"{r['busbw_gbs']:>12.2f}")
            else:
                print(f"{world:>5} {r['op']:<11} unsupported: {r['error']}")
            out["collectives"].append(r)
    for world in args.worlds:
        cases = [("tiny-dense", world, 1), ("tiny-moe", world, world), ("tiny-moe", world, 1)]
        rows = check_sharded(world, cases)
        out["sharded_forward"] += rows
        for case in cases:
            mine = [r for r in rows if r["model"] == case[0] and r["layout"].endswith(
                f"tp{world}" if case[2] == 1 else f"ep{world}")]
            print(f"sharded forward {case[0]:<10} tp{world} ep{case[2]}: max |err| "
                  f"{max(r['max_abs_err'] for r in mine):.2e} over {len(mine)} rank-points, "
                  f"{'ok' if all(r['ok'] for r in mine) else 'MISMATCH'}")
    out["all_ok"] = all(r["ok"] for r in out["sharded_forward"])
    return out


def run_gpu(args) -> dict:
    from cost_model import Layout, estimate_step, get_hardware, load_calibration
    from cost_model.estimate import DEFAULT_EFFICIENCY
    from persistent_engine.models.spec import ModelSpec
    from persistent_engine.parallel import launch

    ngpu = torch.cuda.device_count()
    slug = _device_slug()
    hw = get_hardware(args.hw or slug)
    calib = load_calibration(hw.name)
    eff = calib.efficiency if calib else DEFAULT_EFFICIENCY
    out: dict = {"mode": "gpu", "device": torch.cuda.get_device_name(0), "gpus": ngpu, "hw": hw.name,
                 "calibration": calib.source if calib else None, "env": {k: os.environ.get(k) for k in
                                                                        ("NCCL_NVLS_ENABLE", "TORCH_SYMM_MEM_DISABLE_MULTICAST")},
                 "collectives": [], "decode": []}
    worlds = sorted({w for w in (2, 4, 8, ngpu) if 2 <= w <= ngpu})
    print(f"{'gpus':>4} {'op':<11}{'bytes':>10}{'meas us':>10}{'busbw':>8}{'pred us':>10}{'pred bw':>9}{'err':>7}")
    for world in worlds:
        for r in launch(collective_worker, world, "nccl", args=(GPU_SIZES, args.iters, "cuda"))[0]:
            r = {**r, "gpus": world}
            if "time_s" in r:
                pred = _predict_collective(hw, r["op"], world, r["bytes"])
                r.update(busbw_gbs=_busbw(r["op"], world, r["bytes"], r["time_s"]), predicted_s=pred,
                         predicted_busbw_gbs=_busbw(r["op"], world, r["bytes"], pred),
                         abs_err=abs(pred - r["time_s"]) / r["time_s"])
                print(f"{world:>4} {r['op']:<11}{_fmt_bytes(r['bytes']):>10}{r['time_s'] * 1e6:>10.1f}"
                      f"{r['busbw_gbs']:>8.1f}{pred * 1e6:>10.1f}{r['predicted_busbw_gbs']:>9.1f}{r['abs_err']:>7.0%}")
            out["collectives"].append(r)
    print(f"\n{'model':<10}{'layout':<9}{'batch':>6}{'ctx':>6}{'meas ms':>9}{'pred ms':>9}{'err':>7} timing")
    for model_name, layers, layouts in DECODE_SUITE:
        spec = ModelSpec.from_name(model_name)
        idx = list(range(spec.num_layers)) if layers is None else layers
        for tp, ep in layouts:
            if tp > ngpu:
                continue
            rows = launch(decode_worker, tp, "nccl", args=(model_name, layers, ep, DECODE_POINTS, args.samples,
                                                           "cuda"))[0]
            layout = Layout(tp=tp, ep=ep)
            for r in rows:
                pred = estimate_step(spec, hw, layout, WorkloadPoint.from_dict(r), idx, eff, skew=0.0).latency_s
                r.update(model=model_name, layers=len(idx), tp=tp, ep=ep, predicted_s=pred,
                         abs_err=abs(pred - r["measured_s"]) / r["measured_s"])
                print(f"{model_name:<10}{layout.label().split()[0]:<9}{r['batch']:>6}{r['context']:>6}"
                      f"{r['measured_s'] * 1e3:>9.3f}{pred * 1e3:>9.3f}{r['abs_err']:>7.0%} {r['timing']}")
                out["decode"].append(r)
    out["median_abs_error"] = {"collectives": _median_err(out["collectives"]), "decode": _median_err(out["decode"]),
                               "target": 0.15}
    print(f"\nmedian |error|: collectives {out['median_abs_error']['collectives']}, "
          f"decode {out['median_abs_error']['decode']} (target <= 0.15)")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--cpu-check", action="store_true", help="gloo on CPU processes (no GPU needed)")
    mode.add_argument("--formulas", action="store_true", help="cost-model collectives vs published NCCL figures")
    ap.add_argument("--hw", default=None, help="cost-model hardware (default: detected; --formulas: h200)")
    ap.add_argument("--worlds", type=int, nargs="+", default=[2, 4], help="--cpu-check: process counts")
    ap.add_argument("--iters", type=int, default=None, help="collectives per timing (cuda 20, cpu 10)")
    ap.add_argument("--samples", type=int, default=30, help="decode steps timed per point")
    ap.add_argument("--out", default=None, help="JSON path (default under benchmarks/results/)")
    args = ap.parse_args(argv)
    from persistent_engine.parallel import SAFE_ENV, ParallelError

    os.environ.update(SAFE_ENV)
    try:
        if args.formulas:
            args.hw = args.hw or "h200"
            data, name = run_formulas(args), f"{args.hw}-multi-gpu-formulas.json"
        elif args.cpu_check:
            args.iters = args.iters or 10
            data, name = run_cpu_check(args), "cpu-multi-gpu.json"
        else:
            n = torch.cuda.device_count() if torch.cuda.is_available() else 0
            if n < 2:
                print(f"multi_gpu: needs >= 2 CUDA GPUs, found {n}; use --cpu-check or --formulas here", file=sys.stderr)
                return 2
            args.iters = args.iters or 20
            data = run_gpu(args)
            name = f"{_device_slug()}-multi-gpu.json"
    except ParallelError as e:
        print(f"multi_gpu: {e}", file=sys.stderr)
        return 2
    path = Path(args.out) if args.out else RESULTS / name
    atomic_write_json(path, data, indent=1)
    print(f"wrote {path}")
    return 0 if data.get("all_ok", True) else 1


if __name__ == "__main__":
    sys.exit(main())
