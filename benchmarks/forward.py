"""The reference forward pass: decode ms per step and the share of HBM bandwidth it reaches.

    python benchmarks/forward.py --device cuda      # llama-1b (all 16 layers) batch 1 and 64, qwen3-moe 2-layer slice
    python benchmarks/forward.py --device cpu       # tiny-dense, tiny-moe, small batches (works anywhere)

Per case (model, layers, batch, context): the workload's KV cache holds ``--context`` tokens per
sequence; one step is ``model.step(workload)`` (embedding, every layer, final norm, lm_head) with the
plain-torch reference ops. Timing: ``persistent_engine.measure.timing.FairTimer``, the benchmarks' one timer: on
CUDA the step captured in a CUDA graph (the decode path has no host sync) and eager, each ``--samples``
calls back to back between CUDA events (``graph_ms`` / ``eager_ms``, the headline) and one call after an
L2 flush (``timings[*].one_replay_ms``), host dispatch beside (the graph's kept out of its window). On
CPU, ``perf_counter_ns`` around eager steps, caches flushed before a single call.

Bytes read per step = weights the step must read (every weight except the embedding table, of which
only B rows are read; a tied lm_head reads the table once; for MoE only the experts the batch routed
to, counted from the actual routing) + the context's KV cache. % of peak = bytes / time / peak, where
peak is the datasheet HBM bandwidth (``--peak-gbs``, else the catalogue entry matching the device
name) and, separately, a measured device-to-device copy bandwidth (read + write). Prints a table;
writes ``benchmarks/results/<device>-forward.json`` atomically.
"""

from __future__ import annotations

import argparse
import datetime
import functools
import platform
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from compiler.plan.artifact import atomic_write_json  # noqa: E402
from persistent_engine.models.decoder import build_model  # noqa: E402
from persistent_engine.models.spec import ModelSpec  # noqa: E402
from persistent_engine.ops import registry  # noqa: E402
from persistent_engine.measure.timing import FairTimer, FairTiming, capture_graph  # noqa: E402
from persistent_engine.versions import software_versions  # noqa: E402
from persistent_engine.inputs.workloads import make_workload  # noqa: E402
from persistent_engine.io_struct import WorkloadPoint  # noqa: E402

DEFAULT_CASES = {
    "cuda": ["llama-1b:all@1", "llama-1b:all@64", "qwen3-moe:0,1@1", "qwen3-moe:0,1@64"],
    "cpu": ["tiny-dense:all@1", "tiny-dense:all@8", "tiny-moe:all@1", "tiny-moe:all@8"],
}
DATASHEET_GBS = {"h200": 4800, "h100": 3350, "b200": 7700, "b300": 7750, "gb200": 8000, "gb300": 8000,
                 "mi300x": 5300, "mi355x": 8000}


def parse_case(text: str) -> tuple[str, list[int] | None, int]:
    """'alias:layers@batch' with layers 'all', 'N' (first N) or 'i,j'."""
    head, _, batch = text.rpartition("@")
    alias, _, layers = head.partition(":")
    if layers in ("", "all"):
        sel = None
    elif "," in layers:
        sel = [int(x) for x in layers.split(",")]
    else:
        sel = list(range(int(layers)))
    return alias, sel, int(batch)


def copy_bandwidth_gbs(device: str, nbytes: int) -> float:
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    times = []
    for _ in range(5):
        _sync(device)
        t = time.perf_counter()
        dst.copy_(src)
        _sync(device)
        times.append(time.perf_counter() - t)
    return 2 * nbytes / min(times) / 1e9


def _sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def experts_touched(model, wl) -> dict[int, int]:
    """Distinct experts each MoE layer routes the batch to, from one real step."""
    seen: list[int] = []
    ref = registry.get("moe_route").reference

    def counting(*args):
        w, ids = ref(*args)
        seen.append(int(ids.unique().numel()))
        return w, ids
    with registry.override({"moe_route": counting}):
        model.step(wl)
    moe_layers = [b.index for b in model.blocks if b.kind == "moe"]
    return dict(zip(moe_layers, seen))


def weight_bytes(model, wl, touched: dict[int, int]) -> int:
    """Weight bytes one step reads: every parameter, the embedding rows of the batch's tokens only (untied), and
    of each MoE layer's expert stacks (``.w13``/``.w2``; Nemotron-H's relu2 ``.w1``/``.w2``) the ``touched[layer]``
    experts only."""
    weights = 0
    for name, t in model.params.items():
        n = t.numel() * t.element_size()
        if name == "embed":
            n = n if model.spec.tie_word_embeddings else wl.batch * t.shape[1] * t.element_size()
        elif name.endswith((".w13", ".w1", ".w2", ".w13_b", ".w2_b")):  # w1: Nemotron-H; _b: gpt-oss's biases
            n = n // t.shape[0] * touched[int(name.split(".")[1])]
        elif name.endswith(("_blocks", "_scales")):     # gpt-oss's MXFP4 packs: the reference reads their bf16 decode
            n = 0
        weights += n
    return weights


def bytes_read(model, wl) -> dict[str, float]:
    weights = weight_bytes(model, wl, experts_touched(model, wl) if model.spec.is_moe else {})
    kv = sum(t.element_size() * (t[0, 0].numel()) for t in (*wl.cache.k.values(), *wl.cache.v.values()))
    kv_bytes = kv * wl.batch * (wl.context + 1)
    return {"weights": float(weights), "kv": float(kv_bytes), "total": float(weights + kv_bytes)}


@functools.lru_cache(maxsize=None)
def fair_timer(device: str) -> FairTimer:
    """One timer per device (its flush buffer allocated once)."""
    return FairTimer(torch.device(device))


def time_eager(model, wl, device: str, samples: int) -> FairTiming:
    """The eager step (reference ops) timed both ways, unheld (its dispatch is its cost): ``samples`` calls back to
    back (median of 3 windows) and ``samples`` single calls after a cache flush."""
    return fair_timer(device).time(lambda: model.step(wl), steps=samples, samples=samples, held=False, warmup=3)


def time_graph(model, wl, samples: int) -> FairTiming | None:
    """The step captured in a CUDA graph, its replays timed both ways (held: host dispatch beside, not inside);
    None where the capture fails."""
    try:
        graph, out = capture_graph(lambda: model.step(wl), warmup=3)
    except RuntimeError as e:
        print(f"  (CUDA graph capture failed: {str(e).splitlines()[0]}; eager only)", flush=True)
        return None
    return fair_timer("cuda").time(lambda: (graph.replay(), out)[1], steps=samples, samples=samples, held=True)


def _peak(device: str, override: float | None) -> tuple[str, float | None]:
    if not device.startswith("cuda"):
        return platform.processor() or "cpu", override
    name = torch.cuda.get_device_name()
    key = next((k for k in sorted(DATASHEET_GBS, key=len, reverse=True) if k in name.lower().replace(" ", "")), None)
    return name, override or (DATASHEET_GBS[key] if key else None)


def device_parser(doc: str) -> argparse.ArgumentParser:
    """A benchmark's command line: its docstring's first line as the description, and ``--device`` (cuda when
    there is a GPU)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"])
    return ap


def write_json(doc: dict, out: Path) -> None:
    """``doc`` as indented JSON at ``out``, atomically (the plan writer's temporary file and rename)."""
    atomic_write_json(out, doc, indent=1)
    print(f"wrote {out}")


def main(argv=None) -> int:
    ap = device_parser(__doc__)
    ap.add_argument("--cases", nargs="*", help="alias:layers@batch (layers: all, N or i,j); default by device")
    ap.add_argument("--context", type=int, default=None, help="cached tokens per sequence (cuda 1024, cpu 128)")
    ap.add_argument("--samples", type=int, default=None, help="timed steps per case (cuda 50, cpu 5)")
    ap.add_argument("--peak-gbs", type=float, default=None, help="datasheet HBM bandwidth, GB/s")
    ap.add_argument("--threads", type=int, default=None, help="CPU threads for torch (default: torch's)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    cuda = a.device == "cuda"
    if cuda and not torch.cuda.is_available():
        print("forward.py: error: --device cuda but no CUDA device", file=sys.stderr)
        return 2
    context = a.context or (1024 if cuda else 128)
    samples = a.samples or (50 if cuda else 5)
    device_name, peak = _peak(a.device, a.peak_gbs)
    copy_gbs = copy_bandwidth_gbs(a.device, (1 << 30) if cuda else (64 << 20))
    print(f"device {device_name}; copy bandwidth {copy_gbs:.0f} GB/s; datasheet {peak or '-'} GB/s; "
          f"context {context}", flush=True)
    rows = []
    models: dict[tuple, object] = {}
    for case in a.cases or DEFAULT_CASES[a.device]:
        alias, layers, batch = parse_case(case)
        key = (alias, tuple(layers) if layers else None)
        if key not in models:
            models.clear()
            if cuda:
                torch.cuda.empty_cache()
            models[key] = build_model(ModelSpec.from_name(alias), layers=layers, device=a.device)
        model = models[key]
        wl = make_workload(model, WorkloadPoint(phase="decode", batch=batch, context=context, chunk=1))
        moved = bytes_read(model, wl)
        eager = time_eager(model, wl, a.device, samples)
        graph = time_graph(model, wl, samples) if cuda else None
        best = (graph or eager).back_to_back_ms
        row = {"case": case, "model": alias, "layers": model.layers, "batch": batch, "context": context,
               "eager_ms": eager.back_to_back_ms, "graph_ms": graph.back_to_back_ms if graph else None,
               "timings": {"eager": eager.to_dict(), "graph": graph.to_dict() if graph else None},
               "ms_per_step": best, "tokens_per_s": batch / best * 1e3, "bytes_read": moved,
               "achieved_gbs": moved["total"] / best / 1e6,
               "pct_datasheet": 100 * moved["total"] / best / 1e6 / peak if peak else None,
               "pct_copy": 100 * moved["total"] / best / 1e6 / copy_gbs}
        rows.append(row)
        print(f"{case:<22} {len(model.layers):>3}L  eager {row['eager_ms']:9.3f} ms  graph "
              f"{row['graph_ms'] or float('nan'):9.3f} ms  {row['tokens_per_s']:9.0f} tok/s  "
              f"{moved['total'] / 1e6:9.2f} MB  {row['achieved_gbs']:7.1f} GB/s  "
              f"{row['pct_datasheet'] or float('nan'):5.1f}% of peak  {row['pct_copy']:5.1f}% of copy", flush=True)
    versions = software_versions(driver=a.device == "cuda")
    doc = {"benchmark": "forward", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "device": a.device, "device_name": device_name, "torch": torch.__version__,
           "triton": versions["triton"], "driver": versions["driver"],
           "copy_bandwidth_gbs": copy_gbs, "datasheet_bandwidth_gbs": peak, "samples": samples, "rows": rows}
    out = Path(a.out or ROOT / "benchmarks" / "results" / f"{a.device}-forward.json")
    write_json(doc, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
