"""Fill a board with a realistic compile history through the public Board API: deployments, runs
with baseline profiles, ideas with threads and claims, candidates (Triton/torch sources),
evaluations with per-point timings, accepted optimizations and drift events.

Used by the UI's tests, its benchmark (``benchmarks/ui.py``: 10,000 evaluations, 1,000 ideas) and
its screenshots, wherever a board from a real ``tkcc optimize`` run is not at hand or not big
enough. Deterministic for a given ``seed``. ``hostile`` puts ``<script>alert(1)</script>``-style
text in an idea title, an author, a post and a code body, as an LLM agent might.

Cost: one Board transaction per record (about 1-2 ms each on SQLite).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from bulletin_board import Board
from persistent_engine import POINT_FIELDS

OPS = ("rms_norm", "fused_add_rms_norm", "silu_and_mul", "linear", "rotary_embedding",
       "attention_decode", "attention_prefill", "embedding", "lm_head")
OP_SHARE = {"linear": 0.55, "attention_decode": 0.14, "attention_prefill": 0.06, "rms_norm": 0.05,
            "fused_add_rms_norm": 0.06, "silu_and_mul": 0.05, "rotary_embedding": 0.04,
            "embedding": 0.01, "lm_head": 0.04}
POINTS = ({"phase": "decode", "batch": 1, "context": 512, "chunk": 1, "weight": 0.2},
          {"phase": "decode", "batch": 8, "context": 1024, "chunk": 1, "weight": 0.45},
          {"phase": "decode", "batch": 32, "context": 2048, "chunk": 1, "weight": 0.2},
          {"phase": "prefill", "batch": 1, "context": 0, "chunk": 512, "weight": 0.15})
HOSTILE = "<script>alert(1)</script>"

SOURCE = '''"""{title}"""
import torch
import triton
import triton.language as tl

DESCRIPTION = "{title}"


@triton.jit
def _{op}_kernel(X, W, Y, stride, N, eps, BLOCK: tl.constexpr):
    row = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    mask = cols < N
    x = tl.load(X + row * stride + cols, mask=mask, other=0.0).to(tl.float32)
    var = tl.sum(x * x, axis=0) / N          # one pass, fp32 accumulation
    w = tl.load(W + cols, mask=mask)
    y = x * tl.rsqrt(var + eps) * w
    tl.store(Y + row * stride + cols, y.to(Y.dtype.element_ty), mask=mask)


def {op}(x, weight, eps):
    x2 = x.reshape(-1, x.shape[-1])
    y = torch.empty_like(x2)
    _{op}_kernel[(x2.shape[0],)](x2, weight, y, x2.stride(0), x2.shape[-1], eps,
                                 BLOCK={block}, num_warps={warps})
    return y.view_as(x)


OVERRIDES = {{"{op}": {op}}}
CONFIG = {{"cuda_graph_batch_sizes": [1, 8, 32]}}
'''


@dataclass(frozen=True)
class SampleSpec:
    """What to put on the board: ``runs`` runs over ``deployments`` deployments; in total about
    ``ideas`` ideas and ``evaluations`` evaluations (spread over the runs)."""

    deployments: int = 2
    runs: int = 3
    ideas: int = 40
    evaluations: int = 80
    drift_events: int = 3
    hostile: bool = False
    running: bool = True                # leave the newest run "running" (live progress)
    seed: int = 0
    agents: tuple[str, ...] = ("kernel-search-0", "kernel-search-1", "config-search-0", "claude-1")


@dataclass
class SampleBoard:
    """The ids of what :func:`fill_board` wrote."""

    deployments: list[int] = field(default_factory=list)
    runs: list[int] = field(default_factory=list)
    ideas: list[int] = field(default_factory=list)
    optimizations: list[int] = field(default_factory=list)
    hostile_idea: int | None = None
    hostile_optimization: int | None = None


def _baseline(rng: random.Random, scale: float) -> dict:
    rows = []
    for p in POINTS:
        step = scale * (0.4 + 0.02 * p["batch"] + p["context"] / 4096 + p["chunk"] / 256)
        ops = {op: {"ms": round(step * share * rng.uniform(0.85, 1.15), 5), "calls": 8,
                    "share": share} for op, share in OP_SHARE.items()
               if not (op == "attention_prefill" and p["phase"] == "decode")
               and not (op == "attention_decode" and p["phase"] == "prefill")}
        rows.append({"point": dict(p), "label": "", "step_ms": round(sum(o["ms"] for o in ops.values()), 5),
                     "total_ms": round(sum(o["ms"] for o in ops.values()), 5), "ops": ops})
    return {"per_point": rows, "timer": "perf_counter_ns+sync per op"}


def _per_point(rng: random.Random, overall: float, baseline: dict) -> list[dict]:
    out = []
    for row in baseline["per_point"]:
        s = max(0.9, overall * rng.uniform(0.93, 1.07))
        base = row["step_ms"]
        out.append({"point": dict(row["point"]), "label": "", "affected": True,
                    "baseline_ms": round(base, 5), "baseline_iqr_ms": round(base * 0.02, 5),
                    "candidate_ms": round(base / s, 5), "candidate_iqr_ms": round(base / s * 0.02, 5),
                    "speedup": round(s, 4)})
    return out


def fill_board(board: Board, spec: SampleSpec = SampleSpec()) -> SampleBoard:
    """Write ``spec``'s history onto ``board`` (a read-write Board) and return the ids."""
    rng = random.Random(spec.seed)
    out = SampleBoard()
    targets = [("tiny-dense", "cpu"), ("llama-8b", "h200"), ("qwen3-moe", "b200"), ("glm", "b200")]
    deployments = [board.deployment(m, h, f"{rng.getrandbits(64):016x}", name=f"{m} on {h}")
                   for m, h in targets[:max(1, spec.deployments)]]
    out.deployments = [d.id for d in deployments]
    per_run_ideas = max(1, spec.ideas // max(spec.runs, 1))
    per_run_evals = max(1, spec.evaluations // max(spec.runs, 1))
    for r in range(spec.runs):
        dep = deployments[r % len(deployments)]
        run = board.create_run(dep.model, dep.hw, dep.traffic_hash,
                               config={"budget_s": 600, "agents": "offline:4", "device": dep.hw})
        out.runs.append(run.id)
        baseline = _baseline(rng, 1.0 if dep.hw == "cpu" else 0.05)
        board.set_baseline(run, baseline)
        ideas = _post_ideas(board, spec, rng, out, run, r, per_run_ideas)
        out.ideas += [i.id for i in ideas]
        for k, idea in enumerate(ideas[:max(1, len(ideas) // 2)]):       # work half of the ideas
            claimed = board.claim_idea(run, agent=idea.author, lease_s=300)
            if claimed is not None and k % 5 != 4:
                board.finish_idea(claimed, agent=idea.author, status="failed" if k % 3 == 2 else "done")
        _add_candidates(board, spec, rng, out, run, dep, r, ideas, baseline, per_run_evals)
        last = r == spec.runs - 1
        board.update_run(run, status="running" if last and spec.running else "done",
                         message="searching" if last and spec.running else "done",
                         config={**run.config, "agent_reports": _agent_reports(spec, per_run_evals)})
    _add_drift_events(board, spec, rng, out, deployments)
    return out


def _post_ideas(board: Board, spec: SampleSpec, rng: random.Random, out: SampleBoard, run, r: int, n: int) -> list:
    """``n`` ideas of run number ``r`` (the hostile one first in run 0), a comment on every fourth."""
    ideas = []
    for i in range(n):
        op = OPS[i % 4] if i % 3 else rng.choice(OPS)
        author = rng.choice(spec.agents)
        title = f"{op}: triton BLOCK={2 ** (6 + i % 6)} num_warps={2 ** (i % 4)} v{i}"
        if spec.hostile and r == 0 and i == 0:
            title, author = f"fuse {HOSTILE} into rms_norm", f"agent {HOSTILE}"
        idea = board.post_idea(run, author=author, title=title, target=op, tags=["triton"],
                               body=f"Replace the reference {op} with a one-pass Triton kernel; "
                                    f"expected gain on decode points where it takes "
                                    f"{100 * OP_SHARE[op]:.0f}% of the step.",
                               priority=round(rng.random(), 3))
        ideas.append(idea)
        if spec.hostile and r == 0 and i == 0:
            out.hostile_idea = idea.id
            board.post(run, author=author, idea=idea, body=f"measured on the fast tier {HOSTILE}")
        elif i % 4 == 0:
            board.post(run, author=rng.choice(spec.agents), idea=idea, kind="result",
                       body=f"fast tier: {rng.uniform(0.9, 1.3):.3f}x, correct on all points")
    return ideas


def _add_candidates(board: Board, spec: SampleSpec, rng: random.Random, out: SampleBoard, run, dep, r: int,
                    ideas: list, baseline: dict, n: int) -> None:
    """``n`` candidates of the run's ideas with their fast-tier verdicts; the winners also on the slow tier and
    as optimizations."""
    prev = None
    for e in range(n):
        idea = ideas[e % len(ideas)]
        op = idea.target or "rms_norm"
        hostile = spec.hostile and r == 0 and e == 0
        title = f"{op} {HOSTILE} kernel" if hostile else f"{op} triton kernel {e}"
        source = SOURCE.format(title=title, op=op, block=2 ** (6 + e % 6), warps=2 ** (e % 4))
        if hostile:
            source += f"\n# </code></pre>{HOSTILE}\nNOTE = '{HOSTILE}'\n"
        # every third candidate modifies the one before it (lineage: who built on whom)
        cid = board.add_candidate(run, author=idea.author, source=source, idea=idea,
                                  parent=prev if e % 3 == 2 else None,
                                  author_kind="llm" if idea.author.startswith("claude") else "program")
        prev = cid
        correct = rng.random() > 0.3
        s = round(rng.uniform(0.85, 1.45), 4) if correct else None
        if hostile:
            correct, s = True, 1.18
        board.add_evaluation(cid, tier="fast", point=None,
                             metrics={"speedup": s, "per_point": _per_point(rng, s, baseline) if s else []},
                             verdict="correct" if correct else "rejected",
                             reasons=[] if correct else [f"op {op}: max abs error 3.1e-01 > atol 1.6e-02 at shape [8, 2048]"],
                             device="cpu" if dep.hw == "cpu" else "NVIDIA H200",
                             timing_method="engine A/B, perf_counter_ns medians")
        accept = (s is not None and s > 1.1) or hostile
        if accept:
            slow = round((s or 1.2) * rng.uniform(0.95, 1.02), 4)
            board.add_evaluation(cid, tier="slow", point=None,
                                 metrics={"speedup": slow, "per_point": _per_point(rng, slow, baseline)},
                                 verdict="correct", device="cpu" if dep.hw == "cpu" else "NVIDIA H200",
                                 timing_method="engine A/B, perf_counter_ns medians")
            per_point = [{**{k: p[k] for k in (*POINT_FIELDS, "weight")},
                          "fast": round((s or 1.2) * rng.uniform(0.95, 1.05), 4),
                          "slow": round(slow * rng.uniform(0.95, 1.05), 4)} for p in POINTS]
            opt = board.add_optimization(run, cid, name=f"{op}_triton_r{run.id}_{e}", targets=[op],
                                         speedups={"fast": s or 1.2, "slow": slow}, per_point=per_point,
                                         status="retired" if e % 7 == 6 else "active")
            out.optimizations.append(opt.id)
            if hostile:
                out.hostile_optimization = opt.id
            board.record_progress(run, tried=1, accepted=1, speedup=slow)
        else:
            board.record_progress(run, tried=1)


def _agent_reports(spec: SampleSpec, per_run_evals: int) -> list[dict]:
    return [{"name": a, "cycles": 3, "tried": per_run_evals // len(spec.agents), "correct": 1, "accepted": 0,
             "failures": 0, "input_tokens": 41_000 if a.startswith("claude") else 0,
             "cached_tokens": 120_000 if a.startswith("claude") else 0,
             "output_tokens": 9_000 if a.startswith("claude") else 0,
             "cost_usd": 0.294 if a.startswith("claude") else 0.0,
             "requests": 12 if a.startswith("claude") else 0, "stopped": "deadline"} for a in spec.agents]


def _add_drift_events(board: Board, spec: SampleSpec, rng: random.Random, out: SampleBoard, deployments: list) -> None:
    for k in range(spec.drift_events):
        dep = deployments[k % len(deployments)]
        drifted = k % 2 == 0
        feats = []
        for n, t in (("input_tokens", 0.1), ("output_tokens", 0.1), ("requests_per_s", 0.25),
                     ("interarrival_cv", 0.3), ("prefix_cache_hit_rate", 0.1)):
            stat = round(t * (rng.uniform(1.5, 3.0) if drifted and n == "input_tokens" else rng.uniform(0.1, 0.9)), 4)
            feats.append({"name": n, "statistic": stat, "threshold": t, "drifted": stat > t})
        board.add_drift_event(dep, drifted, feats, run=out.runs[-1] if drifted else None,
                              old_hash=dep.traffic_hash, new_hash=f"{rng.getrandbits(64):016x}")
