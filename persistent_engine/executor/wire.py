"""Typed messages across the judge <-> executor wall (as ``io_struct`` between the judge and its supervisor).

One request class and one reply class per kind; on the wire a message is the map of its fields plus ``op``
(its kind) and ``nonce``. The judge draws a fresh random nonce for every request (``Executor.send``); the
reply must carry the same nonce and be of the request's reply class, or ``Failed`` (the candidate raised):
anything else is the executor's failure (``ExecutorProtocolError``; the judge discards that executor). The executor
is as untrusted as the candidate, so a reply is decoded field by field against its class's annotations:
a field of another type, an unknown field, a tensor whose ``data`` is not bytes of exactly its size, a
mailbox reference outside the box are refused before anything is allocated; every string (candidate text:
exception messages, thread names, its stderr) is cut to an escaped excerpt (``excerpt``: control characters
escaped, at most ``TEXT_CHARS``), every list of strings to ``TEXT_ITEMS`` entries. Requests come from the
judge: the executor decodes them the same way, without the excerpts.

    request     reply       what the executor does (worker.py)
    Load        Loaded      import the candidate, its guards checked
    Warm        Warmed      compile ahead: each override at its op cases, one step per point
    OpChecks    OpResults   ``contract.run_candidate`` per case of one op
    Steps       StepResults one step per (point, variant) with every override counted
    Capture     Captured    compiled steps (compiled mode) and CUDA graphs of points
    TimedRun    Ran         k chained timed steps, each output into the judge's ring (``out_ring.py``)
    Guards      GuardsReply its own guards' reasons
    Memory      MemoryReply its caching allocator's bytes
    Exit        (none)      the executor leaves
    (start-up)  Ready       sent once, echoing the nonce of the judge's init map

Stdlib + msgpack; torch only through ``channel`` (tensors).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar

from persistent_engine.executor.channel import Mailbox, ExecutorProtocolError, decode_tensors, unpack_tensor

TEXT_CHARS = 600                       # a string of a reply: at most this many characters, escaped
TEXT_ITEMS = 128                       # a list of strings of a reply: at most this many entries


class Tensor:
    """Annotation: a tensor on the wire (packed inline or a mailbox reference); decoded, a ``torch.Tensor``."""


def excerpt(text: Any, limit: int = TEXT_CHARS) -> str:
    """``text`` as one line of at most ``limit`` characters: every character that is not printable escaped
    (``\\n``, ``\\x1b``, ``\\u202e``: no terminal escape, line break or reordering reaches a log, the board
    or the UI), the end cut with the length of the whole."""
    s = str(text)
    line = "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in s[:limit])
    if len(line) > limit or len(s) > limit:
        return line[:limit] + f"... ({len(s)} chars)"
    return line


# ------------------------------------------------------------------------------ requests
@dataclass(frozen=True)
class ExecutorRequest:
    KIND: ClassVar[str] = ""
    nonce: int = 0


@dataclass(frozen=True)
class Load(ExecutorRequest):
    KIND: ClassVar[str] = "load"
    source: str = ""
    name: str = "candidate"


@dataclass(frozen=True)
class Warm(ExecutorRequest):
    KIND: ClassVar[str] = "warm"
    seed: int = 0
    budget: int | None = None           # bytes one op case may hold (None: no limit)
    ops_at: list[list[str]] = field(default_factory=list)      # per point: the ops its step calls


@dataclass(frozen=True)
class OpCase:
    shape: dict = field(default_factory=dict)
    dtype: str = "float32"
    seed: int = 0


@dataclass(frozen=True)
class OpChecks(ExecutorRequest):
    KIND: ClassVar[str] = "op_checks"
    name: str = ""
    cases: list[OpCase] = field(default_factory=list)


@dataclass(frozen=True)
class StepAsk:
    i: int = 0
    v: int = 0
    moe: bool = False                   # replay the reference's routing / picks (``refs``)
    refs: list | None = None            # ``routes.calls_to_wire`` of the reference's record
    check_cache: bool = False


@dataclass(frozen=True)
class Steps(ExecutorRequest):
    KIND: ClassVar[str] = "steps"
    steps: list[StepAsk] = field(default_factory=list)


@dataclass(frozen=True)
class Capture(ExecutorRequest):
    KIND: ClassVar[str] = "capture"
    points: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class Precompile(ExecutorRequest):
    """A trusted compile (``compile_cache.py``): the timed step of ``points`` compiled with the reference
    functions of ``ops`` as opaque calls, the graphs a candidate overriding exactly ``ops`` needs. Sent only
    to an executor that never loaded a candidate, which is killed after it (its caches are then copied)."""
    KIND: ClassVar[str] = "precompile"
    ops: list[str] = field(default_factory=list)
    points: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class TimedRun(ExecutorRequest):
    KIND: ClassVar[str] = "run"
    i: int = 0
    v: int = 0
    k: int = 1
    ids: Tensor | None = None           # [k, T] token ids drawn by the judge (None: the variant's own)
    eager: bool = False
    chain: int | None = None            # the vocabulary size of the chain (None: unchained)
    shape: list[int] = field(default_factory=list)     # one run's output, as the judge's ring slot holds it
    dtype: str = "float32"


@dataclass(frozen=True)
class Guards(ExecutorRequest):
    KIND: ClassVar[str] = "guards"
    when: str = "check"


@dataclass(frozen=True)
class Memory(ExecutorRequest):
    KIND: ClassVar[str] = "memory"


@dataclass(frozen=True)
class Exit(ExecutorRequest):
    KIND: ClassVar[str] = "exit"


# ------------------------------------------------------------------------------ replies
@dataclass(frozen=True)
class ExecutorReply:
    KIND: ClassVar[str] = ""
    nonce: int = 0


@dataclass(frozen=True)
class Ready(ExecutorReply):
    KIND: ClassVar[str] = "ready"
    pid: int = 0


@dataclass(frozen=True)
class Failed(ExecutorReply):
    """The request raised in the executor: ``kind`` "candidate", "oom" or "device"."""
    KIND: ClassVar[str] = "failed"
    error: str = ""
    kind: str = "candidate"


@dataclass(frozen=True)
class Loaded(ExecutorReply):
    KIND: ClassVar[str] = "loaded"
    reasons: list[str] = field(default_factory=list)
    ops: list[str] = field(default_factory=list)
    config: dict = field(default_factory=dict)
    description: str = ""


@dataclass(frozen=True)
class Warmed(ExecutorReply):
    KIND: ClassVar[str] = "warmed"
    cases: int = 0
    steps: int = 0
    failed: int = 0
    skipped: int = 0


@dataclass(frozen=True)
class CaseResult:
    outputs: list[Tensor | None] = field(default_factory=list)     # the first run's outputs
    devices: list[str] = field(default_factory=list)
    reason: str = ""                                                # run_candidate's reason ("" when it ran)


@dataclass(frozen=True)
class OpResults(ExecutorReply):
    KIND: ClassVar[str] = "op_results"
    results: list[CaseResult] = field(default_factory=list)


@dataclass(frozen=True)
class Routes:
    calls: list | None = None           # ``routes.calls_to_wire`` of the candidate's step
    replayed: bool = False


@dataclass(frozen=True)
class StepResult:
    logits: Tensor | None = None
    type: str = ""                      # the step's output type (when it is no tensor)
    calls: dict[str, int] = field(default_factory=dict)
    routes: Routes | None = None
    cache: list[str] = field(default_factory=list)   # pools with rows changed beyond the new tokens'


@dataclass(frozen=True)
class StepResults(ExecutorReply):
    KIND: ClassVar[str] = "step_results"
    results: list[StepResult] = field(default_factory=list)


@dataclass(frozen=True)
class Captured(ExecutorReply):
    KIND: ClassVar[str] = "captured"
    graphed: list[int] = field(default_factory=list)
    errors: dict[str, str] = field(default_factory=dict)
    healthy: bool = True
    uncompiled: dict[str, str] = field(default_factory=dict)    # compiled mode: points run eagerly here, why


@dataclass(frozen=True)
class Ran(ExecutorReply):
    KIND: ClassVar[str] = "ran"
    k: int = 0
    graph: bool = False


@dataclass(frozen=True)
class GuardsReply(ExecutorReply):
    KIND: ClassVar[str] = "guards_reply"
    reasons: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class MemoryReply(ExecutorReply):
    KIND: ClassVar[str] = "memory_reply"
    allocated: int = 0
    reserved: int = 0
    peak_reserved: int = 0


REQUESTS: dict[str, type[ExecutorRequest]] = {c.KIND: c for c in (
    Load, Warm, OpChecks, Steps, Capture, Precompile, TimedRun, Guards, Memory, Exit)}
REPLY_OF: dict[type[ExecutorRequest], type[ExecutorReply]] = {
    Load: Loaded, Warm: Warmed, OpChecks: OpResults, Steps: StepResults, Capture: Captured, Precompile: Captured,
    TimedRun: Ran, Guards: GuardsReply, Memory: MemoryReply}
REPLIES: dict[str, type[ExecutorReply]] = {c.KIND: c for c in (Ready, Failed, *REPLY_OF.values())}
FAILED_KINDS = ("candidate", "oom", "device")


# ------------------------------------------------------------------------------ encoding
def to_wire(msg: ExecutorRequest | ExecutorReply | Any) -> Any:
    """A message or value type as the map of its fields (``op`` naming a message's kind); tensors stay
    tensors (``Channel.send`` packs them)."""
    if dataclasses.is_dataclass(msg) and not isinstance(msg, type):
        out = {f.name: to_wire(getattr(msg, f.name)) for f in dataclasses.fields(msg)}
        if isinstance(msg, (ExecutorRequest, ExecutorReply)):
            out["op"] = msg.KIND
        return out
    if isinstance(msg, (list, tuple)):
        return [to_wire(v) for v in msg]
    if isinstance(msg, dict):
        return {k: to_wire(v) for k, v in msg.items()}
    return msg


class _FieldMismatch(Exception):
    pass


class _Decoder:
    """One frame's decoding: ``untrusted`` (the judge reading an executor) cuts every string to an excerpt."""

    def __init__(self, mailbox: Mailbox | None, device: Any, untrusted: bool):
        self.mailbox, self.device, self.untrusted = mailbox, device, untrusted

    def tensor(self, value):
        if not isinstance(value, dict):
            raise _FieldMismatch
        if "__m__" in value:
            if self.mailbox is None:
                raise ExecutorProtocolError("a mailbox reference on a channel without a mailbox")
            t = self.mailbox.take(value)
            return t.to(self.device) if self.device is not None and str(self.device) != "cpu" else t
        if "__t__" in value:
            return unpack_tensor(value, self.device)
        raise _FieldMismatch

    def text(self, value):
        if not isinstance(value, str):
            raise _FieldMismatch
        return excerpt(value) if self.untrusted else value

    def untyped(self, value):
        """A ``dict`` / ``list`` field: tensors decoded, strings cut (untrusted)."""
        value = decode_tensors(value, self.device, self.mailbox)
        return _cut(value) if self.untrusted else value

    def convert(self, value: Any, tp: Any) -> Any:
        origin = typing.get_origin(tp)
        if origin in (typing.Union, types.UnionType):
            for a in typing.get_args(tp):
                try:
                    return self.convert(value, a)
                except _FieldMismatch:
                    pass
            raise _FieldMismatch
        if tp is type(None):
            if value is None:
                return None
        elif tp is bool:
            if isinstance(value, bool):
                return value
        elif tp is int:
            if type(value) is int:
                return value
        elif tp is float:
            if type(value) in (int, float):
                return float(value)
        elif tp is str:
            return self.text(value)
        elif tp is Tensor:
            return self.tensor(value)
        elif dataclasses.is_dataclass(tp):
            if isinstance(value, dict):
                return self.build(tp, value, "field")
        elif origin is list:
            if isinstance(value, list):
                (item,) = typing.get_args(tp)
                if item is str and self.untrusted:
                    value = value[:TEXT_ITEMS]
                return [self.convert(v, item) for v in value]
        elif origin is dict:
            if isinstance(value, dict):
                kt, vt = typing.get_args(tp)
                return {self.convert(k, kt): self.convert(v, vt) for k, v in value.items()}
        elif tp in (dict, list):
            if isinstance(value, tp):
                return self.untyped(value)
        raise _FieldMismatch

    def build(self, cls: type, data: dict, what: str):
        hints = _hints(cls)
        kwargs = {}
        for key, value in data.items():
            if key == "op" and what != "field":
                continue
            if not isinstance(key, str) or key not in hints:
                raise ExecutorProtocolError(f"{what} {cls.__name__} has no field {str(key)[:40]!r}")
            try:
                kwargs[key] = self.convert(value, hints[key])
            except _FieldMismatch:
                raise ExecutorProtocolError(f"{what} {cls.__name__} field {key!r} must be {hints[key]}, "
                                    f"got {type(value).__name__}") from None
        return cls(**kwargs)


def _cut(value, depth: int = 0):
    if isinstance(value, str):
        return excerpt(value)
    if isinstance(value, list):
        return [_cut(v, depth + 1) for v in value]
    if isinstance(value, dict):
        return {_cut(k, depth + 1): _cut(v, depth + 1) for k, v in value.items()}
    return value


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        hints = typing.get_type_hints(cls)
        _HINTS[cls] = {f.name: hints[f.name] for f in dataclasses.fields(cls)}
    return _HINTS[cls]


def decode_request(raw: dict, device=None) -> ExecutorRequest:
    """The executor's side: a judge's request map as its class (ExecutorProtocolError for an unknown kind)."""
    cls = REQUESTS.get(raw.get("op")) if isinstance(raw.get("op"), str) else None
    if cls is None:
        raise ExecutorProtocolError(f"unknown request {str(raw.get('op'))[:40]!r}")
    return _Decoder(None, device, untrusted=False).build(cls, raw, "request")


def decode_reply(raw: dict, expect: type[ExecutorReply], nonce: int, mailbox: Mailbox | None = None,
                 device=None) -> ExecutorReply:
    """The judge's side: an executor's reply map as ``expect`` (or ``Failed``), its nonce the request's.
    Anything else is a ExecutorProtocolError: the executor's failure."""
    kind = raw.get("op")
    cls = Failed if kind == Failed.KIND else expect if kind == expect.KIND else None
    if cls is None:
        raise ExecutorProtocolError(f"expected a {expect.KIND!r} reply, got {excerpt(kind, 40)!r}")
    if raw.get("nonce") != nonce or type(raw.get("nonce")) is not int:
        raise ExecutorProtocolError(f"a {expect.KIND!r} reply with the wrong nonce")
    if mailbox is not None:
        mailbox.begin()
    try:
        reply = _Decoder(mailbox, device, untrusted=True).build(cls, raw, "reply")
    except RecursionError:
        raise ExecutorProtocolError("a reply nested too deep") from None
    if isinstance(reply, Failed) and reply.kind not in FAILED_KINDS:
        reply = dataclasses.replace(reply, kind="candidate")
    return reply
