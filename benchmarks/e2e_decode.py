"""End-to-end decode: tkcc's plan against the reference step, ``torch.compile`` and an independent gpt-fast-style
baseline under ``reduce-overhead`` and ``max-autotune`` (in a CUDA graph), all timed the same two ways.

    python benchmarks/e2e_decode.py --plan examples/plans/llama-1b-h200 --cases llama-1b:all@1/1024
    python benchmarks/e2e_decode.py --device cpu --no-compile --cases tiny-dense:all@1,4/64 --plan DIR

Per case (model, layer slice, batch, context; bf16 decode, one new token per sequence) the same ``Decoder``
(persistent_engine, seeded weights, synthetic cached context) runs as these variants (``--skip`` drops any
but the first and the last; ``VARIANTS``):

  reference              plain-torch reference ops, eager (``reference_ms``)
  reference_graph        the same step captured in one CUDA graph: the baseline of every tkcc speedup today
  torch_compile          ``torch.compile(model.step, mode="reduce-overhead")`` (``torch_compile_s``: the first
                         calls' wall time); weights, KV cache and inputs marked static (no copies, no skips)
  gptfast                the independent baseline (``baseline_gptfast.py``, no tkcc code: static contiguous KV
                         cache, SDPA, gathered-experts MoE) on the same weights and context,
                         ``torch.compile(mode="reduce-overhead", fullgraph=True)``; eager with ``--no-compile``
  gptfast_max_autotune   the same model, ``torch.compile(mode="max-autotune-no-cudagraphs", fullgraph=True)``
                         captured in a CUDA graph here: the strongest baseline a careful user writes
  tkcc                   the plan's accepted overrides (``kernels/composed.py`` through ``compiler.plan.apply``)
                         active while the step is captured in a CUDA graph, as the engine does: compiled by
                         inductor around them (each an opaque call) where the plan was measured against the
                         compiled step (``--tkcc-step``), else the eager reference ops around them; the plan's
                         step CONFIG applied (``cuda_graph``, ``cuda_graph_batch_sizes``, ``kv_block_size``;
                         scheduler knobs listed as ignored); without a plan, the reference (``tkcc_source``)

Timing (``e2e_variants.time_variant``; ``persistent_engine.measure.timing.FairTimer``), per variant in
``timings[variant]``: ``back_to_back_ms`` (``--steps`` calls between two CUDA events / steps, median of
``--repeats`` windows: the headline, also ``{variant}_ms``), ``one_replay_ms`` (one call after an L2 flush,
median of ``--samples``), ``dispatch_ms`` (host time of one call), ``busy_ms`` (GPU busy per call over
``--profile-steps`` profiled calls, ``persistent_engine/measure/kernel_profile.py``; kernels, idle and top
kernels in ``step_kernels``).
Graph-backed variants (graph replays, reduce-overhead calls) are queued while a spin kernel holds the stream,
so host dispatch is reported beside, never inside one side's window; eager variants are timed unheld.
``ratios`` (back to back) and ``ratios_one_replay``: every baseline's time over tkcc's. CPU: inductor's CPU
backend, no graphs, ``perf_counter_ns`` with the caches flushed, no dispatch or busy figure.
Floor: ``floor_ms`` = bytes one step must read (``forward.py``'s count) / the copy bandwidth of the same run.
Agreement, each variant against the eager reference's fp32 logits: relative L2 error within the engine's
per-dtype bound (bf16 5e-2), greedy tokens equal unless the reference's margin between the two tokens is at
most twice the row's largest logit difference (a near tie). On an MoE slice the tkcc step is also checked as
the engine verifies a candidate (``routing_replay``: the reference's routing replayed for flipped tokens,
flips excused only within the tie band); a plan that passes that rule agrees. Exit 1 when a variant disagrees.

``--ablate`` times the tkcc graph once more per accepted optimization without it. Each case prints a markdown
section (``--markdown FILE``). The JSON (``benchmarks/results/<h200|cpu>-e2e-decode.json``, ``--out``) is
written atomically after every case, with the GPU, driver, torch, Triton and the date.
"""

from __future__ import annotations

import argparse
import datetime
import json
import platform
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

import torch  # noqa: E402

from benchmarks import baseline_gptfast as gptfast  # noqa: E402
from benchmarks.e2e_variants import GPTFAST, gptfast_base, run_gptfast, time_variant  # noqa: E402
from benchmarks.e2e_results import BenchError, merge_files, merge_results, print_targets  # noqa: E402
from benchmarks.e2e_results import fmt as _f, read_results, target_verdicts  # noqa: E402
from benchmarks.forward import bytes_read  # noqa: E402
from compiler.plan import apply as plan_apply  # noqa: E402
from persistent_engine import compiled_step, opaque  # noqa: E402
from compiler.plan.compare import capture, compile_step  # noqa: E402
from compiler.plan import artifact as plan_mod  # noqa: E402
from compiler.plan.compose import parse_targets  # noqa: E402
from persistent_engine.measure import timing  # noqa: E402
from persistent_engine.models.aliases import ALIASES, CONFIG_DIR  # noqa: E402
from persistent_engine.models.decoder import build_model  # noqa: E402
from persistent_engine.models.spec import ModelSpec  # noqa: E402
from persistent_engine.ops import registry  # noqa: E402
from persistent_engine.verification import verify  # noqa: E402
from persistent_engine.verification.verify import LOGIT_RTOL, rel_err  # noqa: E402
from persistent_engine.versions import software_versions  # noqa: E402
from persistent_engine.inputs.workloads import make_workload  # noqa: E402
from persistent_engine.io_struct import WorkloadPoint  # noqa: E402

DEFAULT_CASES = {
    "cuda": ["llama-1b:all@1/1024", "qwen3-moe:0,1@azure", "deepseek-v3:cover@azure"],
    "cpu": ["tiny-dense:all@1/64", "tiny-moe:cover@1,4/64", "tiny-mla:cover@1/64"],
}
DEFAULT_TRAFFIC = ROOT / "examples" / "traffic" / "azure2023_conv.parquet"
DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}
STEP_CONFIG = ("cuda_graph", "cuda_graph_batch_sizes", "kv_block_size")   # CONFIG that shapes one step
VARIANTS = ("reference", "reference_graph", "torch_compile", "gptfast", "gptfast_max_autotune", "tkcc")
BASELINES = VARIANTS[:-1]                                                   # every tkcc ratio is against each
SKIPPABLE = ("reference_graph", "torch_compile", "gptfast", "gptfast_max_autotune")
LABELS = {"reference": "reference step, eager", "reference_graph": "reference step, CUDA graph",
          "torch_compile": "torch.compile(reference step, reduce-overhead)",
          "gptfast": "gpt-fast-style, reduce-overhead",
          "gptfast_max_autotune": "gpt-fast-style, max-autotune-no-cudagraphs", "tkcc": "tkcc plan"}
TIMER_RULE = ("persistent_engine.measure.timing.FairTimer: back_to_back_ms = steps calls between two CUDA events / steps, "
              "median of repeats windows (the headline); one_replay_ms = median of samples single calls, L2 flushed "
              "before each; graph-backed variants queued while a spin kernel holds the stream, so their host "
              "dispatch (dispatch_ms, reported beside) stays out of both windows; eager variants unheld; busy_ms = "
              "union of kernel intervals per call in a profile; CPU: perf_counter_ns, caches flushed, no dispatch")


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
    owned: tuple[tuple[plan_mod.PlanOptimization, tuple[str, ...], tuple[str, ...]], ...] = ()


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
    points that ``tkcc optimize`` derives from ``--traffic`` for ``--hw`` (compiler.search.inputs, so the same
    points as a plan optimized on that traffic), each with its own context unless /CONTEXT is given."""
    from compiler.search.inputs import read_traffic

    cases = []
    for text in texts:
        head, _, ctx = text.rpartition("/") if text.rpartition("/")[2].isdigit() else (text, "", "")  # a path's /
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


def case_model(case: Case, device, dtype, seed: int):
    """The reference decoder of a case: an HF checkpoint's own weights when the case's model names one
    (``--model DIR`` as tkcc optimize takes it), else seeded random weights (timing is the same; MoE routing
    and the logits checks are the checkpoint's). Returns (decoder, the checkpoint's path or None)."""
    from persistent_engine import checkpoint_of

    ckpt = checkpoint_of(case.model)
    weights = str(ckpt) if ckpt is not None else None
    return build_model(ModelSpec.from_name(case.model), layers=list(case.layers) if case.layers else None,
                       device=device, dtype=dtype, seed=seed, weights=weights), weights


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


def run_plan_step(model, wl_ref, case: Case, overrides: dict, config: dict, timer, a, seed: int,
                  profile: int = 0, compiled: bool = False) -> tuple[dict, torch.Tensor, dict | None]:
    """tkcc: the step with ``overrides`` and the step-level CONFIG: (its ``timings`` entry, logits, kernels per
    step when ``profile``); ``compiled``: inductor around the overrides (the engine's compiled mode), then
    captured. Like the engine, a step whose capture fails (an override that syncs the host) is timed eagerly
    (unheld: its dispatch is its cost), and ``timed`` says why."""
    cuda = model.device.type == "cuda"
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
            g, out = capture(model, wl, overrides, compiled=compiled)
        except RuntimeError as e:
            torch.cuda.synchronize()
            how = f"eager (capture failed: {str(e).splitlines()[0][:200]})"
        else:
            return time_variant(timer, lambda: (g.replay(), out)[1], a, held=True,
                                how="compiled+cuda_graph" if compiled else "cuda_graph", profile=profile)
    step = model.step
    if compiled and not cuda:                   # CPU: inductor's C++ around the overrides, no graphs
        torch._dynamo.reset()
        step, overrides, how = compiled_step(model), opaque(overrides), "compiled"
    with registry.override(overrides):
        return time_variant(timer, lambda: step(wl), a, held=False, how=how, eager=how != "compiled",
                            profile=profile if cuda else 0)


def hf_config(model: str) -> Path:
    """The config.json a case's model (an alias or a config path) names: what the independent baseline reads."""
    return CONFIG_DIR / ALIASES[model] if model in ALIASES else Path(model)


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
def reference_variants(model, wl, a, timer, ref_logits, timings: dict, kernels: dict, checks: dict) -> dict:
    """The reference step captured in a CUDA graph (GPU) and ``torch.compile`` of it (reduce-overhead's calls,
    held; CPU: inductor's CPU backend), each timed, profiled and checked into the dicts given; returns the
    row fields of the compile."""
    cuda = model.device.type == "cuda"
    profile = a.profile_steps if cuda else 0
    if cuda and "reference_graph" not in a.skip:
        g, out = capture(model, wl, {})
        timings["reference_graph"], logits, kernels["reference_graph"] = time_variant(
            timer, lambda: (g.replay(), out)[1], a, held=True, how="cuda_graph", profile=profile)
        checks["reference_graph"] = agreement(ref_logits, logits, model.dtype)
        del g
    row = {"torch_compile_s": None, "torch_compile_cudagraphs": None}
    if a.no_compile or "torch_compile" in a.skip:
        return row
    run, row["torch_compile_s"], row["torch_compile_cudagraphs"] = compile_step(model, wl)
    how = ('torch.compile(model.step, mode="reduce-overhead") calls (its CUDA graphs), held' if cuda else
           "torch.compile(model.step) (CPU: no CUDA graphs)")
    timings["torch_compile"], logits, kernels["torch_compile"] = time_variant(timer, run, a, held=cuda, how=how,
                                                                               profile=profile)
    checks["torch_compile"] = agreement(ref_logits, logits, model.dtype)
    del run
    torch._dynamo.reset()
    return row


def gptfast_variants(model, wl, case: Case, a, timer, ref_logits, timings: dict, kernels: dict,
                     checks: dict) -> dict:
    """The independent baseline under both compile modes (``e2e_variants.run_gptfast``) on one copy of the
    case's weights and context; returns the row fields (``{name}_timed``, ``_compile_s``, ``_note``)."""
    row: dict[str, Any] = {}
    try:
        base = gptfast_base(model, wl, hf_config(case.model), case.batch, case.context)
    except gptfast.Unsupported as e:
        base, why = None, f"not measured: {e}"
    for mode, name in GPTFAST.items():
        row.update({f"{name}_timed": None, f"{name}_compile_s": None, f"{name}_note": None})
        if base is None or name in a.skip:
            row[f"{name}_note"] = why if base is None else "not measured: --skip"
            continue
        fields, entry, logits, kernels[name] = run_gptfast(base, a, timer, mode)
        row.update(fields)
        if entry is not None:
            timings[name] = entry
            checks[name] = agreement(ref_logits, logits, model.dtype)
    return row


def tkcc_variant(model, wl, case: Case, parts: PlanParts | None, a, timer, ref_logits) -> tuple[dict, dict, dict]:
    """The plan's step: (its row fields, its ``timings`` entry, its kernels per step); the agreement check
    (with routing replay on an MoE slice) and the ablation (``--ablate``) in the row."""
    overrides = dict(parts.loaded.overrides) if parts else {}
    config = dict(parts.loaded.config) if parts else {}
    profile = a.profile_steps if model.device.type == "cuda" else 0
    compiled = tkcc_compiled(a, parts)
    entry, logits, kernels = run_plan_step(model, wl, case, overrides, config, timer, a, a.seed, profile, compiled)
    check = agreement(ref_logits, logits, model.dtype)
    replay = replay_agreement(model, wl, overrides, ref_logits, model.dtype) if overrides else None
    if replay is not None:                              # MoE slice: the engine's rule decides
        check.update(routing_replay=replay, ok_plain=check["ok"], ok=check["ok"] or replay["ok"])
    path = {"cuda_graph": "the engine's CUDA-graph path",
            "compiled+cuda_graph": "the engine's compiled step (inductor around the overrides) in a CUDA graph"
            }.get(entry["timed"], "the engine's eager path")
    if parts is None:
        source = f"reference (no plan for this model) under {path}"
    elif not overrides:
        source = f"reference (the plan has no overrides) under {path} with the plan's CONFIG"
    else:
        source = f"plan overrides under {path}"
    row = {"tkcc_source": source, "tkcc_timed": entry["timed"], "tkcc_check": check,
           "plan": str(parts.loaded.version_dir) if parts else None,
           "plan_version": parts.loaded.plan.version if parts else None, "overrides": sorted(overrides),
           "config_applied": {k: v for k, v in config.items() if k in STEP_CONFIG},
           "config_ignored": sorted(k for k in config if k not in STEP_CONFIG)}
    if a.ablate and parts is not None:
        row["ablation"] = []
        for o, ops, knobs in parts.owned:
            minus, minus_logits, _ = run_plan_step(
                model, wl, case, {k: v for k, v in overrides.items() if k not in ops},
                {k: v for k, v in config.items() if k not in knobs}, timer, a, a.seed, compiled=compiled)
            row["ablation"].append({"name": o.name, "ops": list(ops), "config": list(knobs),
                                    "without_ms": minus["back_to_back_ms"],
                                    "contribution_ms": minus["back_to_back_ms"] - entry["back_to_back_ms"],
                                    "agree": agreement(ref_logits, minus_logits, model.dtype)["ok"]})
    return row, entry, kernels


def tkcc_compiled(a, parts: PlanParts | None) -> bool:
    """Whether the plan's step runs compiled: ``--tkcc-step``, or (``plan``) as the plan was measured (its
    ``plan_speedup.baseline`` words name torch.compile), eager without a plan."""
    if a.tkcc_step != "plan":
        return a.tkcc_step == "compiled" and not a.no_compile
    baseline = str(parts.loaded.plan.plan_speedup.get("baseline", "")) if parts else ""
    return "torch.compile" in baseline and not a.no_compile


def ratios(timings: dict, key: str) -> dict:
    """Every baseline's ``key`` time over tkcc's (> 1: tkcc faster); None for a baseline not measured."""
    tk = timings["tkcc"][key]
    return {f"vs_{n}": (timings[n][key] / tk if n in timings and tk else None) for n in BASELINES}


def run_case(case: Case, model, plans: dict[str, PlanParts], a, timer, copy_gbs: float) -> dict:
    cuda = model.device.type == "cuda"
    wl = make_workload(model, WorkloadPoint(phase="decode", batch=case.batch, context=case.context), a.seed)
    moved = bytes_read(model, wl)
    floor_ms = moved["total"] / (copy_gbs * 1e9) * 1e3
    timings: dict[str, dict] = {}
    kernels: dict[str, dict | None] = {}
    checks: dict[str, dict] = {}
    timings["reference"], ref_logits, _ = time_variant(timer, lambda: model.step(wl), a, held=False, how="eager",
                                                       eager=True)
    row: dict[str, Any] = {"model": case.model, "layers": list(model.layers), "batch": case.batch,
                           "context": case.context, "weight": case.weight, "case": case.text, "dtype": a.dtype}
    row.update(reference_variants(model, wl, a, timer, ref_logits, timings, kernels, checks))
    row.update(gptfast_variants(model, wl, case, a, timer, ref_logits, timings, kernels, checks))
    tk, timings["tkcc"], kernels["tkcc"] = tkcc_variant(model, wl, case, plans.get(case.model), a, timer, ref_logits)
    checks["tkcc"] = tk.pop("tkcc_check")
    row.update(tk)
    row.update({f"{n}_ms": timings[n]["back_to_back_ms"] if n in timings else None for n in VARIANTS})
    profiled = cuda and a.profile_steps
    row.update({"floor_ms": floor_ms, "bytes_read": moved, "copy_bandwidth_gbs": copy_gbs, "timings": timings,
                "step_kernels": {k: v for k, v in kernels.items() if v is not None} if profiled else None,
                "step_kernels_note": None if profiled else ("--profile-steps 0" if cuda else
                                                            "CPU run: no device kernels to profile (CUDA only)")})
    row["pct_floor"] = {f"{n}_ms": (100 * floor_ms / row[f"{n}_ms"] if row[f"{n}_ms"] else None) for n in VARIANTS}
    row["ratios"] = ratios(timings, "back_to_back_ms")
    row["ratios_one_replay"] = ratios(timings, "one_replay_ms")
    row["agreement"] = checks
    row["agree"] = all(c["ok"] for c in checks.values())
    return row


# ---------------------------------------------------------------------------- reporting
def _ratio(r: dict, name: str) -> str:
    if name == "tkcc":
        return ""
    b2b, one = r["ratios"].get(f"vs_{name}"), r["ratios_one_replay"].get(f"vs_{name}")
    return f"x{_f(b2b, '{:.2f}')} / x{_f(one, '{:.2f}')}" if b2b else "-"


def variant_rows(r: dict) -> list[tuple[str, str, str, str, str, str]]:
    """Per measured variant: (label, back to back, one replay, busy, host dispatch, tkcc's speedup over it
    back to back / one replay), times in ms."""
    out = []
    for name in VARIANTS:
        t = r["timings"].get(name)
        if t is not None:
            label = LABELS[name] + (" + CUDA graph" if t["timed"].endswith("captured in a CUDA graph") else "")
            out.append((label, _f(t["back_to_back_ms"]), _f(t["one_replay_ms"]), _f(t["busy_ms"]),
                        _f(t["dispatch_ms"]), _ratio(r, name)))
    return out


def print_row(r: dict) -> None:
    print(f"{r['model']:<11} {len(r['layers']):>3}L b{r['batch']:<4} ctx {r['context']:<5} floor {_f(r['floor_ms'])} "
          f"ms/step ({_f(r['pct_floor']['tkcc_ms'], '{:.1f}')}% tkcc)  {'agree' if r['agree'] else 'DISAGREE'}",
          flush=True)
    print(f"    {'variant':<55} {'b2b ms':>8} {'1 replay':>8} {'busy':>8} {'dispatch':>8}  tkcc speedup", flush=True)
    for label, *cells, ratio in variant_rows(r):
        print(f"    {label:<55} " + " ".join(f"{c:>8}" for c in cells) + f"  {ratio}", flush=True)
    for name in GPTFAST.values():
        if r[f"{name}_note"]:
            print(f"    {name}: {r[f'{name}_note']}", flush=True)
    for name, k in (r["step_kernels"] or {}).items():
        print(f"    {name:<20} " + (k["error"] if "error" in k else
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
    """The docs/performance.md section of one case: every variant timed both ways, the plan's optimizations and
    what each gave."""
    lines = [f"### {r['model']}, {len(r['layers'])} layer(s), batch {r['batch']}, context {r['context']}", "",
             "| variant | back to back (ms) | one replay (ms) | GPU busy (ms) | host dispatch (ms) | "
             "tkcc speedup (back to back / one replay) |", "|---|---|---|---|---|---|"]
    lines += ["| " + " | ".join(cells) + " |" for cells in variant_rows(r)]
    lines += ["", f"Floor {_f(r['floor_ms'])} ms per step (tkcc at {_f(r['pct_floor']['tkcc_ms'], '{:.1f}')}% of it, "
              "back to back).", ""]
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
    ap.add_argument("--steps", type=int, default=None,
                    help="calls per back-to-back window of a graph/compiled variant (cuda 100, cpu 5)")
    ap.add_argument("--repeats", type=int, default=3, help="back-to-back windows per variant (their median)")
    ap.add_argument("--samples", type=int, default=None,
                    help="one-replay samples (each after an L2 flush) of a graph/compiled variant (cuda 100, cpu 5)")
    ap.add_argument("--eager-samples", type=int, default=None,
                    help="an eager variant's calls per window and one-replay samples (cuda 20, cpu 5)")
    ap.add_argument("--no-compile", action="store_true", help="skip torch.compile (slow or unavailable on CPU)")
    ap.add_argument("--skip", default="", help=f"comma list of variants not to run, of: {', '.join(SKIPPABLE)}")
    ap.add_argument("--profile-steps", type=int, default=5,
                    help="profiled calls per variant for kernels/busy/idle per step (CUDA; 0: skip)")
    ap.add_argument("--tkcc-step", choices=["plan", "compiled", "eager"], default="plan",
                    help="the plan's step compiled around its overrides (as the engine's compiled mode) or eager "
                         "reference ops around them; plan: as the plan was measured")
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
    a.skip = tuple(x for x in a.skip.split(",") if x)
    if set(a.skip) - set(SKIPPABLE):
        raise BenchError(f"--skip {','.join(a.skip)}: variants are {', '.join(SKIPPABLE)}")
    if a.threads:
        torch.set_num_threads(a.threads)
    a.steps = a.steps or (100 if cuda else 5)
    a.samples = a.samples or (100 if cuda else 5)
    a.eager_samples = a.eager_samples or (20 if cuda else 5)
    plans = load_plans(a.plan)
    cases = parse_cases(a.cases or DEFAULT_CASES[a.device], a.context or (1024 if cuda else 64),
                        Path(a.traffic), a.hw, a.max_points)
    unused = sorted(set(plans) - {c.model for c in cases})
    if unused:
        raise BenchError(f"plan(s) for {', '.join(unused)} match no case; add a case for that model")
    out = Path(a.out or ROOT / "benchmarks" / "results" / f"{'h200' if cuda else 'cpu'}-e2e-decode.json")
    old = read_results(out) if a.merge and out.is_file() else None      # runs split over several device sessions
    device = torch.device(a.device)
    timer = timing.FairTimer(device)
    info = device_info(device)
    copy_gbs = copy_bandwidth_gbs(device, (1 << 30) if cuda else (64 << 20))
    print(f"{info['gpu']}: copy bandwidth {copy_gbs:.0f} GB/s (read + write); {a.dtype}; "
          f"plans: {', '.join(f'{m} {p.loaded.version_dir}' for m, p in plans.items()) or 'none'}", flush=True)
    now = datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")
    rows, sections, model, key = [], [], None, None
    for case in cases:
        if key != (case.model, case.layers):
            model = None
            if cuda:
                torch.cuda.empty_cache()
            model, weights = case_model(case, device, DTYPES[a.dtype], a.seed)
            key = (case.model, case.layers)
        rows.append({**run_case(case, model, plans, a, timer, copy_gbs), "weights": weights or "seeded random",
                     "date": now})                                                   # cases outlive runs
        print_row(rows[-1])
        sections.append(markdown(rows[-1], plans.get(case.model)))
        print("\n" + sections[-1], flush=True)
        doc = results_doc(a, info, now, copy_gbs, plans, rows, old)
        plan_mod.atomic_write_text(out, json.dumps(doc, indent=1) + "\n")        # after each case: a cut run keeps it
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


def results_doc(a, info: dict, now: str, copy_gbs: float, plans: dict[str, PlanParts], rows: list[dict],
                old: dict | None) -> dict:
    """The results file: the run's settings and versions, its cases so far (merged into ``old``'s with --merge)."""
    doc = {**info, "date": now, "device": a.device, "dtype": a.dtype, "copy_bandwidth_gbs": copy_gbs,
           "timer": {"rule": TIMER_RULE, "steps": a.steps, "repeats": a.repeats, "samples": a.samples,
                     "eager_samples": a.eager_samples, "profile_steps": a.profile_steps if a.device == "cuda" else 0},
           "seed": a.seed, "skipped": list(a.skip),
           "plans": [{"model": m, "path": str(p.loaded.version_dir), "version": p.loaded.plan.version,
                      "optimizations": [o.name for o, _, _ in p.owned]} for m, p in plans.items()],
           "agreement_rule": "logits relative L2 error <= per-dtype bound against the eager reference; greedy "
                             "tokens equal unless the reference margin <= 2 x the row's max logit difference",
           "cases": rows, "targets": target_verdicts(rows)}
    return merge_results(old, doc) if old is not None else doc


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
