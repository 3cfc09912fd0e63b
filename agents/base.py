"""The agent protocol: what every agent (offline search, LLM) implements and what it is given.

Contract (docs/internals.md, "Agents"; tests/agents/test_agent_contract.py runs it against every agent):

- An :class:`Agent` has a unique ``name`` and one method, ``run_once(ctx) -> bool``: one cycle of
  work. It returns ``False`` when it has nothing left to try (the swarm then stops running it) and
  ``True`` otherwise. A cycle typically is:

  1. read where the time goes (``ctx.profile``), the workload points (``ctx.points``), the op
     registry (``ctx.ops``) and the board (``ctx.board``, run ``ctx.run_id``);
  2. post ideas (``board.post_idea``), skipping ones already tried (``ctx.already_tried``);
  3. claim one (``ctx.claim(self.name)`` -> :class:`Lease`, atomic; the lease is heartbeated in the
     background until the ``with`` block ends);
  4. write a candidate (one Python source file: ``OVERRIDES``, optional ``CONFIG``/``DESCRIPTION``);
  5. submit it: ``verdict = ctx.evaluate(source, author=self.name, idea_id=lease.idea_id)``, with
     ``parent=<candidate id>`` when it modifies another candidate (lineage on the board); the swarm
     adds ``author_kind=self.kind`` ("llm" for LLM-written code, so a sandbox policy can apply);
  6. post the verdict and what it learned (``ctx.post(self.name, text, idea=lease.idea_id)``).

- Failures are posted to the board (``ctx.post_failure``) and never raised into the swarm. If
  ``run_once`` raises anyway, the swarm catches it, posts it and carries on with the next cycle.
- An agent stops at ``ctx.deadline`` (a ``time.monotonic()`` value) or when ``ctx.stop`` is set;
  long cycles should check ``ctx.expired()`` between steps.
- ``usage()`` reports tokens and dollars spent (zero for offline agents); the swarm sums it.

``ctx.evaluate(source, *, author, idea_id=None, parent=None, author_kind="")`` returns a ``CandidateVerdict`` (``persistent_engine``'s supervisor): ``correct``
(bool), ``reasons`` (one string per failed check), ``speedup`` (candidate over reference, float or
None when not timed), ``per_point`` (list of dicts), ``timings`` (dict), ``restarted`` (bool: the
candidate crashed or hung the engine). :func:`verdict_summary` turns one into a JSON-able dict.
"""

from __future__ import annotations

import abc
import dataclasses
import inspect
import logging
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping, Sequence

from persistent_engine import WorkloadPoint

if TYPE_CHECKING:  # torch-free (and SQLAlchemy-free) at import time
    from bulletin_board import BoardAPI
    from persistent_engine.models.spec import ModelSpec

log = logging.getLogger("tkcc.agents")

# evaluate(source, *, author, idea_id) -> CandidateVerdict
Evaluate = Callable[..., Any]


@dataclass(frozen=True)
class Usage:
    """Tokens and dollars one agent spent; ``a + b`` sums two."""

    input_tokens: int = 0
    output_tokens: int = 0
    cost_usd: float = 0.0
    requests: int = 0
    cached_tokens: int = 0          # input tokens served from (or written to) the prompt cache

    @property
    def tokens(self) -> int:
        return self.input_tokens + self.cached_tokens + self.output_tokens

    def __add__(self, other: "Usage") -> "Usage":
        return Usage(self.input_tokens + other.input_tokens, self.output_tokens + other.output_tokens,
                     self.cost_usd + other.cost_usd, self.requests + other.requests,
                     self.cached_tokens + other.cached_tokens)

    def to_dict(self) -> dict:
        return {"input_tokens": self.input_tokens, "output_tokens": self.output_tokens,
                "cached_tokens": self.cached_tokens, "cost_usd": round(self.cost_usd, 6),
                "requests": self.requests}


@dataclass(frozen=True)
class OpInfo:
    """One registry op as an agent sees it: its documented signature and reference source."""

    name: str
    signature: str
    source: str


def op_catalog(names: Sequence[str] | None = None) -> dict[str, OpInfo]:
    """``{name: OpInfo}`` from ``persistent_engine.ops.registry`` (imports torch; call once per run)."""
    from persistent_engine.ops import registry

    out: dict[str, OpInfo] = {}
    for name in names if names is not None else registry.names():
        op = registry.get(name)
        out[name] = OpInfo(name=name, signature=op.signature, source=_source_with_helpers(op.reference))
    return out


def _source_with_helpers(fn: Callable) -> str:
    """The source of ``fn`` preceded by that of the module-level helpers it calls (one level)."""
    try:
        parts = [inspect.getsource(fn)]
    except (OSError, TypeError):
        return f"# source of {getattr(fn, '__name__', fn)} unavailable"
    module = inspect.getmodule(fn)
    for ref in getattr(getattr(fn, "__code__", None), "co_names", ()):
        helper = getattr(module, ref, None)
        if inspect.isfunction(helper) and helper.__module__ == fn.__module__ and helper is not fn:
            try:
                parts.insert(0, inspect.getsource(helper))
            except (OSError, TypeError):
                continue
    return "\n\n".join(parts)


def verdict_summary(verdict: Any) -> dict:
    """JSON-able summary of a CandidateVerdict (any object with its fields)."""
    speedup = getattr(verdict, "speedup", None)
    return {
        "correct": bool(getattr(verdict, "correct", False)),
        "reasons": [str(r) for r in (getattr(verdict, "reasons", None) or [])],
        "speedup": None if speedup is None else float(speedup),
        "restarted": bool(getattr(verdict, "restarted", False)),
    }


def is_faster(verdict: Any, threshold: float = 1.0) -> bool:
    """A verdict counts as faster when it is correct and its speedup exceeds ``threshold``."""
    s = verdict_summary(verdict)
    return s["correct"] and s["speedup"] is not None and s["speedup"] > threshold


def _id_of(obj: Any) -> Any:
    """The board hands back rows or ids; accept either."""
    return getattr(obj, "id", obj)


class Lease:
    """A claimed idea, heartbeated every ``lease_s / 3`` seconds on a background thread.

    ``with ctx.claim(name) as lease:`` finishes the idea "done" on a normal exit and "failed" when
    the block raises (the exception propagates); call ``lease.finish(status)`` to choose yourself.
    """

    def __init__(self, board: BoardAPI, idea: Any, agent: str, lease_s: float):
        self.board, self.idea, self.agent = board, idea, agent
        self.idea_id = _id_of(idea)
        self._stop = threading.Event()
        self._finished = False
        self.heartbeats = 0
        self.lost = False
        self._thread = threading.Thread(target=self._beat, args=(max(lease_s / 3.0, 0.05),),
                                        name=f"lease-{agent}", daemon=True)
        self._thread.start()

    def _beat(self, every_s: float) -> None:
        while not self._stop.wait(every_s):
            try:
                if not self.board.heartbeat(self.idea, agent=self.agent):
                    self.lost = True      # the lease lapsed and another agent took the idea
                    log.warning("%s lost its claim on idea %s", self.agent, self.idea_id)
                    return
                self.heartbeats += 1
            except Exception as exc:  # noqa: BLE001 - a lost heartbeat must not kill the agent
                log.warning("heartbeat of %s by %s failed: %s", self.idea_id, self.agent, exc)

    def finish(self, status: str = "done") -> None:
        """Stop heartbeating and mark the idea ``status`` ("done" or "failed"); idempotent."""
        if self._finished:
            return
        self._finished = True
        self._stop.set()
        self._thread.join(timeout=5)
        self.board.finish_idea(self.idea, agent=self.agent, status=status)

    def release(self) -> None:
        """Stop heartbeating and give the idea back to the pool unfinished (another kind of agent
        should work it); idempotent."""
        if self._finished:
            return
        self._finished = True
        self._stop.set()
        self._thread.join(timeout=5)
        self.board.release_idea(self.idea, agent=self.agent)

    def __enter__(self) -> "Lease":
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        self.finish("failed" if exc_type is not None else "done")


@dataclass(frozen=True)
class AgentContext:
    """Everything an agent is given. The swarm hands each agent its own copy (``dataclasses.replace``)
    with ``evaluate`` wrapped to count verdicts and ``deadline`` clipped to the swarm's budget."""

    board: BoardAPI                            # bulletin_board.Board on SQLite or PostgreSQL
    run_id: Any                                # the run (row or id) on that board
    evaluate: Evaluate                         # (source, *, author, idea_id) -> CandidateVerdict
    profile: Mapping[str, Any]                 # per-op baseline time (see Supervisor.profile())
    points: Sequence[WorkloadPoint]            # the run's workload points
    spec: "ModelSpec | None"                   # the model
    ops: Mapping[str, OpInfo]                  # registry names -> signature and reference source
    deadline: float                            # time.monotonic() at which agents stop
    lease_s: float = 300.0
    hw: str | None = None                      # cost_model hardware of the timings (roofline tools)
    stop: threading.Event = field(default_factory=threading.Event, compare=False)

    def replace(self, **changes: Any) -> "AgentContext":
        return dataclasses.replace(self, **changes)

    def time_left(self) -> float:
        return self.deadline - time.monotonic()

    def expired(self) -> bool:
        return self.stop.is_set() or time.monotonic() >= self.deadline

    def claim(self, agent: str, target: str | None = None) -> Lease | None:
        """Atomically claim an open idea of this run (``target``: only ideas with that target); None when
        nothing is open."""
        kw = {} if target is None else {"target": target}
        idea = self.board.claim_idea(self.run_id, agent=agent, lease_s=self.lease_s, **kw)
        return None if idea is None else Lease(self.board, idea, agent, self.lease_s)

    def already_tried(self, title: str, target: str | None) -> bool:
        """True when an idea with this title and target exists on the run (so no idea is worked twice)."""
        return bool(self.board.idea_exists(self.run_id, title=title, target=target))

    def post(self, author: str, body: str, *, idea: Any = None, kind: str = "note") -> None:
        """A message on an idea's thread (``idea``) or on the run. Kinds in use: "note", "verdict",
        "learned" (what a cycle taught), "failure", "result" (offline agents, JSON), "stopped" (an LLM
        agent's budget is spent)."""
        self.board.post(self.run_id, author=author, body=body,
                        idea=None if idea is None else _id_of(idea), kind=kind)

    def post_failure(self, author: str, what: str, exc: BaseException | None = None, *,
                     idea: Any = None) -> None:
        """Post a failure (never raises: a board that is down only gets logged)."""
        body = what if exc is None else f"{what}: {type(exc).__name__}: {exc}"
        if exc is not None:
            tail = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__)[-3:])
            body += "\n" + tail[-1500:]
        try:
            self.post(author, body, idea=idea, kind="failure")
        except Exception as post_exc:  # noqa: BLE001
            log.error("could not post failure of %s (%s): %s", author, what, post_exc)


class Agent(abc.ABC):
    """One searcher of the swarm. See the module docstring for the full contract. ``kind`` says what
    writes its candidates ("program" for hand-written search code, "llm" for a language model)."""

    kind: str = "program"

    def __init__(self, name: str):
        if not name or not isinstance(name, str):
            raise ValueError("an agent needs a non-empty name")
        self.name = name

    @abc.abstractmethod
    def run_once(self, ctx: AgentContext) -> bool:
        """One cycle (ideas, claim, candidate, evaluate, post). False: nothing left to try."""

    def usage(self) -> Usage:
        """Tokens and dollars spent so far (offline agents spend none)."""
        return Usage()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"
