"""The tools an LLM agent may call, and the toolbox that runs them against the run's context.

read_profile, read_op, read_board, post_idea, submit_candidate, read_results. A toolbox lives for
one cycle: it holds the claimed idea (``lease``) and the verdicts of that cycle. Tool results are
compact JSON cut to a bounded size; a failing tool returns an error result, never raises.
"""

from __future__ import annotations

import logging
from typing import Any

from agents.base import AgentContext, Lease, _id_of, verdict_summary
from agents.llm.messages import ToolCall, ToolResult, ToolSpec
from agents.prompts import op_costs, to_json

log = logging.getLogger("tkcc.agents.llm")

TOOLS: tuple[ToolSpec, ...] = (
    ToolSpec("read_profile", "Where the baseline forward pass spends its time: milliseconds per op "
             "(weighted over the workload points), the raw per-point profile, and the points.",
             {"type": "object", "properties": {}, "required": []}),
    ToolSpec("read_op", "The reference implementation of one op: its signature and its plain "
             "PyTorch source. Your override must match the signature exactly.",
             {"type": "object", "properties": {"name": {"type": "string", "description": "op name"}},
              "required": ["name"]}),
    ToolSpec("read_board", "Ideas on the board (id, status, target, title, author) and recent posts.",
             {"type": "object", "properties": {"limit": {"type": "integer"}}, "required": []}),
    ToolSpec("post_idea", "Post one concrete optimisation idea for an op. Ideas already on the "
             "board (same title and target) are refused. You then hold an idea to implement.",
             {"type": "object", "properties": {
                 "title": {"type": "string"}, "body": {"type": "string"},
                 "target": {"type": "string", "description": "op name the idea targets"}},
              "required": ["title", "body", "target"]}),
    ToolSpec("submit_candidate", "Submit a candidate (the complete Python source with OVERRIDES) "
             "for verification and timing. Returns the verdict: correct, reasons, speedup.",
             {"type": "object", "properties": {"source": {"type": "string"}}, "required": ["source"]}),
    ToolSpec("read_results", "Recent evaluations on this run (candidates, verdicts, speedups).",
             {"type": "object", "properties": {"limit": {"type": "integer"}}, "required": []}),
)


def _items(page: Any) -> list:
    """Rows of a board ``Page`` (or of a plain list)."""
    return list(getattr(page, "items", page))


def _row(obj: Any, keys: tuple[str, ...]) -> dict:
    if isinstance(obj, dict):
        return {k: obj.get(k) for k in keys if k in obj}
    return {k: getattr(obj, k) for k in keys if hasattr(obj, k)}


class ToolBox:
    """Runs one agent's tool calls for one cycle."""

    def __init__(self, ctx: AgentContext, agent: str, lease: Lease | None, *,
                 max_submissions: int = 3, result_chars: int = 12000):
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

    # -- the tools ---------------------------------------------------------------------------
    def _read_profile(self) -> dict:
        return {"ms_per_op": op_costs(self.ctx.profile), "profile": self.ctx.profile,
                "points": list(self.ctx.points)}

    def _read_op(self, name: str) -> dict:
        info = self.ctx.ops.get(name)
        if info is None:
            raise KeyError(f"no op {name!r}; ops are {sorted(self.ctx.ops)}")
        return {"name": info.name, "signature": info.signature, "reference_source": info.source}

    def _read_board(self, limit: int = 30) -> dict:
        board, run = self.ctx.board, self.ctx.run_id
        n = max(1, min(int(limit), 100))
        ideas = _items(board.list_ideas(run, sort="-id", limit=n))
        posts = _items(board.list_posts(run, sort="-id", limit=n))
        return {"ideas": [_row(i, ("id", "status", "target", "title", "author", "body"))
                          for i in ideas],
                "posts": [_row(p, ("author", "idea_id", "kind", "body")) for p in posts]}

    def _post_idea(self, title: str, body: str, target: str) -> dict:
        if target not in self.ctx.ops:
            raise ValueError(f"target {target!r} is not an op; ops are {sorted(self.ctx.ops)}")
        if self.ctx.already_tried(title, target):
            raise ValueError(f"an idea {title!r} on {target} is already on the board; pick another")
        idea = self.ctx.board.post_idea(self.ctx.run_id, author=self.agent, title=title,
                                        body=body, target=target)
        self.ideas_posted.append(idea)
        out: dict = {"posted": _id_of(idea)}
        if self.lease is None:
            self.lease = self.ctx.claim(self.agent)
            held = None if self.lease is None else self.lease.idea
            out["holding"] = None if held is None else _row(held, ("id", "target", "title", "body"))
        return out

    def _submit_candidate(self, source: str) -> dict:
        if len(self.verdicts) >= self.max_submissions:
            raise ValueError(f"at most {self.max_submissions} submissions per idea; end your turn")
        verdict = self.ctx.evaluate(source, author=self.agent, idea_id=self.idea_id)
        summary = verdict_summary(verdict)
        self.verdicts.append(summary)
        sp = summary["speedup"]
        line = ("correct" if summary["correct"] else "rejected") + \
            ("" if sp is None else f", speedup {sp:.3f}x") + \
            ("" if summary["correct"] else ": " + "; ".join(summary["reasons"])[:800])
        self.ctx.post(self.agent, f"verdict: {line}", idea=self.idea_id, kind="verdict")
        return summary

    def _read_results(self, limit: int = 20) -> dict:
        n = max(1, min(int(limit), 100))
        evals = _items(self.ctx.board.list_evaluations(self.ctx.run_id, sort="-id", limit=n))
        return {"evaluations": [_row(e, ("candidate_id", "tier", "verdict", "speedup", "reasons"))
                                for e in evals],
                "this_cycle": self.verdicts}
