"""Does the expert-load distribution change which fused-MoE configuration wins? Search under balanced
routing, search under power-law routing, then time both winners under both distributions.

    python benchmarks/moe_routing.py --device cuda                   # qwen3-moe's MoE at 16 and 64 tokens
    TRITON_INTERPRET=1 python benchmarks/moe_routing.py --device cpu --tiny --budget 2   # logic only

Shapes: Qwen3-30B-A3B's MoE layer (hidden 2048, moe_intermediate 768, top-8 of 128 experts, bf16), or a
tiny one (``--tiny``: 64/32, top-4 of 16). Routing, as NVIDIA's AIConfigurator generates it for the vLLM
figures below: ``balanced`` deals expert (t + i * ceil(E/k)) mod E to slot i of token t (for T < ceil(E/k)
spread by E/T); ``power_law`` is ``persistent_engine.inputs.routing.power_law_counts`` (AIConfigurator's bounded
power law of exponent --alpha, at its quantiles) dealt to tokens by ``routing.assign_experts``.

Search: ``benchmarks/templates.py``'s search on template ``moe_experts.triton_fused`` (the default, the
shape-fitted default, then mutations of the best so far; --budget valid settings; each setting must
match the reference within the op's tolerance), once per distribution. Then the two winners are timed
again under both distributions (CUDA: CUDA-graph replays between L2 flushes, median of --samples; CPU:
perf_counter_ns medians). ``wrong_choice_cost``: how much slower the winner chosen on the other
distribution runs than the right winner, per distribution and token count.

Peer: vLLM 0.24.0's fused MoE (Triton) on an H200 at the same shapes, from NVIDIA AIConfigurator's
measurements (``VLLM_H200_MS``; source below). Writes ``benchmarks/results/<device>-moe-routing.json``.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import platform
import random
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from agents.templates import Choice, get_template, load_candidate, render_candidate  # noqa: E402
from benchmarks.templates import Timer, _upcast, _write_atomic, fit_seed, search  # noqa: E402
from persistent_engine.inputs import routing  # noqa: E402
from persistent_engine.ops import registry  # noqa: E402
from persistent_engine.versions import driver_version, package_version  # noqa: E402

TEMPLATE = "moe_experts.triton_fused"
QWEN3_MOE = {"H": 2048, "I": 768, "E": 128, "k": 8}
TINY = {"H": 64, "I": 32, "E": 16, "k": 4}
# the tiny shapes' first setting (the template's default GEMV block is over twice their hidden size)
TINY_START = {"MOE_GEMV_MAX_PAIRS": 16, "MOE_GEMV_ROWS": 8, "MOE_GEMV_BLOCK_K": 128, "MOE_GEMV_WARPS": 2,
              "MOE_BLOCK_M": 16, "MOE_BLOCK_N": 32, "MOE_BLOCK_K": 32, "MOE_GROUP_M": 8, "MOE_NUM_WARPS": 2,
              "MOE_NUM_STAGES": 2}
DISTRIBUTIONS = ("balanced", "power_law")
# vLLM 0.24.0, kernel vllm_unquantizedfusedmoe_triton_tritonexperts, bf16, TP 1, EP 1, NVIDIA H200, latency
# in ms; rows of aic-core/src/aiconfigurator_core/systems/data/h200_sxm/moe/vllm/0.24.0/moe_perf.parquet of
# the public repository ai-dynamo/aiconfigurator (snapshot 095f58a51c4ca8e61b66ec108d86f223f8d559ce),
# NVIDIA, Apache License 2.0. Shape 2048/768, top-8 of 128 (Qwen3-30B-A3B).
VLLM_H200_MS = {(1, "balanced"): 0.040272, (1, "power_law_1.2"): 0.039168,
                (16, "balanced"): 0.305211, (16, "power_law_1.2"): 0.163514,
                (64, "balanced"): 0.316043, (64, "power_law_1.2"): 0.287072}


def balanced_ids(tokens: int, experts: int, k: int) -> torch.Tensor:
    """[T, k] AIConfigurator's balanced assignment (distinct experts per token)."""
    stride = math.ceil(experts / k)
    t = torch.arange(tokens, dtype=torch.float64)[:, None]
    i = torch.arange(k, dtype=torch.float64)[None, :]
    base = t if tokens >= stride else t * stride / tokens
    return ((base + i * stride).floor().long() % experts)


def routed_inputs(shape: dict, tokens: int, dist: str, alpha: float, device: str, seed: int) -> tuple:
    """The op's inputs (x, w13, w2, topk_weights, topk_ids) with the routing of ``dist``; the same x and
    weights for both distributions (same seed)."""
    d = registry.get("moe_experts")
    x, w13, w2, tw, _ = d.make_inputs({"T": tokens, **shape}, torch.bfloat16, device, seed)
    e, k = shape["E"], shape["k"]
    if dist == "balanced":
        ids = balanced_ids(tokens, e, k)
    else:
        gen = torch.Generator().manual_seed(seed + 1)
        counts = routing.power_law_counts(tokens, e, k, alpha)
        perm = torch.randperm(e, generator=gen)
        ids = perm[routing.assign_experts(counts, tokens, k, gen)]
    return x, w13, w2, tw, ids.to(device)


def _fn(knobs: dict):
    return load_candidate(render_candidate([Choice(get_template(TEMPLATE), knobs)]))["OVERRIDES"]["moe_experts"]


def measure(tokens: int, shape: dict, alpha: float, device: str, budget: int, samples: int, seed: int,
            dims: dict, deadline: float = float("inf")) -> dict:
    """One token count: each distribution's search, then the 2x2 cross timing and the reference. Past
    ``deadline`` (time.monotonic) a search tries 2 settings only (the default and the shape-fitted one)."""
    template, op = get_template(TEMPLATE), registry.get("moe_experts")
    timer, cross_timer = Timer(device, samples), Timer(device, 2 * samples)
    inputs = {dist: routed_inputs(shape, tokens, dist, alpha, device, seed) for dist in DISTRIBUTIONS}
    best = {}
    for dist, args in inputs.items():
        ref_hi = (op.reference(*_upcast(args)),)
        n = budget if time.monotonic() < deadline else min(budget, 2)
        knobs, best_s, tried, rejected = search(template, op, args, ref_hi, timer, dims, n, random.Random(seed),
                                                start=TINY_START if shape == TINY else None,
                                                fit=fit_seed(template, {"T": tokens, **shape}))
        if knobs is None:
            raise RuntimeError(f"T={tokens} {dist}: no valid setting among {tried} tried")
        best[dist] = {"knobs": knobs, "search_us": best_s * 1e6, "tried": tried, "rejected": rejected}
    cross = {}                                           # "chosen on->timed under" -> us
    done: list[str] = []                                 # distributions whose winner is timed already
    for chosen, b in best.items():
        twin = next((c for c in done if best[c]["knobs"] == b["knobs"]), None)
        fn = _fn(b["knobs"])
        for timed, args in inputs.items():     # one winner for both: one measurement, no noise between them
            cross[f"{chosen}->{timed}"] = cross[f"{twin}->{timed}"] if twin else cross_timer(fn, args) * 1e6
        done.append(chosen)
    ref = {dist: cross_timer(op.reference, args) * 1e6 for dist, args in inputs.items()}
    cost = {}
    for timed in DISTRIBUTIONS:
        other = [c for c in DISTRIBUTIONS if c != timed][0]
        cost[timed] = cross[f"{other}->{timed}"] / cross[f"{timed}->{timed}"] - 1.0
    return {"tokens": tokens, "shape": shape, "alpha": alpha, "best": best, "cross_us": cross, "reference_us": ref,
            "wrong_choice_cost": cost, "same_winner": best["balanced"]["knobs"] == best["power_law"]["knobs"],
            "vllm_h200_ms": {"balanced": VLLM_H200_MS.get((tokens, "balanced")) if shape == QWEN3_MOE else None,
                             "power_law": VLLM_H200_MS.get((tokens, f"power_law_{alpha:g}")) if shape == QWEN3_MOE
                             else None}}


def print_table(r: dict) -> None:
    c = r["cross_us"]
    print(f"\nT={r['tokens']} (H {r['shape']['H']}, I {r['shape']['I']}, top-{r['shape']['k']} of {r['shape']['E']}), "
          f"us; rows: configuration chosen under, columns: timed under" + (" (same winner)" if r["same_winner"] else ""))
    print(f"{'':24s} {'balanced':>12s} {'power_law ' + format(r['alpha'], 'g'):>14s}")
    for chosen in DISTRIBUTIONS:
        print(f"{'best on ' + chosen:24s} {c[f'{chosen}->balanced']:12.1f} {c[f'{chosen}->power_law']:14.1f}")
    print(f"{'reference (torch)':24s} {r['reference_us']['balanced']:12.1f} {r['reference_us']['power_law']:14.1f}")
    v = r["vllm_h200_ms"]
    if v["balanced"] is not None:
        print(f"{'vLLM 0.24 on H200 (peer)':24s} {1e3 * v['balanced']:12.1f} "
              + (f"{1e3 * v['power_law']:14.1f}" if v["power_law"] is not None else f"{'-':>14s}"))
    for dist in DISTRIBUTIONS:
        b = r["best"][dist]
        print(f"  best on {dist}: {b['knobs']} ({b['tried']} tried, {b['rejected']} rejected)")


def paragraph(results: list[dict], device_name: str) -> str:
    """The docs/performance.md paragraph's figures, as a sentence per token count."""
    parts = []
    for r in results:
        c = r["wrong_choice_cost"]
        parts.append(f"at {r['tokens']} tokens the configuration tuned on balanced routing takes "
                     f"{100 * c['power_law']:+.1f}% under power-law {r['alpha']:g} routing against the one tuned on it "
                     f"({r['cross_us']['balanced->power_law']:.1f} vs {r['cross_us']['power_law->power_law']:.1f} us), "
                     f"and the power-law winner {100 * c['balanced']:+.1f}% under balanced routing against the balanced "
                     f"winner ({r['cross_us']['power_law->balanced']:.1f} vs {r['cross_us']['balanced->balanced']:.1f} us)"
                     + (" (the same configuration won both)" if r["same_winner"] else ""))
    return f"On {device_name}, " + "; ".join(parts) + "."


def run(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cuda" if torch.cuda.is_available() else "cpu")
    p.add_argument("--tokens", default="16,64", help="token counts (default 16,64)")
    p.add_argument("--alpha", type=float, default=1.2, help="power-law exponent (default 1.2)")
    p.add_argument("--tiny", action="store_true", help="tiny MoE shapes (CPU logic check)")
    p.add_argument("--budget", type=int, default=None, help="valid settings per search (10 cuda, 2 cpu)")
    p.add_argument("--max-minutes", type=float, default=3.5,
                   help="searches started after this long try only the default and fitted settings")
    p.add_argument("--samples", type=int, default=None, help="timed samples per measurement (50 cuda, 3 cpu)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", default=None)
    a = p.parse_args(argv)
    if a.device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda but no CUDA device is visible", file=sys.stderr)
        return 2
    try:
        tokens = [int(t) for t in a.tokens.split(",") if t.strip()]
        routing.RoutingSpec("power_law", alpha=a.alpha)
    except (ValueError, routing.RoutingError) as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    if not tokens or min(tokens) < 1:
        print("error: --tokens needs positive integers", file=sys.stderr)
        return 2
    cuda = a.device == "cuda"
    shape = TINY if a.tiny else QWEN3_MOE
    budget, samples = a.budget or (10 if cuda else 2), a.samples or (50 if cuda else 3)
    deadline = time.monotonic() + 60 * a.max_minutes
    dims = {"hidden": shape["H"], "moe_intermediate": shape["I"]}
    torch.manual_seed(a.seed)
    results = []
    for t in tokens:
        r = measure(t, shape, a.alpha, a.device, budget, samples, a.seed, dims, deadline)
        print_table(r)
        results.append(r)
    name = torch.cuda.get_device_name() if cuda else (platform.processor() or platform.machine())
    text = paragraph(results, name)
    print("\n" + text)
    doc = {"benchmark": "moe_routing", "device": a.device, "device_name": name,
           "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
           "torch": torch.__version__, "triton": package_version("triton"), "python": platform.python_version(),
           "driver": driver_version() if cuda else None, "template": TEMPLATE, "budget": budget, "samples": samples,
           "timing": "cuda events around CUDA-graph replays, L2 flushed" if cuda else "perf_counter_ns medians",
           "peer": "vLLM 0.24.0 fused MoE (Triton) on NVIDIA H200, NVIDIA AIConfigurator data (Apache-2.0)",
           "results": results, "paragraph": text}
    out = Path(a.out or ROOT / "benchmarks" / "results" / f"{'h200' if cuda else 'cpu'}-moe-routing.json")
    _write_atomic(out, json.dumps(doc, indent=1, default=str))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(run())
