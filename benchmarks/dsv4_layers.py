"""Real-size DeepSeek-V4-Flash layers: ms per layer of each kind (window-only / CSA / HCA attention, hash / top-k MoE)
for a prefill chunk, and where the time goes, with the reference ops (persistent_engine/models/deepseek_v4.py).

    python benchmarks/dsv4_layers.py --device cuda            # real sizes on one GPU (H200: ~2 min)
    python benchmarks/dsv4_layers.py --device cpu --tiny      # toy size (CPU check of this script, seconds)

Each case builds the slice [layer] with seeded random bf16 weights (the FP4 experts dequantized: bf16 here)
and times the forward of one sequence of ``tokens`` tokens (CUDA events, median of the samples; CPU:
perf_counter medians), minus the empty slice (embedding, hc_head, norm, lm_head). The per-op split comes from
one extra forward with every registry op timed (device synchronised around each call). On cuda the V4 ops'
Triton templates (hc_pre, hc_post, swiglu_clamp_and_mul, the clamped fused MoE, compressed_attention at
a 32 x 4096 decode step) are checked against the op contract at V4-Flash shapes and timed
against the reference (CUDA events, medians).

Decode (``--decode-batch``, ``--decode-context``): each layer kind as a one-layer slice of the paged-cache decoder
(models/deepseek_v4_decoder.py, a synthetic random cache of the context), ms per decode step minus the empty
slice, and the attention block and the hyper-connection ops alone; beside them NVIDIA's H200 measurements of
vLLM 0.24's kernels at the same batch and context (``benchmarks/data/aiconfigurator_dsv4_h200.json``:
``dsv4_csa`` / ``dsv4_hca`` generation modules, FP8 GEMMs and KV; tilelang ``mhc_pre`` / ``mhc_post``), the
peers to beat. Prints tables; writes ``benchmarks/results/<device>-dsv4-layers.json`` atomically.
"""

from __future__ import annotations

import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks"))

import torch  # noqa: E402

from forward import device_parser, write_json  # noqa: E402
from persistent_engine.models.decoder import build_model  # noqa: E402
from persistent_engine.models.deepseek_v4 import V4Config, forward, init_weights  # noqa: E402
from persistent_engine.models.deepseek_v4_decoder import attention as cached_attention  # noqa: E402
from persistent_engine.models.deepseek_v4_decoder import _Step  # noqa: E402
from persistent_engine.models.spec import ModelSpec  # noqa: E402
from persistent_engine.ops import registry  # noqa: E402
from persistent_engine.inputs.workloads import make_workload  # noqa: E402
from persistent_engine.io_struct import WorkloadPoint  # noqa: E402

CONFIG = ROOT / "persistent_engine" / "models" / "configs" / "deepseek-v4-flash.json"
PEERS = ROOT / "benchmarks" / "data" / "aiconfigurator_dsv4_h200.json"
# V4-Flash: compress_ratios 0, 0, 4, 128, 4, ...; num_hash_layers 3
LAYERS = {"window+hash": 0, "csa+hash": 2, "hca+moe": 3, "csa+moe": 4}


def tiny_config(c: dict) -> dict:
    """V4-Flash's layer pattern, hash layers, hyper-connections and ratios at toy widths."""
    return {**c, "hidden_size": 64, "num_attention_heads": 4, "head_dim": 32, "qk_rope_head_dim": 8, "q_lora_rank": 32,
            "o_groups": 2, "o_lora_rank": 16, "n_routed_experts": 8, "num_experts_per_tok": 2,
            "moe_intermediate_size": 32, "index_n_heads": 2, "index_head_dim": 16, "index_topk": 4,
            "sliding_window": 8, "vocab_size": 256}


def _sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def time_forward(cfg, w, ids, layers, device: str, samples: int) -> float:
    """Median ms of one forward of the slice."""
    forward(cfg, w, ids, layers)                                          # warm-up
    out = []
    for _ in range(samples):
        _sync(device)
        t0 = time.perf_counter()
        forward(cfg, w, ids, layers)
        _sync(device)
        out.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(out)


def op_split(cfg, w, ids, layers, device: str) -> dict[str, float]:
    """ms per registry op in one forward (synchronised around each call), largest first."""
    spent: dict[str, float] = {}

    def timed(name, fn):
        def call(*args):
            _sync(device)
            t0 = time.perf_counter()
            out = fn(*args)
            _sync(device)
            spent[name] = spent.get(name, 0.0) + (time.perf_counter() - t0) * 1e3
            return out
        return call
    with registry.override({n: timed(n, registry.current(n)) for n in registry.names()}):
        forward(cfg, w, ids, layers)
    return dict(sorted(spent.items(), key=lambda kv: -kv[1]))


KERNELS = {"hc_pre": ("triton_hc_pre.py", "hc_pre_triton"),
           "hc_post": ("triton_hc_post.py", "hc_post_triton"),
           "swiglu_clamp_and_mul": ("triton_glu_and_mul.py", "swiglu_clamp_and_mul_triton"),
           "moe_experts_clamp": ("triton_moe_experts.py", "moe_experts_clamp_triton"),
           "compressed_attention": ("triton_compressed_attention.py", "compressed_attention_triton")}


def _kernel(op: str):
    """The Triton template's function for ``op``, loaded from its file (agents/templates/kernels), default knobs."""
    import importlib.util
    fname, fn = KERNELS[op]
    spec = importlib.util.spec_from_file_location(fname[:-3], ROOT / "agents" / "templates" / "kernels" / fname)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return getattr(mod, fn)


def _median_ms(fn, args, samples: int) -> float:
    fn(*args)
    out = []
    for _ in range(samples):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn(*args)
        end.record()
        torch.cuda.synchronize()
        out.append(start.elapsed_time(end))
    return statistics.median(out)


def templates(c: dict, tokens: int, samples: int) -> list[dict]:
    """The V4 ops' Triton templates at V4-Flash shapes: op-level contract check (bf16) and ms against the reference."""
    from persistent_engine.ops.contract import check_op
    shapes = {"hc_post": {"T": tokens, "N": c["hc_mult"], "D": c["hidden_size"], "iters": c["hc_sinkhorn_iters"]},
              "swiglu_clamp_and_mul": {"T": tokens * c["num_experts_per_tok"], "I": c["moe_intermediate_size"],
                                       "limit": c["swiglu_limit"]}}
    experts = {"E": c["n_routed_experts"], "k": c["num_experts_per_tok"], "H": c["hidden_size"],
               "I": c["moe_intermediate_size"], "limit": c["swiglu_limit"]}
    cases = [(op, shape) for op, shape in shapes.items()]
    cases += [("hc_pre", {**shapes["hc_post"], "T": t}) for t in (32, tokens)]            # a decode batch, the prefill
    cases += [("moe_experts_clamp", {"T": t, **experts}) for t in (32, tokens)]     # a decode batch, the prefill
    step = WorkloadPoint(phase="decode", batch=32, context=4096)                    # window-only, CSA and HCA layers
    cases += [("compressed_attention", s)
              for s in registry.get("compressed_attention").shapes(ModelSpec.from_name("deepseek-v4-flash"), step)]
    rows = []
    for op, shape in cases:
        impl, d = _kernel(op), registry.get(op)
        reasons = check_op(op, impl, device="cuda", dtypes=(torch.bfloat16,), shapes=[shape])
        args = d.make_inputs(shape, torch.bfloat16, "cuda", 0)
        ref, tri = _median_ms(d.reference, args, samples), _median_ms(impl, args, samples)
        rows.append({"op": op, "shape": shape, "correct": not reasons, "reasons": reasons[:2],
                     "reference_ms": round(ref, 4), "triton_ms": round(tri, 4), "speedup": round(ref / tri, 2)})
    return rows


def _timed_ms(fn, device: str, samples: int) -> float:
    """Median ms of fn() (warm-up first; the device synchronised around each sample)."""
    fn()
    out = []
    for _ in range(samples):
        _sync(device)
        t0 = time.perf_counter()
        fn()
        _sync(device)
        out.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(out)


def layer_kinds(spec: ModelSpec) -> dict[str, int]:
    """The first layer of each (attention kind, routing) pair: 'csa+hash' -> 2 on V4-Flash."""
    out: dict[str, int] = {}
    for i, r in enumerate(spec.compress_ratios):
        attn = "window" if not r else ("csa" if r == spec.csa_ratio else "hca")
        out.setdefault(f"{attn}+{'hash' if i < spec.num_hash_layers else 'moe'}", i)
    return out


def peer(peers: dict, table: str, batch: int, context: int) -> dict | None:
    """The peer row of ``table`` at ``batch`` and the step nearest ``context`` (None when the batch is absent)."""
    rows = [r for r in peers.get(table, []) if r.get("batch", r.get("tokens")) == batch]
    if not rows:
        return None
    key = "step" if "step" in rows[0] else "tokens"
    return min(rows, key=lambda r: abs(r[key] - context))


def decode(spec: ModelSpec, device: str, batch: int, context: int, samples: int, peers: dict) -> list[dict]:
    """Per layer kind: ms per decode step of the one-layer slice (minus the empty slice), its attention block and
    hc_pre + hc_post alone, and the H200 peers at the same shape."""
    point = WorkloadPoint(phase="decode", batch=batch, context=context)
    empty = build_model(spec, layers=[], device=device)
    wl = make_workload(empty, point)
    base = _timed_ms(lambda: empty.step(wl), device, samples)
    rows = []
    for kind, layer in layer_kinds(spec).items():
        model = build_model(spec, layers=[layer], device=device, seed=layer)
        wl = make_workload(model, point)
        step_ms = _timed_ms(lambda: model.step(wl), device, samples) - base
        st, p = _Step(wl, model.inv_freq), f"model.layers.{layer}."
        a = torch.randn(batch, spec.hidden_size, device=device, dtype=model.dtype)
        attn_ms = _timed_ms(lambda: cached_attention(model.cfg, model.params, p + "self_attn.", a, st, wl.cache, layer),
                            device, samples)
        x = torch.randn(batch, spec.hc_mult, spec.hidden_size, device=device, dtype=model.dtype)
        fn, sc, bs = (model.params[p + "attn_hc." + k] for k in ("fn", "scale", "base"))
        pre = registry.call("hc_pre", x, fn, sc, bs, spec.hc_sinkhorn_iters, spec.hc_eps, spec.rms_norm_eps)
        pre_ms = _timed_ms(lambda: registry.call("hc_pre", x, fn, sc, bs, spec.hc_sinkhorn_iters, spec.hc_eps,
                                                 spec.rms_norm_eps), device, samples)
        post_ms = _timed_ms(lambda: registry.call("hc_post", a, x, pre[1], pre[2]), device, samples)
        attn = kind.split("+")[0]
        mod = peer(peers, f"{attn}_generation", batch, context) if attn != "window" else None
        mpre = [r for r in peers.get("mhc", []) if r["op"] == "pre"]
        mpost = [r for r in peers.get("mhc", []) if r["op"] == "post"]
        ppre = min(mpre, key=lambda r: abs(r["tokens"] - batch)) if mpre else None
        ppost = min(mpost, key=lambda r: abs(r["tokens"] - batch)) if mpost else None
        rows.append({"kind": kind, "layer": layer, "batch": batch, "context": context, "step_ms": round(step_ms, 4),
                     "attention_ms": round(attn_ms, 4), "hc_pre_ms": round(pre_ms, 4), "hc_post_ms": round(post_ms, 4),
                     "peer_attention_ms": mod and mod["latency_ms"], "peer_attention_step": mod and mod["step"],
                     "peer_hc_pre_ms": ppre and ppre["latency_ms"], "peer_hc_post_ms": ppost and ppost["latency_ms"]})
        del model, wl
        if device == "cuda":
            torch.cuda.empty_cache()
    return rows


def run(c: dict, device: str, tokens: int, samples: int) -> list[dict]:
    cfg = V4Config.from_hf(c)
    ids = torch.randint(0, c["vocab_size"], (tokens,), generator=torch.Generator().manual_seed(0)).to(device)
    w = init_weights(c, [], device=device)
    empty = time_forward(cfg, w, ids, [], device, samples)
    rows = []
    for kind, layer in LAYERS.items():
        w = init_weights(c, [layer], device=device, seed=layer)
        ms = time_forward(cfg, w, ids, [layer], device, samples) - empty
        rows.append({"kind": kind, "layer": layer, "ratio": cfg.layer_ratios[layer], "tokens": tokens,
                     "ms_per_layer": round(ms, 3), "tokens_per_s_per_layer": round(tokens / ms * 1e3, 1),
                     "ops_ms": {k: round(v, 3) for k, v in op_split(cfg, w, ids, [layer], device).items()}})
        del w
        if device == "cuda":
            torch.cuda.empty_cache()
    return rows


def main(argv=None) -> int:
    ap = device_parser(__doc__)
    ap.add_argument("--tiny", action="store_true", help="toy widths (the CPU check of this script)")
    ap.add_argument("--tokens", type=int, default=None, help="prefill tokens (cuda 2048, tiny 160: > 128 for HCA)")
    ap.add_argument("--samples", type=int, default=None, help="timed forwards per case (cuda 10, cpu 2)")
    ap.add_argument("--decode-batch", type=int, default=None, help="decode cases' batch (cuda 32, tiny 2; 0: none)")
    ap.add_argument("--decode-context", type=int, default=None, help="decode cases' cached tokens (cuda 4096, tiny 40)")
    ap.add_argument("--out", default=None)
    a = ap.parse_args(argv)
    if a.device == "cuda" and not torch.cuda.is_available():
        print("error: --device cuda but no CUDA device", file=sys.stderr)
        return 2
    c = json.loads(CONFIG.read_text())
    if a.tiny:
        c = tiny_config(c)
    tokens = a.tokens or (160 if a.tiny else 2048)
    samples = a.samples or (10 if a.device == "cuda" else 2)
    with torch.no_grad():
        rows = run(c, a.device, tokens, samples)
        kernels = templates(c, tokens, samples) if a.device == "cuda" else []
        batch = a.decode_batch if a.decode_batch is not None else (2 if a.tiny else 32)
        ctx = a.decode_context or (40 if a.tiny else 4096)
        spec = ModelSpec.from_name("deepseek+tiny" if a.tiny else "deepseek")
        peers = json.loads(PEERS.read_text())
        dec = decode(spec, a.device, batch, ctx, samples, peers) if batch else []
    print(f"{'kind':<14}{'layer':>6}{'ratio':>6}{'tokens':>8}{'ms/layer':>10}{'tok/s/layer':>13}  top ops (ms)")
    for r in rows:
        ops = ", ".join(f"{k} {v}" for k, v in list(r["ops_ms"].items())[:4])
        print(f"{r['kind']:<14}{r['layer']:>6}{r['ratio']:>6}{r['tokens']:>8}{r['ms_per_layer']:>10.2f}"
              f"{r['tokens_per_s_per_layer']:>13.0f}  {ops}")
    for k in kernels:
        print(f"template {k['op']:<22} correct={k['correct']}  reference {k['reference_ms']:.3f} ms  "
              f"triton {k['triton_ms']:.3f} ms  x{k['speedup']}")
    if dec:
        print(f"\ndecode b{batch} ctx{ctx} (ms; peer: vLLM 0.24 on H200, FP8, aiconfigurator)")
        print(f"{'kind':<14}{'layer':>6}{'step':>9}{'attn':>9}{'peer attn':>11}{'hc_pre':>9}{'peer':>8}{'hc_post':>9}{'peer':>8}")
        for r in dec:
            def f(v):
                return f"{v:.3f}" if v is not None else "-"
            print(f"{r['kind']:<14}{r['layer']:>6}{r['step_ms']:>9.3f}{r['attention_ms']:>9.3f}{f(r['peer_attention_ms']):>11}"
                  f"{r['hc_pre_ms']:>9.3f}{f(r['peer_hc_pre_ms']):>8}{r['hc_post_ms']:>9.3f}{f(r['peer_hc_post_ms']):>8}")
    dev = torch.cuda.get_device_name() if a.device == "cuda" else "cpu"
    out = Path(a.out or ROOT / "benchmarks" / "results" / f"{a.device}{'-tiny' if a.tiny else ''}-dsv4-layers.json")
    write_json({"model": "DeepSeek-V4-Flash" + (" (tiny)" if a.tiny else ""), "device": dev, "tokens": tokens,
                "rows": rows, "templates": kernels, "decode": dec,
                "peers_source": json.loads(PEERS.read_text())["provenance"]}, out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
