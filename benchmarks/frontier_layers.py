"""Real-size layers of the frontier architectures (GLM-5.2, DeepSeek-V3.2, MiniMax-M3; Qwen3.5 and Kimi-K3 with
--models qwen3.5,kimi; Mixtral, Gemma-3, Gemma-2 and Llama-4 with --models mixtral,gemma,gemma-2-9b,llama4;
MiniMax-M2.7 with --models minimax-m2.7; Gemma-4-26B-A4B with --models gemma-4-26b-a4b: [0, 5] = a sliding and a full
layer, each the dense MLP beside 128 GeGLU experts, ~4.8 GB;
gpt-oss-120b with --models gpt-oss-120b: [0, 1] = a sliding-window (128) and a full layer, both MoE, ~19 GB;
Nemotron-3-Super with --models nemotron-3-super): ms per layer, bytes,
share of HBM bandwidth, and where the time goes, with the reference ops (the baseline tkcc optimizes).

    python benchmarks/frontier_layers.py --device cuda            # real sizes on one GPU (H200: ~3 min)
    python benchmarks/frontier_layers.py --device cpu --tiny      # the same cases at toy size (CPU, ~1 min)
    python benchmarks/frontier_layers.py --device cuda --models kimi --out benchmarks/results/h200-kimi-layers.json
    python benchmarks/frontier_layers.py --device cuda --models nemotron-3-super \
        --out benchmarks/results/h200-nemotron-layers.json     # [0, 1, 7]: Mamba-2, latent MoE, attention (~9 GB)

Per model, two slices are built with seeded random bf16 weights: the slice ``[]`` (embedding, final norm,
lm_head) and the model's covering layers (every MLP kind and attention kind: GLM-5.2 [0, 2, 3] = dense
layers with the indexer and an MoE layer that reuses layer 2's selection; DeepSeek-V3.2 [0, 3]; MiniMax-M3
[0, 3] = dense attention + dense MLP, block-sparse attention + MoE; Kimi-K3 [0, 3] = Kimi delta attention + dense
SiTU MLP, gated NoPE MLA + latent MoE: its covering slice [0, 1, 3] holds two MoE layers of 896 bf16 experts, 59 GB
each, which with the rest does not fit one H200; Nemotron-3-Super [0, 1, 7] = a Mamba-2 layer, a latent relu2 MoE
layer of 512 experts (5.6 GB), a NoPE GQA layer). Each decode case (batch, context) is timed by
``forward.py``'s FairTimer as CUDA-graph replays (eager where capture fails; CPU: eager), ``step_ms`` back to
back and ``timings.one_replay_ms`` after an L2 flush; ms per layer =
(slice ms - empty-slice ms) / layers. Bytes a step must read: every weight but the embedding table (B rows),
routed experts only where the batch routes (counted from the step's routing), and the KV cache as the
attention reads it: a sparse layer's selection (DSA: index_topk tokens of the latent; M3: topk_blocks x 128
tokens of K/V), the indexer's keys over the whole context; a recurrent layer (Qwen3.5's Gated DeltaNet, Kimi's KDA,
Nemotron-H's Mamba-2) its fp32 state and conv state, read and written once per step (no per-token cache;
``bytes["state"]``). Models with KDA or Mamba-2 layers also time one prefill chunk (eager; the chunked delta rule or
SSD scan).
% of bandwidth = bytes / time / copy bandwidth
(measured) and / datasheet. One profiled case per model gives the per-op split (persistent_engine.measure.profiler).
Prints a table; writes ``benchmarks/results/<device>-frontier-layers.json`` atomically.
"""

from __future__ import annotations

import datetime
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402

from forward import (_peak, copy_bandwidth_gbs, device_parser, experts_touched, time_eager, time_graph,  # noqa: E402
                     weight_bytes, write_json)
from persistent_engine.models.decoder import build_model  # noqa: E402
from persistent_engine.models.spec import ModelSpec, tiny_name  # noqa: E402
from persistent_engine.measure.profiler import profile_point  # noqa: E402
from persistent_engine.measure.timing import FairTiming  # noqa: E402
from persistent_engine.versions import software_versions  # noqa: E402
from persistent_engine.inputs.workloads import make_workload  # noqa: E402
from persistent_engine.io_struct import WorkloadPoint  # noqa: E402

MODELS = ("glm", "deepseek-v3.2", "minimax")
CUDA_POINTS = ((1, 4096), (16, 4096), (64, 4096))        # (batch, context): past the 2048-token selections
CPU_POINTS = ((1, 64), (4, 64))
SLICES = {"kimi": [0, 3]}                                  # real-size slices other than covering_layers (doc)
PREFILL_CHUNK = {"cuda": 2048, "cpu": 16}                  # the prefill case of models with KDA or Mamba layers


def attended_tokens(spec, layer: int, pool: str, context: int) -> int:
    """Cached tokens per sequence the step reads from ``pool`` ('k', 'v' or 'index_k') of ``layer``."""
    n = context + 1
    if spec.sparse_attention and pool == "k":                       # the MLA latent: only the selection
        return min(n, spec.index_topk)
    if spec.block_sparse(layer) and pool in ("k", "v"):             # M3: the selected blocks
        return min(n, spec.msa_topk_blocks * spec.msa_block_size)
    if spec.layer_window(layer) and pool in ("k", "v"):             # a sliding-window layer: its window
        return min(n, spec.layer_window(layer))
    return n                                                         # indexer keys, dense attention


def step_bytes(model, wl) -> dict[str, float]:
    spec = model.spec
    touched = experts_touched(model, wl) if spec.is_moe and any(b.kind == "moe" for b in model.blocks) else {}
    weights = weight_bytes(model, wl, touched)
    kv = 0
    for pool, pools in (("k", wl.cache.k), ("v", wl.cache.v), ("index_k", wl.cache.index_k)):
        for layer, t in pools.items():
            kv += wl.batch * attended_tokens(spec, layer, pool, wl.context) * t[0, 0].numel() * t.element_size()
    state = sum(2 * t.numel() * t.element_size() for pools in (wl.cache.state, wl.cache.conv) for t in pools.values())
    return {"weights": float(weights), "kv": float(kv), "state": float(state), "total": float(weights + kv + state)}


def layer_label(spec, i: int) -> str:
    """'moe/kda', 'dense/linear', 'moe/full' ...: layer i's MLP kind and its attention (or recurrent mixer);
    Nemotron-H: its one block ('mamba', 'attention', 'mlp', 'moe')."""
    if spec.hybrid_pattern:
        return spec.layer_block(i)
    if spec.is_linear(i):
        attn = "linear"
    elif spec.is_kda_layer(i):
        attn = "kda"
    else:
        attn = spec.indexer_kind(i) or ("msa" if spec.block_sparse(i) else "dense")
        attn = f"window{spec.layer_window(i)}" if attn == "dense" and spec.layer_window(i) else attn
    return f"{spec.layer_kind(i)}/{attn}"


def prefill_row(model, alias: str, device: str, samples: int) -> dict:
    """One prefill chunk of a model with KDA or Mamba-2 layers (batch 1, no context), eager, with its top ops."""
    chunk = PREFILL_CHUNK[device]
    wl = make_workload(model, WorkloadPoint(phase="prefill", batch=1, context=0, chunk=chunk), fill="zeros")
    ms = time_eager(model, wl, device, max(1, samples // 10)).back_to_back_ms
    row = {"model": alias, "release": model.spec.name, "family": model.spec.family, "layers": model.layers,
           "phase": "prefill", "batch": 1, "context": 0, "chunk": chunk, "step_ms": ms, "timing": "eager",
           "tokens_per_s": chunk / ms * 1e3, "ops_ms": op_times(model, wl, device)}
    print(f"{alias:<14} {str(model.layers):<11} prefill {chunk:<5} {ms:9.3f} ms (eager)  "
          f"{row['tokens_per_s']:9.0f} tokens/s", flush=True)
    print_top_ops(row["ops_ms"])
    return row


def timed(model, wl, device: str, samples: int) -> tuple[FairTiming, str]:
    """The step timed both ways (``forward.py``'s FairTimer): a CUDA-graph replay where it captures, else eager."""
    if device == "cuda":
        graph = time_graph(model, wl, samples)
        if graph:
            return graph, "graph"
    return time_eager(model, wl, device, samples), "eager"


def op_times(model, wl, device: str) -> dict[str, float]:
    """Every profiled op's time in ms, slowest first (the JSON keeps them all; the table prints the slowest)."""
    prof = profile_point(model, wl, torch.device(device), reps=2)
    ops = sorted(((k, v.get("ms", 0.0)) for k, v in prof.items() if isinstance(v, dict)), key=lambda kv: -kv[1])
    return {k: round(ms, 4) for k, ms in ops}


def print_top_ops(ops_ms: dict[str, float], n: int = 6) -> None:
    print("    top ops (ms): " + ", ".join(f"{k} {v:.3f}" for k, v in list(ops_ms.items())[:n]), flush=True)


def run_model(alias: str, device: str, points, samples: int, copy_gbs: float, peak: float | None) -> list[dict]:
    spec = ModelSpec.from_name(alias)
    layers = SLICES.get(alias, spec.covering_layers())
    rows = []
    empty = build_model(spec, layers=[], device=device)
    base = {pt: timed(empty, make_workload(empty, WorkloadPoint(phase="decode", batch=pt[0], context=pt[1])), device,
                      samples)[0].back_to_back_ms for pt in points}
    del empty
    model = build_model(spec, layers=layers, device=device)
    for batch, context in points:
        wl = make_workload(model, WorkloadPoint(phase="decode", batch=batch, context=context))
        t, how = timed(model, wl, device, samples)
        ms = t.back_to_back_ms
        moved = step_bytes(model, wl)
        row = {"model": alias, "release": spec.name, "family": spec.family, "layers": layers,
               "kinds": [layer_label(spec, i) for i in layers], "phase": "decode", "batch": batch,
               "context": context, "step_ms": ms, "timing": how, "timings": t.to_dict(),
               "empty_slice_ms": base[(batch, context)],
               "ms_per_layer": (ms - base[(batch, context)]) / len(layers), "bytes": moved,
               "gbs": moved["total"] / ms / 1e6, "pct_copy": 100 * moved["total"] / ms / 1e6 / copy_gbs,
               "pct_datasheet": 100 * moved["total"] / ms / 1e6 / peak if peak else None}
        if (batch, context) == points[len(points) // 2]:
            row["ops_ms"] = op_times(model, wl, device)
        rows.append(row)
        print(f"{alias:<14} {str(layers):<11} b{batch:<3} ctx{context:<5} {ms:9.3f} ms ({how})  "
              f"{row['ms_per_layer']:8.3f} ms/layer  {moved['total'] / 1e9:7.3f} GB  {row['gbs']:7.0f} GB/s  "
              f"{row['pct_copy']:5.1f}% of copy", flush=True)
        if "ops_ms" in row:
            print_top_ops(row["ops_ms"])
    if any(spec.kda_layers) or "M" in spec.hybrid_pattern:
        rows.append(prefill_row(model, alias, device, samples))
    del model
    if device == "cuda":
        torch.cuda.empty_cache()
    return rows


def main(argv=None) -> int:
    ap = device_parser(__doc__)
    ap.add_argument("--models", default=",".join(MODELS), help="comma list of aliases (default: %(default)s)")
    ap.add_argument("--tiny", action="store_true", help="every model at toy size (the CPU check of this script)")
    ap.add_argument("--samples", type=int, default=None, help="timed steps per case (cuda 30, cpu 3)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    cuda = a.device == "cuda"
    if cuda and not torch.cuda.is_available():
        print("frontier_layers.py: error: --device cuda but no CUDA device", file=sys.stderr)
        return 2
    samples = a.samples or (30 if cuda else 3)
    points = CUDA_POINTS if cuda and not a.tiny else CPU_POINTS
    device_name, peak = _peak(a.device, None)
    copy_gbs = copy_bandwidth_gbs(a.device, (1 << 30) if cuda else (64 << 20))
    print(f"device {device_name}; copy bandwidth {copy_gbs:.0f} GB/s; datasheet {peak or '-'} GB/s", flush=True)
    rows = []
    for alias in a.models.split(","):
        rows += run_model(tiny_name(alias, a.tiny), a.device, points, samples, copy_gbs, peak)
    versions = software_versions(driver=cuda)
    doc = {"benchmark": "frontier_layers", "date": datetime.datetime.now(datetime.timezone.utc).isoformat(
        timespec="seconds"), "device": a.device, "device_name": device_name, "torch": torch.__version__,
        "triton": versions["triton"], "driver": versions["driver"], "copy_bandwidth_gbs": copy_gbs,
        "datasheet_bandwidth_gbs": peak, "samples": samples, "tiny": a.tiny, "rows": rows}
    out = Path(a.out or ROOT / "benchmarks" / "results" / f"{'h200' if cuda else a.device}-frontier-layers.json")
    write_json(doc, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
