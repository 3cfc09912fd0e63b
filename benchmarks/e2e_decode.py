"""End-to-end decode: the eager reference, ``torch.compile`` and a tkcc plan, against the bandwidth floor.

    python benchmarks/e2e_decode.py --plan plans/llama-1b --plan plans/qwen3-moe --plan plans/deepseek
    python benchmarks/e2e_decode.py --device cpu --no-compile --cases tiny-dense:all@1,4/64 --plan DIR

Per case (model, layer slice, batch, context; bf16 decode, one new token per sequence) the same
``Decoder`` (persistent_engine, seeded weights, synthetic cached context) runs four ways:

  reference        plain-torch reference ops, eager (the issue's "eager reference": ``reference_ms``)
  reference graph  the same step captured in one CUDA graph (``reference_graph_ms``)
  torch.compile    ``torch.compile(model.step, mode="reduce-overhead")`` (``torch_compile_ms``; the
                   first calls' wall time is ``torch_compile_s``); weights, KV cache and the step's
                   inputs are marked static so its CUDA graphs neither copy nor skip them
  tkcc             the plan's accepted overrides (``kernels/composed.py`` loaded as a fresh module
                   through ``compiler.apply``) active while the step is captured in a CUDA graph, as
                   the engine does; the plan's CONFIG applied where it means something to one step
                   (``cuda_graph``, ``cuda_graph_batch_sizes``, ``kv_block_size``; scheduler knobs are
                   listed as ignored). Without a plan (or overrides) for the model it is the reference
                   under the engine's graph path with the plan's CONFIG, and ``tkcc_source`` says so.

  gpt-fast         the independent baseline (``benchmarks/baseline_gptfast.py``, no tkcc code: a user's
                   gpt-fast-style model, static contiguous KV cache, SDPA, gathered-experts MoE) on the same
                   weights and cached context, ``torch.compile(mode="reduce-overhead", fullgraph=True)``
                   (``gptfast_ms``; eager with ``--no-compile``; ``gptfast_note`` says why when the family is
                   not one it implements). Every tkcc ratio is also given against it (``vs_gptfast``).

Kernels per step (``step_kernels``, CUDA only; None on CPU, ``step_kernels_note`` says why): each graph or
compiled variant profiled over ``--profile-steps`` calls (``benchmarks/kernel_profile.py``, as
``step_kernels.py``): kernels, busy (union of kernel intervals), idle (first start to last end - busy)
and ``wall_idle_us`` (the timed median - busy).

Timing: ``persistent_engine.timing`` (CUDA events around a graph replay or an eager step, L2 flushed
before each sample, device synchronised; ``perf_counter_ns`` on CPU), median of ``--samples``.
Floor: ``floor_ms`` = bytes one step must read (weights except the untouched embedding rows, only
the experts the batch routes to, plus the KV cache; ``benchmarks/forward.py``'s count) / the
device-to-device copy bandwidth (read + write) measured in the same run.
Agreement, each variant against the eager reference's fp32 logits: relative L2 error within the
engine's per-dtype bound (bf16 5e-2), and greedy tokens equal, a differing token tolerated only where
the reference's margin between the two tokens is at most twice that row's largest logit difference
(a near tie that rounding can flip). On a slice with MoE layers the tkcc step is also checked as the
engine verifies a candidate (``routing_replay``): the reference's routing recorded, the plan's step run
once eagerly with the reference's experts for the tokens whose expert set flips (``verify.RouteReplay``),
each flip excused only within the tie band, every sequence's logits compared; a plan that fails the plain
rule but passes that one agrees (its differences are routing flips at near ties, which cascade freely in
the timed step). Exit 1 when a variant disagrees (the JSON is still written).

``--ablate`` times the tkcc graph once more per accepted optimization with all overrides but that
one's (contribution = that time - the full plan's). Each case prints a markdown section listing the
plan's optimizations (``--markdown FILE`` also writes them) for ``docs/performance.md``.
Writes ``benchmarks/results/h200-e2e-decode.json`` (cuda) or ``cpu-e2e-decode.json`` atomically.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from benchmarks import baseline_gptfast as gptfast  # noqa: E402
from benchmarks.e2e_results import BenchError, merge_files, merge_results, print_targets  # noqa: E402
from benchmarks.e2e_results import fmt as _f, read_results, target_verdicts  # noqa: E402
from benchmarks.forward import bytes_read  # noqa: E402
from benchmarks.kernel_profile import profile_intervals, summarize  # noqa: E402
from compiler import apply as plan_apply  # noqa: E402
from compiler.compare import capture, compile_step  # noqa: E402
from compiler import plan as plan_mod  # noqa: E402
from compiler.compose import parse_targets  # noqa: E402
from persistent_engine import timing  # noqa: E402
from persistent_engine.models.aliases import ALIASES, CONFIG_DIR  # noqa: E402
from persistent_engine.models.decoder import build_model  # noqa: E402
from persistent_engine.models.spec import ModelSpec  # noqa: E402
from persistent_engine.ops import registry  # noqa: E402
from persistent_engine import verify  # noqa: E402
from persistent_engine.verify import LOGIT_RTOL, rel_err  # noqa: E402
from persistent_engine.versions import software_versions  # noqa: E402
from persistent_engine.workloads import make_workload  # noqa: E402
from persistent_engine.io_struct import WorkloadPoint  # noqa: E402

DEFAULT_CASES = {
    "cuda": ["llama-1b:all@1/1024", "qwen3-moe:0,1@azure", "deepseek-v3:cover@azure"],
    "cpu": ["tiny-dense:all@1/64", "tiny-moe:cover@1,4/64", "tiny-mla:cover@1/64"],
}
DEFAULT_TRAFFIC = ROOT / "examples" / "traffic" / "azure2023_conv.parquet"
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
STEP_CONFIG = ("cuda_graph", "cuda_graph_batch_sizes", "kv_block_size")   # CONFIG that shapes one step
@dataclass(frozen=True)
class Case:
    model: str
    layers: tuple[int, ...] | None       # None: every layer
    batch: int
    context: int
    weight: float | None = None          # the workload point's share of GPU time, when from traffic
    text: str = ""                       # the --cases entry it came from


@dataclass(frozen=True)
class PlanParts:
    """A loaded plan and, per accepted optimization, the ops and CONFIG knobs it owns."""

    loaded: plan_apply.LoadedPlan
    owned: tuple[tuple[plan_mod.Optimization, tuple[str, ...], tuple[str, ...]], ...] = ()


# ---------------------------------------------------------------------------- cases and plans
def _layers(spec: ModelSpec, text: str) -> tuple[int, ...] | None:
    if text in ("", "all"):
        return None
    if text == "cover":
        return tuple(spec.covering_layers())
    if "," in text:
        return tuple(int(x) for x in text.split(","))
    return tuple(range(int(text)))


def parse_cases(texts: list[str], default_context: int, traffic: Path, hw: str, max_points: int) -> list[Case]:
    """``MODEL[:LAYERS][@BATCHES][/CONTEXT]``: LAYERS all | cover (spec.covering_layers()) | N | i,j;
    BATCHES a comma list or ``azure``: the decode points among the ``max_points`` heaviest workload
    points that ``tkcc optimize`` derives from ``--traffic`` for ``--hw`` (compiler.inputs, so the same
    points as a plan optimized on that traffic), each with its own context unless /CONTEXT is given."""
    from compiler.inputs import read_traffic

    cases = []
    for text in texts:
        head, _, ctx = text.partition("/")
        head, _, batches = head.partition("@")
        alias, _, layer_text = head.partition(":")
        try:
            spec = ModelSpec.from_name(alias)
            layers = _layers(spec, layer_text)
            context = int(ctx) if ctx else None
            if batches == "azure":
                points = read_traffic(str(traffic), spec, hw, max_points=max_points).points
                cases += [Case(alias, layers, p.batch, context or p.context, p.weight, text)
                          for p in points if p.phase == "decode"]
            else:
                cases += [Case(alias, layers, int(b), context or default_context, None, text)
                          for b in (batches or "1").split(",")]
        except ValueError as e:
            if getattr(e, "user_error", False):
                raise
            raise BenchError(f"bad case {text!r}: {e} "
                             "(format MODEL[:all|cover|N|i,j][@B1,B2|azure][/CONTEXT])") from None
    return cases


def load_plans(paths: list[str]) -> dict[str, PlanParts]:
    """model alias -> its plan; each optimization's ops and knobs read from its own kernel file."""
    out: dict[str, PlanParts] = {}
    for path in paths:
        loaded = plan_apply.load(path)
        model = loaded.plan.model
        if model in out:
            raise BenchError(f"two plans for {model}: {out[model].loaded.version_dir} and {loaded.version_dir}")
        owned = []
        for o in loaded.plan.optimizations:
            ops, knobs = tuple(o.targets), ()
            kfile = loaded.version_dir / o.kernel if o.kernel else None
            if kfile is not None and kfile.is_file():
                parsed_ops, knobs = parse_targets(kfile.read_text())
                ops = parsed_ops or ops
            owned.append((o, tuple(op for op in ops if op in loaded.overrides),
                          tuple(k for k in knobs if k in loaded.config)))
        out[model] = PlanParts(loaded, tuple(owned))
    return out


# ---------------------------------------------------------------------------- measurement
def copy_bandwidth_gbs(device: torch.device, nbytes: int, repeats: int = 10) -> float:
    """Device-to-device copy bandwidth, read + write bytes over the best of ``repeats`` copies."""
    src = torch.empty(nbytes, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    timer = timing.make_timer(device)
    dst.copy_(src)
    best = min(timer.sample(lambda: dst.copy_(src))[0] for _ in range(repeats))
    return 2 * nbytes / (best / 1e3) / 1e9


def relayout(src, dst, tokens: int) -> None:
    """Copies the first ``tokens`` cached tokens of every sequence from cache ``src`` into ``dst``
    (another block size or block order): the same logical context in a different paged layout."""
    b = src.batch
    pos = torch.arange(tokens, device=src.block_tables.device).repeat(b)
    seq = torch.arange(b, device=pos.device).repeat_interleave(tokens)
    s_src, s_dst = src.slots(pos, seq), dst.slots(pos, seq)
    for pools_src, pools_dst in ((src.k, dst.k), (src.v, dst.v)):
        for i, p in pools_src.items():
            q = pools_dst[i]
            q.view(-1, *q.shape[2:])[s_dst] = p.view(-1, *p.shape[2:])[s_src]


def timed(timer, run: Callable[[], torch.Tensor], samples: int, graph: bool,
          warmup: int = 2) -> tuple[float, torch.Tensor]:
    """(median ms, a clone of the last output)."""
    for _ in range(warmup):
        run()
    stats = timing.time_one(timer, run, samples, graph=graph)
    return stats.median_ms, run().clone()


def kernels_per_step(run: Callable[[], torch.Tensor], steps: int, wall_ms: float, cuda: bool = True) -> dict:
    """Kernels, busy / idle microseconds per call of ``run`` over ``steps`` profiled calls (kernel_profile.py;
    ``cuda`` False: top-level aten ops stand in, for tests), the 5 heaviest kernels, and ``wall_idle_us`` =
    the timed median ``wall_ms`` - busy."""
    try:
        s = summarize(*profile_intervals(run, steps, cuda=cuda), top=5)
    except RuntimeError as e:                          # the profiler saw no kernel in some call
        return {"error": str(e)}
    return {**s, "wall_us": wall_ms * 1e3, "wall_idle_us": wall_ms * 1e3 - s["busy_us"]}


def run_plan_step(model, wl_ref, case: Case, overrides: dict, config: dict, timer, samples: int, cuda: bool,
                  seed: int, profile_steps: int = 0) -> tuple[float, torch.Tensor, str | None, dict | None]:
    """tkcc: the step with ``overrides`` and the step-level CONFIG: (ms, logits, how it ran, kernels per step
    when ``profile_steps``). Like the engine, a step whose capture fails (an override that syncs the host)
    is timed eagerly."""
    wl = wl_ref
    bs = config.get("kv_block_size")
    if bs and bs != wl_ref.cache.block_size:
        wl = make_workload(model, WorkloadPoint(phase="decode", batch=case.batch, context=case.context), seed,
                           fill="zeros", block_size=int(bs))
        relayout(wl_ref.cache, wl.cache, case.context)
    batches = config.get("cuda_graph_batch_sizes")
    how = "eager"
    if cuda and config.get("cuda_graph", True) and (batches is None or case.batch in batches):
        try:
            g, out = capture(model, wl, overrides)
        except RuntimeError as e:
            torch.cuda.synchronize()
            how = f"eager (capture failed: {str(e).splitlines()[0][:200]})"
        else:
            ms, logits = timed(timer, lambda: (g.replay(), out)[1], samples, graph=True)
            kernels = kernels_per_step(lambda: (g.replay(), out)[1], profile_steps, ms) if profile_steps else None
            del g
            return ms, logits, "cuda_graph", kernels
    with registry.override(overrides):
        ms, logits = timed(timer, lambda: model.step(wl), samples, graph=False)
        kernels = kernels_per_step(lambda: model.step(wl), profile_steps, ms) if profile_steps and cuda else None
    return ms, logits, how, kernels


def hf_config(model: str) -> Path:
    """The config.json a case's model (an alias or a config path) names: what the independent baseline reads."""
    return CONFIG_DIR / ALIASES[model] if model in ALIASES else Path(model)


def run_gptfast(model, wl, case: Case, a, timer, cuda: bool) -> tuple[dict, torch.Tensor | None, dict | None]:
    """The independent baseline on the model's weights and the workload's cached context: (its row fields,
    its logits, its kernels per step), logits None where it does not implement the model's family.
    Memory: a copy of the slice's weights and a static KV cache of the point."""
    row: dict[str, Any] = {"gptfast_ms": None, "gptfast_timed": None, "gptfast_compile_s": None, "gptfast_note": None}
    try:
        args = gptfast.ModelArgs.from_name(hf_config(case.model))
        base = gptfast.build_from_tkcc(args, model.params, model.layers, case.batch, case.context + 1)
    except gptfast.Unsupported as e:
        row["gptfast_note"] = f"not measured: {e}"
        return row, None, None
    gptfast.load_paged_context(base, wl.cache.k, wl.cache.v, wl.cache.block_tables, case.context)
    idx, pos = wl.token_ids.view(case.batch, 1), torch.tensor([case.context], device=model.device)
    step = base if a.no_compile else gptfast.compile_decode(base)

    def run() -> torch.Tensor:
        with torch.no_grad():
            return step(idx, pos)

    t0 = time.perf_counter()
    try:
        for _ in range(3):                              # compile (and record the CUDA graphs)
            run()
        if cuda:
            torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 - a baseline that does not compile is reported, the run goes on
        torch._dynamo.reset()
        row["gptfast_note"] = f"not measured: {type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"
        return row, None, None
    if not a.no_compile:
        row["gptfast_compile_s"] = time.perf_counter() - t0
    row["gptfast_timed"] = ("eager (--no-compile)" if a.no_compile else
                            'torch.compile(mode="reduce-overhead", fullgraph=True)' if cuda else
                            "torch.compile(fullgraph=True) (CPU: no CUDA graphs)")
    row["gptfast_ms"], logits = timed(timer, run, a.samples if cuda or not a.no_compile else a.eager_samples,
                                      graph=False)
    kernels = kernels_per_step(run, a.profile_steps, row["gptfast_ms"]) if cuda and a.profile_steps else None
    torch._dynamo.reset()
    return row, logits, kernels


def agreement(ref: torch.Tensor, out: torch.Tensor, dtype: torch.dtype) -> dict:
    """Logits of a variant against the eager reference (see the module docstring for the rule)."""
    ref, out = ref.float(), out.float()
    err, tol = rel_err(out, ref), LOGIT_RTOL.get(dtype, 5e-2)
    t_ref, t_out = ref.argmax(-1), out.argmax(-1)
    rows = torch.arange(ref.shape[0], device=ref.device)
    margin = ref[rows, t_ref] - ref[rows, t_out]                          # >= 0; 0 where equal
    row_diff = (ref - out).abs().amax(-1)
    unexplained = int(((t_ref != t_out) & (margin > 2 * row_diff)).sum())
    finite = bool(torch.isfinite(out).all())
    return {"rel_err": err, "rel_tol": tol, "tokens_equal": int((t_ref == t_out).sum()), "tokens": ref.shape[0],
            "unexplained_token_mismatches": unexplained,
            "ok": finite and err <= tol and unexplained == 0}


def replay_agreement(model, wl, overrides: dict, ref_logits: torch.Tensor, dtype: torch.dtype) -> dict | None:
    """The plan's step against the reference as the engine's layer-level verification compares them on an MoE
    slice (routing replay, tie band; see the module docstring); None for a slice that routes nothing.
    Cost: two eager steps."""
    refs = verify.ReferenceRoutes(registry).get(0, model, wl, ref_logits, dtype)
    if refs == []:
        return None
    if refs is None:
        return {"ok": False, "replayed": False, "reason": "the reference's routing could not be recorded "
                "(its re-run differs from its timed run)", "summary": "", "rel_err": None}
    out, wrap = verify.routed_step(registry, model, wl, overrides, refs)
    replayed = isinstance(wrap, verify.RouteReplay)     # a plan that keeps the reference router
    ties = verify.TieCheck(dtype, depths=verify.moe_depths(model), pick_depths=verify.pick_depths(model))
    reason = ties.compare(out, ref_logits, "e2e", refs, wrap.calls, wl.cu_seqlens_q, replayed=replayed)
    reason = reason or ties.budget_reason()
    return {"ok": reason is None, "replayed": replayed, "reason": reason, "summary": ties.summary(),
            "rel_err": rel_err(out.float(), ref_logits.float())}


# ---------------------------------------------------------------------------- one case
def run_case(case: Case, model, plans: dict[str, PlanParts], a, timer, copy_gbs: float) -> dict:
    cuda = model.device.type == "cuda"
    seed = a.seed
    wl = make_workload(model, WorkloadPoint(phase="decode", batch=case.batch, context=case.context), seed)
    moved = bytes_read(model, wl)
    floor_ms = moved["total"] / (copy_gbs * 1e9) * 1e3
    ref_ms, ref_logits = timed(timer, lambda: model.step(wl), a.eager_samples, graph=False)
    checks: dict[str, dict] = {}
    row: dict[str, Any] = {"model": case.model, "layers": list(model.layers), "batch": case.batch,
                           "context": case.context, "weight": case.weight, "case": case.text,
                           "dtype": a.dtype, "reference_ms": ref_ms}
    profile = a.profile_steps if cuda else 0
    kernels: dict[str, dict | None] = {}
    if cuda:
        g, out = capture(model, wl, {})
        row["reference_graph_ms"], logits = timed(timer, lambda: (g.replay(), out)[1], a.samples, graph=True)
        checks["reference_graph"] = agreement(ref_logits, logits, model.dtype)
        if profile:
            kernels["reference_graph"] = kernels_per_step(lambda: (g.replay(), out)[1], profile,
                                                          row["reference_graph_ms"])
        del g
    else:
        row["reference_graph_ms"] = None
    row["torch_compile_ms"] = row["torch_compile_s"] = row["torch_compile_cudagraphs"] = None
    if not a.no_compile:
        run, row["torch_compile_s"], row["torch_compile_cudagraphs"] = compile_step(model, wl)
        row["torch_compile_ms"], logits = timed(timer, run, a.samples, graph=False)
        checks["torch_compile"] = agreement(ref_logits, logits, model.dtype)
        if profile:
            kernels["torch_compile"] = kernels_per_step(run, profile, row["torch_compile_ms"])
        del run
        torch._dynamo.reset()
    fields, logits, kernels["gptfast"] = run_gptfast(model, wl, case, a, timer, cuda)
    row.update(fields)
    if logits is not None:
        checks["gptfast"] = agreement(ref_logits, logits, model.dtype)

    parts = plans.get(case.model)
    overrides = dict(parts.loaded.overrides) if parts else {}
    config = dict(parts.loaded.config) if parts else {}
    tk_ms, logits, tk_how, kernels["tkcc"] = run_plan_step(model, wl, case, overrides, config, timer, a.samples,
                                                          cuda, seed, profile)
    checks["tkcc"] = agreement(ref_logits, logits, model.dtype)
    replay = replay_agreement(model, wl, overrides, ref_logits, model.dtype) if overrides else None
    if replay is not None:                              # MoE slice: the engine's rule decides
        checks["tkcc"].update(routing_replay=replay, ok_plain=checks["tkcc"]["ok"],
                              ok=checks["tkcc"]["ok"] or replay["ok"])
    path = "the engine's CUDA-graph path" if tk_how == "cuda_graph" else "the engine's eager path"
    if parts is None:
        source = f"reference (no plan for this model) under {path}"
    elif not overrides:
        source = f"reference (the plan has no overrides) under {path} with the plan's CONFIG"
    else:
        source = f"plan overrides under {path}"
    row.update({"tkcc_ms": tk_ms, "tkcc_source": source, "tkcc_timed": tk_how,
                "plan": str(parts.loaded.version_dir) if parts else None,
                "plan_version": parts.loaded.plan.version if parts else None,
                "overrides": sorted(overrides),
                "config_applied": {k: v for k, v in config.items() if k in STEP_CONFIG},
                "config_ignored": sorted(k for k in config if k not in STEP_CONFIG),
                "floor_ms": floor_ms, "bytes_read": moved, "copy_bandwidth_gbs": copy_gbs,
                "step_kernels": {k: v for k, v in kernels.items() if v is not None} if profile else None,
                "step_kernels_note": None if profile else ("--profile-steps 0" if cuda else
                                                           "CPU run: no device kernels to profile (CUDA only)")})
    if a.ablate and parts is not None:
        row["ablation"] = []
        for o, ops, knobs in parts.owned:
            minus_ms, minus_logits, _, _ = run_plan_step(
                model, wl, case, {k: v for k, v in overrides.items() if k not in ops},
                {k: v for k, v in config.items() if k not in knobs}, timer, a.samples, cuda, seed)
            row["ablation"].append({"name": o.name, "ops": list(ops), "config": list(knobs),
                                    "without_ms": minus_ms, "contribution_ms": minus_ms - tk_ms,
                                    "agree": agreement(ref_logits, minus_logits, model.dtype)["ok"]})
    best_ref = row["reference_graph_ms"]
    row["pct_floor"] = {k: (100 * floor_ms / row[k] if row[k] else None)
                        for k in ("reference_ms", "reference_graph_ms", "torch_compile_ms", "gptfast_ms", "tkcc_ms")}
    row["ratios"] = {"vs_reference": ref_ms / tk_ms,
                     "vs_reference_graph": best_ref / tk_ms if best_ref else None,
                     "vs_torch_compile": row["torch_compile_ms"] / tk_ms if row["torch_compile_ms"] else None,
                     "vs_gptfast": row["gptfast_ms"] / tk_ms if row["gptfast_ms"] else None}
    row["agreement"] = checks
    row["agree"] = all(c["ok"] for c in checks.values())
    return row


# ---------------------------------------------------------------------------- reporting
def print_row(r: dict) -> None:
    p, q = r["pct_floor"], r["ratios"]
    print(f"{r['model']:<11} {len(r['layers']):>3}L b{r['batch']:<4} ctx {r['context']:<5} "
          f"eager {_f(r['reference_ms'])}  graph {_f(r['reference_graph_ms'])}  compile {_f(r['torch_compile_ms'])}  "
          f"gpt-fast {_f(r['gptfast_ms'])}  tkcc {_f(r['tkcc_ms'])} ms/step  floor {_f(r['floor_ms'])} "
          f"({_f(p['tkcc_ms'], '{:.1f}')}% tkcc, {_f(p['torch_compile_ms'], '{:.1f}')}% compile, "
          f"{_f(p['gptfast_ms'], '{:.1f}')}% gpt-fast)  x{_f(q['vs_reference'], '{:.2f}')} eager  "
          f"x{_f(q['vs_torch_compile'], '{:.2f}')} compile  x{_f(q['vs_gptfast'], '{:.2f}')} gpt-fast  "
          f"{'agree' if r['agree'] else 'DISAGREE'}", flush=True)
    if r["gptfast_note"]:
        print(f"    gpt-fast: {r['gptfast_note']}", flush=True)
    for name, k in (r["step_kernels"] or {}).items():
        print(f"    {name:<16} " + (k["error"] if "error" in k else
                                    f"{k['kernels']:.0f} kernels/step, busy {k['busy_us']:.1f} us, idle "
                                    f"{k['idle_us']:.1f} us (wall - busy {k['wall_idle_us']:.1f} us)"), flush=True)
    for name, c in r["agreement"].items():
        if not c.get("ok_plain", c["ok"]):
            print(f"    {name}: relative error {c['rel_err']:.3g} (bound {c['rel_tol']:g}), greedy tokens "
                  f"{c['tokens_equal']}/{c['tokens']} equal, {c['unexplained_token_mismatches']} not explained",
                  flush=True)
        if "routing_replay" in c:
            rp = c["routing_replay"]
            print(f"    {name} with routing replay: {'agrees' if rp['ok'] else 'DISAGREES'}"
                  + (f" ({rp['summary']})" if rp["summary"] else "") + (f": {rp['reason']}" if rp["reason"] else ""),
                  flush=True)


def markdown(r: dict, parts: PlanParts | None) -> str:
    """The docs/performance.md section of one case: the plan's optimizations and what each gave."""
    lines = [f"### {r['model']}, {len(r['layers'])} layer(s), batch {r['batch']}, context {r['context']}", ""]
    lines.append(f"eager {_f(r['reference_ms'])} ms, CUDA graph {_f(r['reference_graph_ms'])} ms, torch.compile "
                 f"{_f(r['torch_compile_ms'])} ms, gpt-fast {_f(r['gptfast_ms'])} ms, tkcc {_f(r['tkcc_ms'])} ms "
                 f"per step; floor {_f(r['floor_ms'])} ms "
                 f"(tkcc at {_f(r['pct_floor']['tkcc_ms'], '{:.1f}')}% of it).")
    lines.append("")
    if parts is None or not parts.loaded.plan.optimizations:
        lines += [f"tkcc: {r['tkcc_source']}.", ""]
        return "\n".join(lines)
    lines.append(f"Plan `{r['plan']}` (version {r['plan_version']}): {len(parts.owned)} accepted optimization(s); "
                 f"CONFIG applied {json.dumps(r['config_applied'])}"
                 + (f", ignored {', '.join(r['config_ignored'])}" if r["config_ignored"] else "") + ".")
    lines += ["", "| optimization | ops | CONFIG | speedup fast / slow (plan) | without it (ms) | contribution (ms) |",
              "|---|---|---|---|---|---|"]
    ablation = {x["name"]: x for x in r.get("ablation", [])}
    for o, ops, knobs in parts.owned:
        x = ablation.get(o.name)
        lines.append(f"| {o.name} | {', '.join(ops) or '-'} | {', '.join(knobs) or '-'} | "
                     f"{_f(o.speedup.get('fast'), '{:.2f}')} / {_f(o.speedup.get('slow'), '{:.2f}')} | "
                     f"{_f(x['without_ms']) if x else 'not measured'} | "
                     f"{_f(x['contribution_ms'], '{:+.3f}') if x else 'run with --ablate'} |")
    lines.append("")
    return "\n".join(lines)


def device_info(device: torch.device) -> dict:
    v = software_versions(driver=device.type == "cuda")
    info = {"torch": torch.__version__, "triton": v["triton"], "driver": v["driver"],
            "gpu": platform.processor() or platform.machine() or "cpu"}
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
        info["cuda"] = v["cuda"]
    return info


# ---------------------------------------------------------------------------- main
def _parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--plan", action="append", default=[], help="plan directory (root or vN); repeat per model")
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu", choices=["cpu", "cuda"])
    ap.add_argument("--cases", nargs="*", help="MODEL[:all|cover|N|i,j][@B1,B2|azure][/CONTEXT]; default by device")
    ap.add_argument("--context", type=int, default=None, help="default context (cuda 1024, cpu 64)")
    ap.add_argument("--traffic", default=str(DEFAULT_TRAFFIC), help="trace for @azure cases")
    ap.add_argument("--hw", default="h200", help="hardware the @azure workload points are derived for")
    ap.add_argument("--max-points", type=int, default=4, help="workload points for @azure (tkcc optimize's default)")
    ap.add_argument("--dtype", default="bf16", choices=list(DTYPES))
    ap.add_argument("--samples", type=int, default=None, help="timed graph/compiled steps (cuda 100, cpu 5)")
    ap.add_argument("--eager-samples", type=int, default=None, help="timed eager steps (cuda 20, cpu 5)")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile (slow or unavailable on CPU)")
    ap.add_argument("--profile-steps", type=int, default=5,
                    help="profiled calls per variant for kernels/busy/idle per step (CUDA; 0: skip)")
    ap.add_argument("--ablate", action="store_true", help="time the plan without each optimization in turn")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=None, help="CPU threads for torch")
    ap.add_argument("--markdown", default=None, help="also write the per-case markdown sections here")
    ap.add_argument("--out", default=None, help="JSON path (default benchmarks/results/<h200|cpu>-e2e-decode.json)")
    ap.add_argument("--merge", action="store_true",
                    help="keep the cases of an existing --out file that this run does not measure again")
    ap.add_argument("--merge-from", nargs="+", metavar="FILE", default=None,
                    help="measure nothing: merge these results files (a later file's case wins) into --out")
    return ap


def run(a: argparse.Namespace) -> int:
    cuda = a.device == "cuda"
    if cuda and not torch.cuda.is_available():
        raise BenchError("--device cuda but no CUDA device is visible")
    if a.threads:
        torch.set_num_threads(a.threads)
    a.samples = a.samples or (100 if cuda else 5)
    a.eager_samples = a.eager_samples or (20 if cuda else 5)
    plans = load_plans(a.plan)
    cases = parse_cases(a.cases or DEFAULT_CASES[a.device], a.context or (1024 if cuda else 64),
                        Path(a.traffic), a.hw, a.max_points)
    unused = sorted(set(plans) - {c.model for c in cases})
    if unused:
        raise BenchError(f"plan(s) for {', '.join(unused)} match no case; add a case for that model")
    device = torch.device(a.device)
    timer = timing.make_timer(device)
    info = device_info(device)
    copy_gbs = copy_bandwidth_gbs(device, (1 << 30) if cuda else (64 << 20))
    print(f"{info['gpu']}: copy bandwidth {copy_gbs:.0f} GB/s (read + write); {a.dtype}; "
          f"plans: {', '.join(f'{m} {p.loaded.version_dir}' for m, p in plans.items()) or 'none'}", flush=True)
    rows, sections, model, key = [], [], None, None
    for case in cases:
        if key != (case.model, case.layers):
            model = None
            if cuda:
                torch.cuda.empty_cache()
            model = build_model(ModelSpec.from_name(case.model), layers=list(case.layers) if case.layers else None,
                                device=device, dtype=DTYPES[a.dtype], seed=a.seed)
            key = (case.model, case.layers)
        r = run_case(case, model, plans, a, timer, copy_gbs)
        rows.append(r)
        print_row(r)
        sections.append(markdown(r, plans.get(case.model)))
        print("\n" + sections[-1], flush=True)
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    for r in rows:
        r["date"] = now                             # the run that measured it (cases outlive runs: --merge)
    doc = {**info, "date": now,
           "device": a.device, "dtype": a.dtype, "copy_bandwidth_gbs": copy_gbs, "samples": a.samples,
           "eager_samples": a.eager_samples, "seed": a.seed,
           "plans": [{"model": m, "path": str(p.loaded.version_dir), "version": p.loaded.plan.version,
                      "optimizations": [o.name for o, _, _ in p.owned]} for m, p in plans.items()],
           "agreement_rule": "logits relative L2 error <= per-dtype bound against the eager reference; greedy "
                             "tokens equal unless the reference margin <= 2 x the row's max logit difference",
           "cases": rows, "targets": target_verdicts(rows)}
    out = Path(a.out or ROOT / "benchmarks" / "results" / f"{'h200' if cuda else 'cpu'}-e2e-decode.json")
    if a.merge and out.is_file():                   # runs split over several device sessions
        doc = merge_results(read_results(out), doc)
    plan_mod.atomic_write_text(out, json.dumps(doc, indent=1) + "\n")
    if a.markdown:
        plan_mod.atomic_write_text(a.markdown, "\n".join(sections))
    print_targets(doc)
    print(f"wrote {out}")
    bad = [f"{r['model']} b{r['batch']}: {', '.join(k for k, c in r['agreement'].items() if not c['ok'])}"
           for r in rows if not r["agree"]]
    if bad:
        print(f"e2e_decode: variants disagree with the eager reference: {'; '.join(bad)}", file=sys.stderr)
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    a = _parser().parse_args(argv)
    try:
        if a.merge_from:
            if not a.out:
                raise BenchError("--merge-from needs --out (the merged file)")
            return merge_files(a.merge_from, Path(a.out))
        return run(a)
    except Exception as e:  # noqa: BLE001 - user errors are one line, exit 2
        if getattr(e, "user_error", False):
            print(f"e2e_decode: error: {e}", file=sys.stderr)
            return 2
        raise


if __name__ == "__main__":
    sys.exit(main())
