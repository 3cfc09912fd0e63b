"""report.md for a plan version, with three SVG plots: speedup per workload point, time per op
before and after the plan, and the parallelism Pareto front. Reads only the plan record (so a
report can be re-rendered from any plan.json) and returns the files to write beside it."""

from __future__ import annotations

from compiler.plan.artifact import Plan
from compiler.plan.plots import bar_chart, scatter_chart
from persistent_engine import point_label


def _x(v) -> str:
    return "n/a" if v is None else f"{float(v):.3f}x"


def _speedup_plot(plan: Plan) -> str | None:
    rows = plan.plan_speedup.get("per_point") or []
    if not rows:
        return None
    series = {tier: [r.get(tier) for r in rows] for tier in ("fast", "slow") if any(r.get(tier) for r in rows)}
    if not series:
        return None
    return bar_chart("Plan speedup per workload point (reference / plan)",
                     [point_label(r, weighted=True) for r in rows], series, unit="x", reference=1.0)


def _op_plot(plan: Plan) -> str | None:
    before = plan.baseline.get("op_ms") or {}
    after = plan.baseline.get("op_ms_after") or {}
    if not before:
        return None
    ops = sorted(before, key=lambda k: -before[k])[:16]
    dev = measured_on(plan)
    series = {f"before (reference, measured on {dev})": [before[o] for o in ops]}
    if after:
        series[f"after (plan, measured on {dev})"] = [after.get(o) for o in ops]
    return bar_chart("Time per op, fast tier: the traffic's mean step", ops, series, unit=" ms")


def measured_on(plan: Plan) -> str:
    """The device the engines measured on, as a word (``cpu``, ``NVIDIA H200``)."""
    dev = plan.detected_device or {}
    return str(dev.get("name") if dev.get("kind") == "cuda" and dev.get("name") else dev.get("kind") or "?")


def hw_words(plan: Plan) -> str:
    """``on h200``, or ``projected for h200, measured on cpu`` when the target is not the device used."""
    if (plan.detected_device or {}).get("matches_hw", True):
        return f"on {plan.hw}"
    return f"projected for {plan.hw}, measured on {measured_on(plan)}"


_LAYOUT_KEYS = ("tp", "pp", "ep", "dp", "dcp", "moe_tp")
_SETTING_KEYS = (("dtype", "{}"), ("kv_dtype", "kv-{}"), ("batch", "b{}"), ("pd", "{}"), ("replicas", "x{}"))


def layout_labels(configs: list[dict]) -> list[str]:
    """A label per config naming what tells it from the others: its layout (``tp2 pp1 ep1 dp1``; dcp and
    moe_tp where not 1) and each setting (dtype, KV dtype, batch, P/D, replicas) that differs among
    ``configs``; labels still alike get ``#2``, ``#3``... in order."""
    varying = [(k, f) for k, f in _SETTING_KEYS if len({str(c.get(k)) for c in configs}) > 1]
    labels = []
    for c in configs:
        parts = [f"{k}{c.get(k)}" for k in _LAYOUT_KEYS[:4]]
        parts += [f"{k}{c[k]}" for k in _LAYOUT_KEYS[4:] if c.get(k) not in (None, 1)]
        if not any(k == "dtype" for k, _ in varying) and c.get("dtype"):
            parts.append(str(c["dtype"]))
        parts += [f.format(c.get(k)) for k, f in varying]
        labels.append(" ".join(parts))
    seen: dict[str, int] = {}
    for i, label in enumerate(labels):
        seen[label] = seen.get(label, 0) + 1
        if seen[label] > 1:
            labels[i] = f"{label} #{seen[label]}"
    return labels


def _pareto_plot(plan: Plan) -> str | None:
    configs = [c for c in (plan.parallelism or {}).get("configs") or [] if c.get("fits", True)
               and c.get("tokens_per_s_per_user") is not None and c.get("tokens_per_s_per_gpu") is not None]
    if not configs:
        return None
    pts = [(float(c["tokens_per_s_per_user"]), float(c["tokens_per_s_per_gpu"]), label, bool(c.get("pareto")))
           for c, label in zip(configs, layout_labels(configs))]
    return scatter_chart(f"Parallelism layouts projected for {plan.hw}", pts, x_label="tokens/s per user",
                         y_label=f"tokens/s per GPU (projected, {plan.hw})", note=_projection_note(plan),
                         front_name="Pareto front (projected)", other_name="other layouts (projected)")


def _projection_note(plan: Plan) -> str:
    """Whose figures these are: the cost model's for ``--hw``, never a measurement of the device used."""
    note = f"cost model for {plan.hw}, not measured"
    if not (plan.detected_device or {}).get("matches_hw", True):
        note += f"; this run measured on {measured_on(plan)}, not on {plan.hw}"
    return note


def _layout_line(best: dict | None) -> str:
    if not best:
        return "none computed"
    keys = ("tp", "pp", "ep", "dp", "dcp", "moe_tp", "dtype")
    line = ", ".join(f"{k}={best[k]}" for k in keys if k in best)
    fw = best.get("framework")
    flags = ((best.get("serving") or {}).get(fw) or {}).get("flags")
    return line + (f" ({fw}: `{' '.join(flags)}`)" if flags else "")


# how a version with a parent came about (plan.run["origin"]; "" for plans written before it existed)
_ORIGIN = {"": "Follows v{v}: its optimizations were re-verified first (or their verdicts remembered).",
           "drift": "Recompiled from v{v} because traffic drifted.",
           "forced": "Recompiled from v{v} on request (`--force`; traffic had not drifted).",
           "continued": "Continues v{v}: its optimizations were re-verified first (or, on the same workload, their "
                        "verdicts remembered), then searched on from there."}


def _torch_compile_lines(tc: dict | None) -> list[str]:
    """The plan against ``torch.compile`` of the slow-tier slice (``compiler.plan.compare``), or why not."""
    if not tc:
        return []
    if tc.get("plan_vs_torch_compile") is None:
        why = (str(tc.get("error") or "no figure").strip().splitlines() or ["no figure"])[0]
        return [f"- against `torch.compile` of the same slice: not measured ({why})"]
    line = (f"- against `torch.compile` of the same slice: **{_x(tc['plan_vs_torch_compile'])}** "
            f"(plan {tc.get('plan_ms', 0):.3f} ms, {tc.get('plan_timing', 'eager')}; torch.compile "
            f"{tc.get('torch_compile_ms', 0):.3f} ms, mode {tc.get('torch_compile_mode', 'default')}; "
            f"reference eager {tc.get('reference_ms', 0):.3f} ms: {_x(tc.get('plan_vs_reference'))}; weighted over the points)")
    out = [line]
    if tc.get("weight_covered", 1.0) < 1.0:
        out.append(f"  - covers {100 * tc['weight_covered']:.1f}% of the traffic weight; left out: "
                   + "; ".join(f"{r['point'].get('phase')} b{r['point'].get('batch')} ({r['error']})"
                               for r in tc.get("points", []) if "error" in r))
    return out


def tiers_disagree(fast, slow, noise: float = 0.0) -> bool:
    """Whether the two tiers name different winners between a candidate and the reference: one measures
    it faster by more than ``noise``, the other measures it no faster (speedup <= 1)."""
    if fast is None or slow is None:
        return False
    f, s = float(fast), float(slow)
    return (f > 1 + noise and s <= 1.0) or (s > 1 + noise and f <= 1.0)


def _disagree_cell(o) -> str:
    points = [p for p in o.per_point if tiers_disagree(p.fast, p.slow)]
    if tiers_disagree(o.speedup.get("fast"), o.speedup.get("slow"), o.noise):
        return "**yes**"
    if points:
        return "at " + ", ".join(p.point.label() for p in points)
    return "no"


def _routing_lines(tiers: dict) -> list[str]:
    """Per tier: the inputs' realism and the expert load its MoE routers produced."""
    out = []
    for name in ("fast", "slow"):
        t = tiers.get(name) or {}
        inp, r = t.get("inputs"), t.get("routing")
        if inp is None and r is None:
            continue
        inp = inp or {}
        routing = inp.get("routing") or {}
        kind = routing.get("kind", "uniform")
        skew = {"power_law": f"power law {routing.get('alpha')}", "histogram":
                f"measured histogram ({routing.get('source') or 'file'})"}.get(kind, "uniform (random routers)")
        line = (f"- {name} tier: weights {inp.get('weights') or 'seeded random'}, tokens {inp.get('tokens', 'uniform')}, "
                f"MoE routing {skew}, shared prefix "
                f"{100 * float(inp.get('prefix_share') or 0):.0f}% of each batch's context")
        if r:
            top, tie = r.get("top1_share") or [0], r.get("near_tie_share") or [0]
            line += (f"; measured: hottest expert {100 * min(top):.1f}-{100 * max(top):.1f}% of assignments, "
                     f"near-tie tokens {100 * min(tie):.1f}-{100 * max(tie):.1f}% per MoE layer, median margin "
                     f"{min(r.get('margin_median') or [0]):.2f}-{max(r.get('margin_median') or [0]):.2f} x RMS")
            if kind != "uniform" and r.get("fitted_share", 1) < 1:
                line += f" ({100 * r['fitted_share']:.0f}% of the tokens fitted)"
        out.append(line)
    return out


def _config_lines(plan: Plan) -> list[str]:
    """Accepted engine/scheduler settings: their projected effect on the traffic (config_plan.py)."""
    rows = [o for o in plan.optimizations if o.projected]
    if not rows:
        return []
    L = ["### Engine and scheduler settings (projected for this traffic)", "",
         "| name | TTFT mean | TTFT p99 | TPOT mean | tokens/s | tokens per busy s | goodput tokens/s (SLO met) |",
         "|---|---|---|---|---|---|---|"]

    def cell(p: dict, key: str, unit: str) -> str:
        v = p.get(key) or {}
        return f"{v.get('before')} → {v.get('after')}{unit}" if v.get("after") is not None else "n/a"

    for o in rows:
        p = o.projected
        L.append(f"| {o.name} | {cell(p, 'ttft_mean_ms', ' ms')} | {cell(p, 'ttft_p99_ms', ' ms')} | "
                 f"{cell(p, 'tpot_mean_ms', ' ms')} | {cell(p, 'tokens_per_s', '')} | {cell(p, 'tokens_per_busy_s', '')} | "
                 + (f"{cell(p, 'goodput_tokens_per_s', '')} ({cell(p, 'slo_attained', '')}) |"
                    if p.get("goodput_tokens_per_s") else "no SLO given |"))
    modelled = rows[0].projected.get("modelled") or []
    L += ["", "Projected by replaying the traffic through the scheduler model with the step times the engine "
          "measured at the workload points; modelled: " + "; ".join(modelled) + ".", ""]
    return L


def _throughput_plot(run: dict) -> str | None:
    engines = (run.get("throughput") or {}).get("engines") or {}
    if not engines:
        return None
    names = sorted(engines)
    series = {k: [engines[n].get(f"{k}_s", 0.0) for n in names]
              for k in ("judging", "compile", "executor_wait", "other", "idle", "queue_wait")}
    return bar_chart("Search phase: where each engine's time went", names, series, unit=" s")


def _throughput_lines(run: dict, plotted: bool) -> list[str]:
    t = run.get("throughput") or {}
    if not t:
        return []
    L = ["## Search throughput", "",
         f"- candidates per device-hour of search: **{run.get('candidates_per_hour')}**",
         f"- device busy fraction (judging on the device / search wall x devices): **{run.get('device_busy_fraction')}**",
         f"- search window {t.get('window_s')} s on {t.get('devices')} device(s); "
         f"{run.get('remembered', 0)} candidate(s) not judged again (verdicts remembered from earlier runs)", ""]
    if plotted:
        L += ["![search throughput](plots/throughput.svg)", ""]
    L += ["| engine | evaluations | compiled ahead | judging s | compile s | executor wait s | other s | idle s "
          "| queue wait s |", "|---|---|---|---|---|---|---|---|---|"]
    for name, e in sorted((t.get("engines") or {}).items()):
        L.append(f"| {name} | {e['calls']} | {e.get('compiled_ahead', 0)} | {e['judging_s']} | {e['compile_s']} | "
                 f"{e.get('executor_wait_s', 0)} | {e['other_s']} | {e['idle_s']} | {e['queue_wait_s']} |")
    L.append("")
    return L


def _agent_lines(rows: list[dict]) -> list[str]:
    """Per-agent accounting of the search: candidates, acceptances, tokens and dollars (LLM agents)."""
    if not rows:
        return []
    L = ["## Agents", "", "| agent | cycles | candidates | correct | accepted | input tokens | cached | "
         "output tokens | cost | stopped |", "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        L.append(f"| {r['name']} | {r.get('cycles', 0)} | {r.get('tried', 0)} | {r.get('correct', 0)} | "
                 f"{r.get('accepted', 0)} | {r.get('input_tokens', 0)} | {r.get('cached_tokens', 0)} | "
                 f"{r.get('output_tokens', 0)} | ${float(r.get('cost_usd', 0)):.4f} | {r.get('stopped', '')} |")
    total = sum(float(r.get("cost_usd", 0)) for r in rows)
    tokens = sum(r.get("input_tokens", 0) + r.get("cached_tokens", 0) + r.get("output_tokens", 0) for r in rows)
    L += ["", f"LLM spend: {tokens} tokens, ${total:.4f}.", ""]
    return L


def render(plan: Plan) -> dict[str, str]:
    """Files for the version directory: ``report.md`` and ``plots/*.svg``."""
    files: dict[str, str] = {}
    plots = {"speedup_per_point": _speedup_plot(plan), "op_time": _op_plot(plan),
             "parallelism_pareto": _pareto_plot(plan), "throughput": _throughput_plot(plan.run)}
    for name, svg in plots.items():
        if svg:
            files[f"plots/{name}.svg"] = svg
    run = plan.run
    L = _header_lines(plan)
    L += _speedup_lines(plan, plots)
    L += _optimization_lines(plan)
    L += _variant_lines(plan)
    L += _dropped_lines((run.get("counts") or {}).get("dropped") or [])
    L += _agent_lines(run.get("agent_reports") or [])
    L += _throughput_lines(run, bool(plots.get("throughput")))
    if "op_time" in plots and plots["op_time"]:
        L += ["## Time per op", "", "Per-op time of the fast tier's slice in the traffic's mean step: each workload "
              "point holds its weight in the table above of the GPU time (`compiler.plan.op_time`).", "",
              "![time per op](plots/op_time.svg)", ""]
    L += _parallelism_lines(plan, plots)
    L += _use_lines(plan)
    files["report.md"] = "\n".join(L)
    return files


def _header_lines(plan: Plan) -> list[str]:
    """Title, origin, the run's table and the tier inputs."""
    run = plan.run
    dev = plan.detected_device
    L = [f"# tkcc plan v{plan.version}: {plan.model} {hw_words(plan)}", ""]
    if plan.parent_version is not None:
        L += [_ORIGIN.get(run.get("origin", ""), _ORIGIN[""]).format(v=plan.parent_version), ""]
    if run.get("interrupted"):
        L += ["**This run was interrupted**; the plan holds what was accepted before the stop.", ""]
    L += ["| | |", "|---|---|",
          f"| model | `{plan.model}` |",
          f"| target hardware (cost model) | `{plan.hw}` |",
          f"| measured on | {dev.get('name', dev.get('kind', '?'))} (`{dev.get('kind', '?')}`)"
          + ("" if dev.get("matches_hw", True) else f" — differs from the target: every timing is from this device, "
             f"only the cost model's figures are for {plan.hw}") + " |",
          f"| traffic | `{plan.traffic.get('source', '?')}` (hash `{str(plan.traffic.get('hash', ''))[:12]}`) |",
          f"| budget / elapsed | {run.get('wall_s') or run.get('budget_s', '?')} s / {run.get('elapsed_s', '?')} s |",
          *([f"| time per phase | {_phase_shares(run['phases_s'])} |"] if run.get("phases_s") else []),
          f"| candidates | {_counts_cell(run, len(plan.optimizations))} |",
          f"| engine restarts | {run.get('restarts', 0)} |",
          f"| tiers | fast layers {plan.tiers.get('fast', {}).get('layers', '?')}, "
          f"slow layers {plan.tiers.get('slow', {}).get('layers', '?')} |",
          "| software | " + ", ".join(f"{k} {v}" for k, v in sorted(plan.software.items())) + " |", ""]
    routing = _routing_lines(plan.tiers)
    if routing:
        L += ["## Tier inputs", "", *routing,
              "- sparse attention (DSA, MiniMax-M3 where the model has it) selects its tokens with the model's own "
              "indexer, inside the forward pass, on these same activations", ""]
    return L


def _speedup_lines(plan: Plan, plots: dict) -> list[str]:
    dev = plan.detected_device
    L: list[str] = []
    ps = plan.plan_speedup
    L += ["## Plan speedup (all accepted optimizations composed, re-verified and re-measured)", "",
          f"- fast tier: **{_x(ps.get('fast'))}**", f"- slow tier: **{_x(ps.get('slow'))}**",
          f"- measured against: {ps.get('baseline') or 'tkcc eager reference ops (a plan written before issue 39)'}",
          f"- measured on: {measured_on(plan)}" + ("" if dev.get("matches_hw", True) else f" (not on the target {plan.hw})")]
    if ps.get("pdl"):
        L.append(f"- programmatic dependent launch: {ps['pdl']}")
    L += _torch_compile_lines(plan.baseline.get("torch_compile"))
    L.append("")
    if "speedup_per_point" in plots and plots["speedup_per_point"]:
        L += ["![speedup per workload point](plots/speedup_per_point.svg)", ""]
    rows = ps.get("per_point") or []
    if rows:
        L += ["| workload point | weight | fast | slow |", "|---|---|---|---|"]
        L += [f"| {point_label(r)} | {100 * float(r.get('weight', 0)):.1f}% | "
              f"{_x(r.get('fast'))} | {_x(r.get('slow'))} |" for r in rows]
        L.append("")

    return L


def _optimization_lines(plan: Plan) -> list[str]:
    L: list[str] = []
    L += ["## Optimizations in the plan (the accepted ones kept by the composition)", ""]
    if plan.optimizations:
        L += ["| name | targets | fast | slow | tiers disagree | noise | author | kernel |",
              "|---|---|---|---|---|---|---|---|"]
        for o in plan.optimizations:
            L.append(f"| {o.name} | {', '.join(o.targets) or '-'} | {_x(o.speedup.get('fast'))} | "
                     f"{_x(o.speedup.get('slow'))} | {_disagree_cell(o)} | ±{100 * o.noise:.1f}% | {o.author or '-'} | "
                     f"[{o.kernel}]({o.kernel}) |")
        L += ["", "*tiers disagree*: one tier measures the optimization faster than the reference (beyond the noise), "
              "the other no faster — the fast tier's balanced random inputs and the slow tier's realistic ones name "
              "different winners (per workload point where only some points disagree)."]
        L.append("")
        for o in plan.optimizations:
            if o.description:
                L += [f"- **{o.name}**: {o.description}"]
        L.append("")
        L += _config_lines(plan)
    else:
        L += ["No candidate beat the reference by more than the measured noise on both tiers; the plan "
              "is the reference forward pass.", ""]

    return L


def _variant_lines(plan: Plan) -> list[str]:
    """The per-bucket variants (``compiler.plan.buckets``): which decode batch sizes run which subset."""
    if not plan.variants:
        return []
    from compiler.plan.buckets import UNBOUNDED, speedup_at

    L = ["## Variants per decode batch size", "", "Where members of the plan ran slower than the reference, the set "
         "without them was verified and measured on both tiers and serves these decode batch sizes "
         "(`tkcc serve --plan` captures their CUDA graphs with it); prefills and other sizes run the plan.", "",
         "| decode batches | optimizations kept | speedup at its points | kernel |", "|---|---|---|---|"]
    for v in plan.bucket_variants("plan.json"):
        sizes = f"{v.lo}+" if v.hi >= UNBOUNDED else f"{v.lo}-{v.hi}"
        at = [speedup_at(p) for p in v.per_point if p.point.phase == "decode" and v.lo <= p.point.batch <= v.hi]
        L.append(f"| {sizes} | {', '.join(v.members) or 'none (the reference)'} | "
                 f"{', '.join(_x(x) for x in at) or '-'} | [{v.kernel}]({v.kernel}) |")
    return L + [""]


def _parallelism_lines(plan: Plan, plots: dict) -> list[str]:
    L: list[str] = []
    L += [f"## Parallelism (projected by the cost model for {plan.hw})", "",
          f"Chosen layout: {_layout_line((plan.parallelism or {}).get('best'))}."]
    proj = {k: v for k, v in (plan.projected or {}).items() if k != "label" and not isinstance(v, (dict, list))}
    if proj:
        L.append(f"Projected full-model figures for {plan.hw} ({_projection_note(plan)}): "
                 + ", ".join(f"{k} {v}" for k, v in sorted(proj.items())) + ".")
    L.append("")
    if "parallelism_pareto" in plots and plots["parallelism_pareto"]:
        L += ["![parallelism Pareto front](plots/parallelism_pareto.svg)", ""]
    return L


def _use_lines(plan: Plan) -> list[str]:
    L: list[str] = []
    L += ["## Use it", "", "```", f"tkcc plan apply --plan <this directory> --model {plan.model}", "```", "",
          "```python", "from compiler.plan.apply import load_plan_overrides", "from persistent_engine.ops import registry",
          "overrides, config = load_plan_overrides('<this directory>')",
          "with registry.override(overrides):", "    logits = model.step(workload)", "```", ""]
    return L


def _phase_shares(phases: dict) -> str:
    """``starting 14 s (12%), baseline 20 s (17%), ...``: where the run's wall time went."""
    total = sum(phases.values()) or 1.0
    return ", ".join(f"{k} {v:.0f} s ({100 * v / total:.0f}%)" for k, v in phases.items())


def _counts_cell(run: dict, n_kept: int) -> str:
    """The run's tally (``run.counts``, compiler/search/tally.py) in one cell; older plans: tried / kept."""
    c = run.get("counts")
    if not c:
        return f"tried {run.get('tried', '?')}, kept {n_kept}"
    return (f"tried {c['tried']}, correct {c['correct']}, fast-pass {c['fast_passed']}, accepted {c['accepted']}, "
            f"kept {c['kept']}, dropped {len(c.get('dropped') or [])}")


def _dropped_lines(dropped: list[dict]) -> list[str]:
    """Accepted but not in the plan, each with why (at most 20 listed, the rest counted)."""
    if not dropped:
        return []
    L = ["## Accepted, not kept", "", "| name | why |", "|---|---|"]
    L += [f"| {d['name']} | {d['why']} |" for d in dropped[:20]]
    if len(dropped) > 20:
        L.append(f"| +{len(dropped) - 20} more | (plan.json `run.counts.dropped`) |")
    return L + [""]
