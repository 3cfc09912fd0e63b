"""Kimi-K3's decode-step KDA ops at real shapes (96 heads, Dk = Dv = 128, conv width 4): the reference
``kda_decode`` and ``short_conv_decode`` against the Triton template ``kda_decode.triton`` (agents/templates), and
vLLM's kernels as NVIDIA measured them on an H200 (benchmarks/peers/aiconfigurator_h200_kda_decode.json: vLLM's
``fused_recurrent_kda_packed_decode`` / ``fused_kda_decode`` / ``causal_conv1d_update``).

    python benchmarks/kda_ops.py --device cuda                        # H200: ~1 min
    TRITON_INTERPRET=1 python benchmarks/kda_ops.py --device cpu --tiny   # the logic at toy shapes (CPU, seconds)

Per batch: ms (CUDA events, median of --samples; CPU: perf_counter medians), state bytes moved per step (the
fp32 state read and written once: 8 B H Dk Dv, the floor), GB/s, the template's max error against the reference
(output and state) and the peer's ms. Writes ``benchmarks/results/<device>-kda-ops.json`` atomically.
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402

from forward import device_parser, write_json  # noqa: E402
from agents.templates import Choice, get_template, load_candidate, render_candidate  # noqa: E402
from persistent_engine.ops import kda  # noqa: E402

PEERS = ROOT / "benchmarks" / "peers" / "aiconfigurator_h200_kda_decode.json"
K3 = {"H": 96, "K": 128, "V": 128, "W": 4, "lb": -5.0}
TINY = {"H": 2, "K": 16, "V": 16, "W": 4, "lb": -5.0}
CUDA_BATCHES, CPU_BATCHES = (1, 8, 32, 64, 128), (1, 3)


def template_impl(name: str = "kda_decode.triton"):
    t = get_template(name)
    return load_candidate(render_candidate([Choice(t, t.default())]))["OVERRIDES"][t.op]


def timed(fn, args, device: str, samples: int) -> float:
    for _ in range(3):
        fn(*args)
    out = []
    for _ in range(samples):
        if device == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn(*args)
            b.record()
            b.synchronize()
            out.append(a.elapsed_time(b))
        else:
            t0 = time.perf_counter()
            fn(*args)
            out.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(out)


def peer_ms(batch: int) -> dict[str, float]:
    if not PEERS.exists():
        return {}
    table = json.loads(PEERS.read_text())["latency_ms_by_batch"]
    return {k: v[str(batch)] for k, v in table.items() if str(batch) in v}


def run_batch(batch: int, shape: dict, device: str, dtype, samples: int, triton_impl) -> dict:
    s = {"B": batch, **shape}
    args = kda._kda_inputs("decode")(s, dtype, device, seed=batch)
    conv = kda._conv_inputs("decode")({"B": batch, "D": 3 * shape["H"] * shape["K"], "W": shape["W"]}, dtype, device,
                                      seed=batch)
    state_bytes = 8.0 * batch * shape["H"] * shape["K"] * shape["V"]
    row = {"batch": batch, "state_bytes": state_bytes,
           "reference_ms": timed(kda.kda_decode, args, device, samples),
           "short_conv_reference_ms": timed(kda.short_conv_decode, conv, device, samples),
           "peer_ms": peer_ms(batch) if shape == K3 else {}}
    if triton_impl is not None:
        o_ref, s_ref = kda.kda_decode(*args)
        o, st = triton_impl(*args)
        row["triton_max_err"] = {"o": float((o.float() - o_ref.float()).abs().max()),
                                 "state": float((st - s_ref).abs().max())}
        row["triton_ms"] = timed(triton_impl, args, device, samples)
        row["triton_gbs"] = state_bytes / row["triton_ms"] / 1e6
    row["reference_gbs"] = state_bytes / row["reference_ms"] / 1e6
    peer = row["peer_ms"].get("fused_recurrent_kda_packed_decode")
    print(f"b{batch:<4} reference {row['reference_ms']:8.4f} ms ({row['reference_gbs']:6.0f} GB/s)  "
          + (f"triton {row['triton_ms']:8.4f} ms ({row['triton_gbs']:6.0f} GB/s, err o {row['triton_max_err']['o']:.2g} "
             f"state {row['triton_max_err']['state']:.2g})  " if "triton_ms" in row else "")
          + (f"vLLM {peer:.4f} ms" if peer else ""), flush=True)
    return row


def main(argv=None) -> int:
    ap = device_parser(__doc__)
    ap.add_argument("--tiny", action="store_true", help="toy shapes (the CPU check of this script)")
    ap.add_argument("--samples", type=int, default=None, help="timed calls per case (cuda 50, cpu 3)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    cuda = a.device == "cuda"
    if cuda and not torch.cuda.is_available():
        print("kda_ops.py: error: --device cuda but no CUDA device", file=sys.stderr)
        return 2
    shape = TINY if a.tiny else K3
    triton_ok = cuda or os.environ.get("TRITON_INTERPRET") == "1"
    impl = template_impl() if triton_ok else None
    rows = [run_batch(b, shape, a.device, torch.bfloat16, a.samples or (50 if cuda else 3), impl)
            for b in (CPU_BATCHES if not cuda or a.tiny else CUDA_BATCHES)]
    doc = {"benchmark": "kda_ops", "device": a.device, "device_name": torch.cuda.get_device_name() if cuda else "cpu",
           "torch": torch.__version__, "shape": shape, "tiny": a.tiny, "rows": rows}
    out = Path(a.out or ROOT / "benchmarks" / "results" / f"{'h200' if cuda else 'cpu'}-kda-ops.json")
    write_json(doc, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
