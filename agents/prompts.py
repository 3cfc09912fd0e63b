"""Prompts for LLM agents, built from the engine's profile, the workload points, the op registry and
the board. Also the profile digest (``op_costs``) the offline agents can use to steer to the costliest
ops. Plain strings, no templates: every number an agent sees comes from the run."""

from __future__ import annotations

import json
from typing import Any, Iterable, Mapping, Sequence

from persistent_engine import WorkloadPoint

from agents.base import AgentContext

SYSTEM = """\
You are a GPU kernel engineer on tkcc, a compiler that searches for faster LLM forward passes.
You write *candidates*: one self-contained Python source file that the engine loads as a fresh
module. It must define
  OVERRIDES: dict[str, Callable]  # op name -> implementation with exactly the reference signature
and may define CONFIG (engine knobs: cuda_graph_batch_sizes, max_num_seqs, max_num_batched_tokens,
kv_block_size) and DESCRIPTION (one line). Rules:
- import only torch, triton, triton.language and math; no file, process or network access;
- match the reference op's signature, output shape, dtype and device; return new tensors and never
  modify an input; be deterministic; no global state changes;
- every candidate is verified against the reference on fresh random inputs (outputs poisoned with
  NaN first, higher-precision comparison, per-dtype tolerances) and timed by the engine against the
  reference, interleaved; only correct candidates that are faster beyond noise are accepted.
Work with the tools: read_roofline (per op and workload point: FLOPs, bytes, the roofline time
against the measured one: how far each op is from what the hardware allows), read_profile,
read_hardware, read_op (signature and reference source), read_templates (the kernel template library;
one rendered as a complete, accepted-format candidate), read_board and read_thread (ideas, verdicts and
what the other agents learned), read_candidates and read_candidate (any agent's candidate: its source,
verdict, reasons and measurements), post_idea (one concrete, untried idea; structured with template and
knobs when the template searchers should measure it), submit_candidate (the full source; give parent
when you modify another candidate, e.g. an accepted one found by the offline search).
Read what the others posted before choosing. Post one idea, implement it, submit it, fix it if it is
rejected, then end your turn with one or two sentences on what you learned (that text is posted to the
board for the other agents).
"""


def op_costs(profile: Mapping[str, Any]) -> dict[str, float]:
    """Total milliseconds per op, weighted by workload points when the profile has them.

    Accepts ``{"per_point": [{"point": {...,"weight"}, "ops": {name: {"ms": x} | x}}]}`` (the engine's
    profile reply), ``{name: {"ms": x}}`` or ``{name: x}``.
    """
    totals: dict[str, float] = {}

    def add(ops: Mapping[str, Any], w: float) -> None:
        for name, v in ops.items():
            ms = v.get("ms", v.get("time_ms")) if isinstance(v, Mapping) else v
            if isinstance(ms, (int, float)) and not isinstance(ms, bool):
                totals[name] = totals.get(name, 0.0) + w * float(ms)

    per_point = profile.get("per_point") if isinstance(profile, Mapping) else None
    if isinstance(per_point, list):
        for entry in per_point:
            if isinstance(entry, Mapping) and isinstance(entry.get("ops"), Mapping):
                w = (entry.get("point") or {}).get("weight", 1.0)
                add(entry["ops"], float(w) if isinstance(w, (int, float)) else 1.0)
    elif isinstance(profile, Mapping):
        add(profile, 1.0)
    return dict(sorted(totals.items(), key=lambda kv: -kv[1]))


def _profile_lines(profile: Mapping[str, Any], n: int = 8) -> list[str]:
    costs = op_costs(profile)
    total = sum(costs.values()) or 1.0
    return [f"  {name:<22} {ms:9.4f} ms  {100 * ms / total:5.1f}%"
            for name, ms in list(costs.items())[:n]]


def _profile_timing(profile: Mapping[str, Any]) -> str:
    """How the profile's op times were taken: a graph replay's kernels per op (what a candidate can win) or
    each op between two syncs (on a GPU inflated by a launch and a sync per call)."""
    timer = profile.get("timer", "") if isinstance(profile, Mapping) else ""
    return ("each op's kernels in a CUDA-graph replay of the step, the gaps before them included"
            if "graph" in str(timer) else "each op timed between two syncs")


def _point_lines(points: Sequence[WorkloadPoint]) -> list[str]:
    return [f"  {p.phase} batch={p.batch} context={p.context} chunk={p.chunk} weight={p.weight:.3f}"
            for p in points]


def board_digest(ideas: Iterable[Any], limit: int = 20) -> list[str]:
    """One line per idea: id, status, target, title, author."""
    lines = []
    for idea in list(ideas)[:limit]:
        get = idea.get if isinstance(idea, Mapping) else (lambda k, i=idea: getattr(i, k, None))
        lines.append(f"  #{get('id')} [{get('status')}] {get('target') or '-'}: {get('title')} "
                     f"(by {get('author')})")
    return lines


def posts_digest(posts: Iterable[Any], limit: int = 12, chars: int = 240) -> list[str]:
    """One line per recent post (author, kind, idea, the start of its body), newest first."""
    lines = []
    for p in list(posts)[:limit]:
        get = p.get if isinstance(p, Mapping) else (lambda k, i=p: getattr(i, k, None))
        body = " ".join(str(get("body") or "").split())
        body = body if len(body) <= chars else body[:chars] + "..."
        idea = get("idea_id")
        lines.append(f"  {get('author')} [{get('kind')}]" + (f" on #{idea}" if idea else "") + f": {body}")
    return lines


def _op_lines(ops: Mapping[str, Any], costs: Mapping[str, float]) -> list[str]:
    """The signatures of the ops this model's forward runs (all when there is no profile): the whole
    catalog's are ~25,000 characters (~11,000 tokens), most of them of ops of other architectures (MLA,
    MoE, DSA), whose overrides this model would never call."""
    used = [info for name, info in ops.items() if name in costs] if costs else list(ops.values())
    rest = len(ops) - len(used)
    return [f"  {info.signature}" for info in used] + \
        ([f"  ({rest} more ops in the registry are not run by this model)"] if rest else [])


def cycle_prompt(ctx: AgentContext, *, ideas: Iterable[Any] = (), held: Any = None,
                 posts: Iterable[Any] = ()) -> str:
    """The first user message of a cycle: where the time goes, the points, the ops, the board and
    what the other agents posted last."""
    spec = ctx.spec
    parts = [f"Model: {getattr(spec, 'name', spec)}; {len(ctx.points)} workload points; "
             f"{max(ctx.time_left(), 0):.0f} s left in this run.",
             f"Where the time goes (baseline, {_profile_timing(ctx.profile)}, weighted over the workload points):",
             *(_profile_lines(ctx.profile) or ["  (no profile yet)"]),
             "Workload points:", *_point_lines(ctx.points),
             "Ops you may override (read_op gives the reference source):",
             *_op_lines(ctx.ops, op_costs(ctx.profile)),
             "Ideas on the board:", *(board_digest(ideas) or ["  (none yet)"]),
             "Latest posts (read_candidate gives any candidate's source and verdict):",
             *(posts_digest(posts) or ["  (none yet)"])]
    if held is not None:
        get = held.get if isinstance(held, Mapping) else (lambda k: getattr(held, k, None))
        parts.append(f"You hold idea #{get('id')} (target {get('target')}): {get('title')}\n"
                     f"{get('body') or ''}\nImplement it and submit_candidate.")
    else:
        parts.append("No open idea is waiting: post_idea one that is not on the board yet, then "
                     "implement it and submit_candidate.")
    return "\n".join(parts)


def to_json(obj: Any, limit: int = 12000) -> str:
    """Compact JSON for a tool result, cut at ``limit`` characters (bounds the tokens it costs)."""
    text = json.dumps(obj, default=str, separators=(",", ":"))
    return text if len(text) <= limit else text[:limit] + f"... [cut at {limit} of {len(text)} chars]"
