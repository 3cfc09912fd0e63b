"""The continuous-batching scheduler policy: ONE definition, run by the trace replay
(``traffic_profiles.workload.replay``) and by the serving engine (``persistent_engine.serving``), so
the replay predicts what the server does.

Pure Python (stdlib only): the serving engine never imports this module (``persistent_engine`` imports
no sibling package); ``compiler.serve`` builds a ``Scheduler`` here and hands it to the engine, which
only relies on the methods below (its ``SchedulerLike`` protocol).

Policy (vLLM v1 style), one step at a time:
  1. every running sequence past its prompt decodes one token (each costs one token of budget);
  2. the rest of ``max_num_batched_tokens`` goes to prompt chunks (chunked prefill, one chunk at most
     ``max_chunk_tokens``), first to sequences already prefilling, in admission order;
  3. then waiting requests are admitted FCFS while budget remains, fewer than ``max_num_seqs`` run
     and the KV policy reserves room for them (prompt + every output token, so nothing is ever
     preempted); a request that can never fit is rejected once nothing else runs.
A sequence's first output token comes out of its last prompt chunk. At admission the KV policy
reports how many prompt tokens are already cached (prefix caching); at least one prompt token is
always computed.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Protocol, Sequence

__all__ = ["SchedulerConfig", "Seq", "StepPlan", "KVPolicy", "TokenBudget", "Scheduler"]


@dataclass(frozen=True)
class SchedulerConfig:
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 8192
    max_chunk_tokens: int | None = None     # chunked-prefill size: one prompt chunk at most this (None: budget)
    kv_capacity_tokens: int | None = None   # None: unbounded
    prefix_caching: bool = True
    time_scale: float = 1.0                 # replay only: divide inter-arrival times by this
    max_points: int = 16                    # replay only: workload points kept


@dataclass(eq=False)
class Seq:
    """The scheduler's view of one request (mutable; identity is the object)."""

    rid: Any                    # the caller's key (trace row, request id)
    prompt_len: int
    max_new: int                # output tokens it may produce
    arrival: float = 0.0
    computed: int = 0           # tokens whose KV is in the cache (the context)
    prefill_left: int = 0       # prompt tokens still to compute
    out_left: int = 0           # output tokens still to produce
    reserved: int = 0           # KV tokens reserved at admission

    @property
    def decoding(self) -> bool:
        return self.prefill_left == 0


@dataclass(frozen=True)
class StepPlan:
    """What one step runs: ``decodes`` (one token each) and prompt ``chunks`` ((seq, tokens) each)."""

    decodes: tuple[Seq, ...] = ()
    chunks: tuple[tuple[Seq, int], ...] = ()
    rejected: tuple[Seq, ...] = ()          # requests dropped this step: they can never fit

    @property
    def num_tokens(self) -> int:
        return len(self.decodes) + sum(c for _, c in self.chunks)


class KVPolicy(Protocol):
    """Reserves KV room for a sequence at admission. ``admit`` returns "ok" (room reserved, and
    ``seq.computed`` set to the prompt tokens already cached, at most ``prompt_len - 1``), "wait" (no
    room now) or "never" (larger than the whole cache); ``release`` frees what ``admit`` reserved."""

    def admit(self, seq: Seq) -> str: ...

    def release(self, seq: Seq) -> None: ...


class TokenBudget:
    """The replay's KV policy: a token counter against ``capacity`` (None: unbounded), prompt hits
    from ``hits[rid]`` (tokens of the prompt found in the prefix cache)."""

    def __init__(self, capacity: int | None, hits: Sequence[int] | None = None):
        self.capacity, self.hits, self.used = capacity, hits, 0

    def admit(self, seq: Seq) -> str:
        need = seq.prompt_len + seq.max_new
        if self.capacity is not None and self.used + need > self.capacity:
            return "never" if need > self.capacity else "wait"
        self.used += need
        seq.reserved = need
        hit = int(self.hits[seq.rid]) if self.hits is not None else 0
        seq.computed = min(hit, max(seq.prompt_len - 1, 0))
        return "ok"

    def release(self, seq: Seq) -> None:
        self.used -= seq.reserved
        seq.reserved = 0


@dataclass
class Scheduler:
    """FCFS continuous batching with chunked prefill (the policy of the module doc)."""

    cfg: SchedulerConfig
    kv: KVPolicy
    waiting: deque = field(default_factory=deque)
    running: list = field(default_factory=list)

    def add(self, seq: Seq) -> None:
        self.waiting.append(seq)

    def submit(self, rid: Any, prompt_len: int, max_new: int, arrival: float = 0.0) -> Seq:
        """Queues a new request and returns its sequence (the serving engine's entry point)."""
        seq = Seq(rid, prompt_len, max_new, arrival)
        self.add(seq)
        return seq

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def schedule(self) -> StepPlan:
        """The next step's plan; admits waiting requests (their KV reserved) as the policy allows."""
        budget = self.cfg.max_num_batched_tokens
        decodes = tuple(s for s in self.running if s.decoding)
        budget -= len(decodes)
        chunks: list[tuple[Seq, int]] = []
        cap = self.cfg.max_chunk_tokens or budget
        for s in self.running:
            if not s.decoding and budget > 0:
                c = min(s.prefill_left, budget, cap)
                chunks.append((s, c))
                budget -= c
        rejected: list[Seq] = []
        while self.waiting and budget > 0 and len(self.running) < self.cfg.max_num_seqs:
            s = self.waiting[0]
            verdict = self.kv.admit(s)
            if verdict != "ok":
                if verdict == "never" and not self.running:      # can never fit: dropped
                    rejected.append(self.waiting.popleft())
                    continue
                break
            self.waiting.popleft()
            s.prefill_left, s.out_left = s.prompt_len - s.computed, s.max_new
            self.running.append(s)
            c = min(s.prefill_left, budget, cap)
            chunks.append((s, c))
            budget -= c
        return StepPlan(decodes, tuple(chunks), tuple(rejected))

    def advance(self, plan: StepPlan, decode_steps: int = 1) -> tuple[list[Seq], list[Seq]]:
        """Books a step (or ``decode_steps`` identical pure-decode steps) as done: contexts grow, prompt
        chunks are consumed, output tokens counted. Returns (sequences whose first token came out this
        step, sequences that finished, removed and their KV released)."""
        if decode_steps != 1 and plan.chunks:
            raise ValueError("only a pure-decode plan can be advanced by several steps")
        first: list[Seq] = []
        for s, c in plan.chunks:
            s.computed += c
            s.prefill_left -= c
            if s.prefill_left == 0:             # the last chunk emits the first token
                s.out_left -= 1
                first.append(s)
        for s in plan.decodes:
            s.computed += decode_steps
            s.out_left -= decode_steps
        done = [s for s in self.running if s.decoding and s.out_left <= 0]
        for s in done:
            self.finish(s)
        return first, done

    def finish(self, seq: Seq) -> None:
        """Removes a sequence early or on completion (EOS, stop string, client gone) and frees its KV."""
        if seq in self.running:
            self.running.remove(seq)
            self.kv.release(seq)
        elif seq in self.waiting:
            self.waiting.remove(seq)
