"""The tools an LLM agent may call, and the toolbox that runs them against the run's context.

Reading: read_profile (measured ms per op), read_roofline (per op and workload point: FLOPs, bytes,
roofline vs measured, from the cost model), read_hardware, read_op (signature and reference source),
read_templates (the template library; one template rendered as a complete candidate: a worked
example), read_board (ideas and recent posts of every agent), read_thread (one idea's posts),
read_candidates (any agent's candidates with their verdict: accepted, correct, rejected, crashed),
read_candidate (one candidate's source, its evaluations with reasons and measurements, its parent
and children). Writing: post_idea (free text, or structured as "template X with knobs Y at point Z"
so that the offline template searchers can work it), submit_candidate (a source, optionally the
child of a ``parent`` candidate it modifies).

A toolbox lives for one cycle: it holds the claimed idea (``lease``) and the verdicts of that cycle.
Every result is compact JSON of at most :data:`RESULT_CHARS` characters (about 3,000 tokens; a longer
one is cut and says so), a candidate's source at most :data:`SOURCE_CHARS` of it; a failing tool
returns an error result, never raises.
"""

from __future__ import annotations

import json
import logging
from typing import Any

from agents.base import AgentContext, Lease, _id_of, verdict_summary
from agents.llm import context
from agents.llm.messages import ToolCall, ToolResult, ToolSpec
from agents.prompts import op_costs, to_json
from bulletin_board import BoardAPI, candidate_id

log = logging.getLogger("tkcc.agents.llm")

RESULT_CHARS = 24000        # bound of every tool result (characters of JSON)
SOURCE_CHARS = 16000        # bound of one candidate or template source (rendered GEMV templates: ~12.6k)
VERDICTS = ("any", "accepted", "correct", "rejected", "crashed")


def _obj(props: dict | None = None, required: tuple[str, ...] = ()) -> dict:
    return {"type": "object", "properties": props or {}, "required": list(required)}


_S, _I = {"type": "string"}, {"type": "integer"}

TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec("read_profile", "Where the baseline forward pass spends its time: milliseconds per op "
             "(weighted over the workload points), the raw per-point profile, and the points.", _obj()),
    ToolSpec("read_roofline", "Per workload point and op: FLOPs, bytes, arithmetic intensity, the roofline "
             "time (what a perfect kernel would take on this hardware) against the measured time, the "
             "fraction achieved and whether it is memory or compute bound. Optional op filter.",
             _obj({"op": _S})),
    ToolSpec("read_hardware", "The device the timings come from: bandwidth, peak FLOP/s per dtype, "
             "ridge point, kernel launch overhead.", _obj()),
    ToolSpec("read_op", "The reference implementation of one op: its signature and its plain "
             "PyTorch source. Your override must match the signature exactly.",
             _obj({"name": {"type": "string", "description": "op name"}}, ("name",))),
    ToolSpec("read_templates", "Without name: the kernel template library (name, op, backend, knobs). "
             "With name: that template rendered as a complete candidate (optionally with knobs), a worked "
             "example of a kernel the engine accepts.", _obj({"name": _S, "knobs": {"type": "object"}})),
    ToolSpec("read_board", "Ideas on the board (id, status, target, title, author) and recent posts of "
             "every agent (verdicts, results, what they learned).", _obj({"limit": _I})),
    ToolSpec("read_thread", "One idea and every post on it.", _obj({"idea": _I}, ("idea",))),
    ToolSpec("read_candidates", "Candidates of this run by any agent with their verdict and speedup; "
             "verdict filter: any, accepted, correct, rejected, crashed.",
             _obj({"verdict": _S, "author": _S, "limit": _I})),
    ToolSpec("read_candidate", "One candidate: its source, author, parent and children, and every "
             "evaluation with its verdict, reasons and measurements (per workload point).",
             _obj({"id": _S}, ("id",))),
    ToolSpec("post_idea", "Post one concrete optimisation idea for an op. Free text (title, body), or "
             "structured for the template searchers: give template and knobs (and optionally the workload "
             "point it is for); they then render and measure it. Ideas already on the board (same title "
             "and target) are refused. A free-text idea is then yours to implement.",
             _obj({"title": _S, "body": _S, "target": {"type": "string", "description": "op name"},
                   "template": _S, "knobs": {"type": "object"}, "point": {"type": "object"}},
                  ("title", "body", "target"))),
    ToolSpec("submit_candidate", "Submit a candidate (the complete Python source with OVERRIDES) for "
             "verification and timing; give parent (a candidate id) when it modifies that candidate. "
             "Returns the verdict: correct, reasons, speedup, and the candidate id.",
             _obj({"source": _S, "parent": _S}, ("source",))),
)


def _items(page: Any) -> list:
    """Rows of a board ``Page`` (or of a plain list)."""
    return list(getattr(page, "items", page))


def _row(obj: Any, keys: tuple[str, ...]) -> dict:
    if isinstance(obj, dict):
        return {k: obj.get(k) for k in keys if k in obj}
    return {k: getattr(obj, k) for k in keys if hasattr(obj, k)}


def _cut(text: str, n: int = SOURCE_CHARS) -> str:
    return text if len(text) <= n else text[:n] + f"\n# ... [cut at {n} of {len(text)} chars]"


def structured(idea: Any) -> bool:
    """An idea in the offline searchers' format (JSON body of kind template or config): theirs to work."""
    try:
        doc = json.loads(getattr(idea, "body", "") or "")
    except ValueError:
        return False
    return isinstance(doc, dict) and doc.get("kind") in ("template", "config")


def claim_free_text(ctx: AgentContext, agent: str) -> Lease | None:
    """Claim the open idea of highest priority unless it is a structured one (released again: the
    template searchers render it without spending tokens)."""
    lease = ctx.claim(agent)
    if lease is not None and structured(lease.idea):
        lease.release()
        return None
    return lease


def accepted_ids(board: BoardAPI, run: Any) -> set[str]:
    """Ids of the run's candidates that went into a plan (optimization rows)."""
    return {o.candidate_id for o in _items(board.list_optimizations(run=run, limit=1000))}


def candidate_verdict(board: BoardAPI, cand: Any, evals: list | None = None,
                      accepted: set[str] | None = None) -> dict:
    """``{"verdict": accepted|correct|rejected|crashed|unjudged, "speedup", "reasons"}`` of a candidate
    from its evaluations (accepted: the compiler accepted it, or it went into a plan)."""
    evals = evals if evals is not None else _items(board.list_evaluations(candidate=cand.id, sort="id", limit=20))
    if not evals:
        return {"verdict": "unjudged", "speedup": None, "reasons": []}
    metrics = [e.metrics or {} for e in evals]
    accepted = accepted if accepted is not None else accepted_ids(board, cand.run_id)
    if any(m.get("restarted") for m in metrics):
        verdict = "crashed"
    elif cand.id in accepted or any(m.get("accepted") for m in metrics):
        verdict = "accepted"
    else:
        verdict = "correct" if any(e.verdict == "correct" for e in evals) else "rejected"
    speedups = [e.speedup for e in evals if e.speedup is not None]
    reasons = [r for e in evals for r in (e.reasons or [])]
    return {"verdict": verdict, "speedup": max(speedups) if speedups else None, "reasons": reasons[:6]}


class ToolBox:
    """Runs one agent's tool calls for one cycle."""

    def __init__(self, ctx: AgentContext, agent: str, lease: Lease | None, *,
                 max_submissions: int = 3, result_chars: int = RESULT_CHARS):
        self.ctx, self.agent, self.lease = ctx, agent, lease
        self.max_submissions = max_submissions
        self.result_chars = result_chars
        self.verdicts: list[dict] = []
        self.ideas_posted: list[Any] = []

    @property
    def idea_id(self) -> Any:
        return None if self.lease is None else self.lease.idea_id

    def run(self, call: ToolCall) -> ToolResult:
        if call.error is not None or call.arguments is None:
            return ToolResult(call.id, f"malformed tool call: {call.error}", is_error=True)
        try:
            out = getattr(self, "_" + call.name)(**call.arguments)
            return ToolResult(call.id, to_json(out, self.result_chars))
        except (ValueError, KeyError, LookupError) as exc:
            return ToolResult(call.id, f"{type(exc).__name__}: {exc}", is_error=True)
        except Exception as exc:  # noqa: BLE001 - a tool failure goes back to the model
            log.warning("tool %s of %s failed: %s", call.name, self.agent, exc)
            return ToolResult(call.id, f"tool failed: {type(exc).__name__}: {exc}", is_error=True)

    # -- reading -------------------------------------------------------------------------------
    def _read_profile(self) -> dict:
        return {"ms_per_op": op_costs(self.ctx.profile), "profile": self.ctx.profile,
                "points": [p.to_dict() for p in self.ctx.points]}

    def _read_roofline(self, op: str | None = None) -> dict:
        return context.roofline(self.ctx.spec, self.ctx.hw, self.ctx.points, self.ctx.profile,
                                list(self.ctx.ops), op=op)

    def _read_hardware(self) -> dict:
        return context.hardware(self.ctx.hw)

    def _read_op(self, name: str) -> dict:
        info = self.ctx.ops.get(name)
        if info is None:
            raise KeyError(f"no op {name!r}; ops are {sorted(self.ctx.ops)}")
        return {"name": info.name, "signature": info.signature, "reference_source": info.source}

    def _read_templates(self, name: str | None = None, knobs: dict | None = None) -> Any:
        if name is None:
            device = "cpu" if (self.ctx.hw or "cpu") == "cpu" else "cuda"
            return {"device": device, "templates": context.template_index(device)}
        out = context.template_source(name, knobs)
        out["source"] = _cut(out["source"])
        return out

    def _read_board(self, limit: int = 30) -> dict:
        board, run = self.ctx.board, self.ctx.run_id
        n = max(1, min(int(limit), 100))
        ideas = _items(board.list_ideas(run, sort="-id", limit=n))
        posts = _items(board.list_posts(run, sort="-id", limit=n))
        return {"ideas": [_row(i, ("id", "status", "target", "title", "author", "body")) for i in ideas],
                "posts": [_row(p, ("author", "idea_id", "kind", "body")) for p in posts]}

    def _read_thread(self, idea: int) -> dict:
        found, posts = self.ctx.board.thread(int(idea), limit=100)
        return {"idea": _row(found, ("id", "status", "target", "title", "author", "body", "claimed_by")),
                "posts": [_row(p, ("author", "kind", "body")) for p in posts]}

    def _read_candidates(self, verdict: str = "any", author: str | None = None, limit: int = 20) -> dict:
        if verdict not in VERDICTS:
            raise ValueError(f"verdict must be one of {', '.join(VERDICTS)}")
        board = self.ctx.board
        cands = _items(board.list_candidates(self.ctx.run_id, author=author, sort="-date", limit=200))
        accepted = accepted_ids(board, self.ctx.run_id)
        out = []
        for c in cands:
            v = candidate_verdict(board, c, accepted=accepted)
            if verdict != "any" and v["verdict"] != verdict:
                continue
            out.append({"id": c.id, "author": c.author, "author_kind": c.author_kind, "parent": c.parent_id,
                        "idea": c.idea_id, "description": _description(c.source), **v,
                        "reasons": [r[:200] for r in v["reasons"][:2]]})
            if len(out) >= max(1, min(int(limit), 50)):
                break
        return {"candidates": out}

    def _read_candidate(self, id: str) -> dict:  # noqa: A002 - the tool's argument name
        board = self.ctx.board
        cand = board.get_candidate(id)
        if cand is None or cand.run_id != _id_of(self.ctx.run_id):
            raise KeyError(f"no candidate {id!r} in this run (read_candidates lists them)")
        evals = _items(board.list_evaluations(candidate=cand.id, sort="id", limit=20))
        children = _items(board.list_candidates(self.ctx.run_id, parent=cand.id, limit=20))
        return {"id": cand.id, "author": cand.author, "author_kind": cand.author_kind, "idea": cand.idea_id,
                "parent": cand.parent_id, "children": [{"id": k.id, "author": k.author} for k in children],
                **candidate_verdict(board, cand, evals),
                "evaluations": [{"tier": e.tier, "verdict": e.verdict, "speedup": e.speedup,
                                 "reasons": [r[:300] for r in (e.reasons or [])[:8]],
                                 "slow_speedup": (e.metrics or {}).get("slow_speedup"),
                                 "decision": (e.metrics or {}).get("decision"),
                                 "per_point": (e.metrics or {}).get("per_point")} for e in evals],
                "source": _cut(cand.source)}

    # -- writing -------------------------------------------------------------------------------
    def _post_idea(self, title: str, body: str, target: str, template: str | None = None,
                   knobs: dict | None = None, point: dict | None = None) -> dict:
        if target not in self.ctx.ops:
            raise ValueError(f"target {target!r} is not an op; ops are {sorted(self.ctx.ops)}")
        if self.ctx.already_tried(title, target):
            raise ValueError(f"an idea {title!r} on {target} is already on the board; pick another")
        if template is not None:
            return self._post_template_idea(title, body, target, template, knobs or {}, point)
        # above the template searchers' ideas (priority <= 1), so that its author claims it next
        idea = self.ctx.board.post_idea(self.ctx.run_id, author=self.agent, title=title,
                                        body=body, target=target, tags=["llm"], priority=2.0)
        self.ideas_posted.append(idea)
        out: dict = {"posted": _id_of(idea)}
        if self.lease is None:
            self.lease = claim_free_text(self.ctx, self.agent)
            held = None if self.lease is None else self.lease.idea
            out["holding"] = None if held is None else _row(held, ("id", "target", "title", "body"))
        return out

    def _post_template_idea(self, title: str, body: str, target: str, template: str, knobs: dict,
                            point: dict | None) -> dict:
        """An idea in the offline searchers' format (``agents.offline.worker``): they claim and work it."""
        from agents.templates import get_template

        t = get_template(template)
        if t.op != target:
            raise ValueError(f"template {template} is for {t.op}, not {target}")
        chosen = {**t.default(), **knobs}
        bad = t.check(chosen, {})
        if bad:
            raise ValueError("invalid knobs: " + "; ".join(bad))
        doc = {"kind": "template", "template": t.name, "op": t.op, "knobs": chosen, "why": body,
               "point": point}
        idea = self.ctx.board.post_idea(self.ctx.run_id, author=self.agent, title=title, body=json.dumps(doc),
                                        target=target, tags=["template", t.backend, "llm"], priority=1.0)
        self.ideas_posted.append(idea)
        return {"posted": _id_of(idea), "for": "the template searchers render and measure it; "
                                              "read_thread on it later for the result"}

    def _submit_candidate(self, source: str, parent: str | None = None) -> dict:
        if len(self.verdicts) >= self.max_submissions:
            raise ValueError(f"at most {self.max_submissions} submissions per idea; end your turn")
        if parent is not None:
            found = self.ctx.board.get_candidate(parent)
            if found is None or found.run_id != _id_of(self.ctx.run_id):
                raise KeyError(f"no candidate {parent!r} in this run to build on")
        verdict = self.ctx.evaluate(source, author=self.agent, idea_id=self.idea_id, parent=parent)
        summary = verdict_summary(verdict)
        summary["candidate"] = candidate_id(_id_of(self.ctx.run_id), source)
        self.verdicts.append(summary)
        sp = summary["speedup"]
        line = ("correct" if summary["correct"] else "rejected") + \
            ("" if sp is None else f", speedup {sp:.3f}x") + \
            ("" if parent is None else f", child of {parent[:12]}") + \
            ("" if summary["correct"] else ": " + "; ".join(summary["reasons"])[:800])
        self.ctx.post(self.agent, f"verdict: {line}", idea=self.idea_id, kind="verdict")
        return summary


def _description(source: str) -> str:
    """The candidate's DESCRIPTION (or first docstring line), for listings."""
    import ast

    try:
        tree = ast.parse(source)
    except SyntaxError:
        return ""
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(getattr(t, "id", "") == "DESCRIPTION" for t in node.targets) \
                and isinstance(node.value, ast.Constant):
            return str(node.value.value)[:200]
    doc = ast.get_docstring(tree)
    return (doc or "").strip().splitlines()[0][:200] if doc else ""
