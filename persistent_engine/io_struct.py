"""Typed request and reply messages of the engine RPC, and their msgpack frames.

One request is one msgpack map ``{"type": <name>, "v": WIRE_VERSION, "token": <str>, **fields}`` in a single
zmq frame; one reply is a map ``{"type": <name>, "v": WIRE_VERSION, "ok": bool, "message": str, **fields}``; a
value type in a field (``WorkloadPoint``, ``Check``, ``PointTiming``, ``PointProfile``) travels as the list of
its fields in declaration order (no keys: a bench reply of 16 points stays ~2 KiB). Every field is checked
against the dataclass annotation when a frame is decoded, so the engine only ever sees well-typed
requests; anything else becomes a ``ProtocolError`` and, on the server, an ``ErrorReply``.

Stdlib + msgpack only: the client side (orchestrator, agents) imports this without torch.
"""

from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from typing import Any, ClassVar

import msgpack

# the frames' layout; a side that gets another version refuses the frame (2: value types as field lists)
WIRE_VERSION = 3
# a candidate source is a few KiB; 8 MiB leaves room and bounds what one request can make us hold
MAX_REQUEST_BYTES = 8 * 1024 * 1024
# the ZeroMQ PLAIN user name of every engine client; its password is the engine's token
PLAIN_USER = "tkcc"
# msgpack container limits while decoding a request (a map or list bigger than this is hostile)
_UNPACK_LIMITS = dict(max_str_len=MAX_REQUEST_BYTES, max_bin_len=MAX_REQUEST_BYTES,
                      max_array_len=100_000, max_map_len=10_000, max_ext_len=0)


class ProtocolError(ValueError):
    """A frame that is not a valid request or reply (bad msgpack, unknown type, wrong field type)."""

    user_error = True


# ------------------------------------------------------------------------------- value types
POINT_FIELDS = ("phase", "batch", "context", "chunk")       # what identifies a workload point (not its weight)


@dataclass(frozen=True)
class WorkloadPoint:
    """One shape the engine runs: ``batch`` sequences with ``context`` tokens already in the KV cache,
    each adding ``chunk`` new tokens (1 for decode); ``weight`` is its share of GPU time (the points of a
    workload sum to 1). ``traffic_profiles.TrafficPoint`` produces them (compiler/search/inputs.py converts, the
    one boundary); on the wire and in plan.json / board rows a point is the map of these five fields."""

    phase: str = "decode"           # "decode" | "prefill"
    batch: int = 1
    context: int = 0
    chunk: int = 1
    weight: float = 1.0

    @property
    def key(self) -> tuple:
        return point_key(self.to_dict())

    def label(self, weighted: bool = False) -> str:
        return point_label(self.to_dict(), weighted)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: Any) -> "WorkloadPoint":
        return cls(phase=str(d.get("phase", "decode")), batch=int(d["batch"]), context=int(d.get("context", 0)),
                   chunk=int(d.get("chunk", 1)), weight=float(d.get("weight", 1.0)))


def point_key(p: Any) -> tuple:
    """(phase, batch, context, chunk) of a point stored as a map (a plan's or a profile's row may carry
    more fields: speedups, timings)."""
    return tuple(p.get(k) for k in POINT_FIELDS)


def point_label(p: Any, weighted: bool = False) -> str:
    """``decode b8 ctx1024`` / ``prefill b1 ctx0 chunk512`` of a point map; ``weighted``: `` (40%)`` after it."""
    if p.get("phase") == "prefill":
        s = f"prefill b{p.get('batch')} ctx{p.get('context', 0)} chunk{p.get('chunk', 1)}"
    else:
        s = f"{p.get('phase', 'decode')} b{p.get('batch')} ctx{p.get('context', 0)}"
    if weighted and p.get("weight") is not None:
        s += f" ({100 * float(p['weight']):.0f}%)"
    return s


@dataclass(frozen=True)
class Check:
    """One verification check of a candidate (``op:<name>`` per op, ``layer``): passed, or the reason."""

    name: str
    passed: bool
    detail: str = ""

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class PointTiming:
    """The A/B timing of a candidate against the baseline at one workload point (medians and IQRs of
    the interleaved samples, in ms; ``speedup`` = baseline / candidate). A point no overridden op runs at
    is not timed: ``affected`` False, the baseline's time on both sides, speedup 1."""

    point: WorkloadPoint
    label: str
    affected: bool
    baseline_ms: float
    candidate_ms: float
    speedup: float
    baseline_iqr_ms: float = 0.0
    candidate_iqr_ms: float = 0.0
    speedup_q1: float | None = None     # lower quartile of the pairs' ratios
    samples: int = 0                    # per side
    runs_per_sample: int = 1
    floor_ms: float = 0.0               # the bandwidth floor below which a time is implausible
    graph: bool = False                 # timed as CUDA-graph replays
    graph_error: str | None = None      # why not, on a GPU
    config: dict = field(default_factory=dict)   # CONFIG knob -> what timing it means
    # why timing ended before the samples asked: "futility" (slower than the baseline by more than
    # timing.FUTILITY_MARGIN beyond doubt: ``speedup`` is the median of the pairs taken, < 0.98), "settled"
    # (the ratio known to timing.STOP_REL_SE), "" (every sample taken, or a point not timed)
    stopped: str = ""

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


@dataclass(frozen=True)
class PointProfile:
    """The baseline forward's time per op at one workload point (``persistent_engine.measure.profiler``)."""

    point: WorkloadPoint
    label: str
    step_ms: float                      # the whole step, timed as in a bench
    total_ms: float                     # the sum of the ops' times
    # op -> {"ms", "calls", "share"[, "parts": {fine op: ms}][, "regions"]}; where ``timed`` is "cuda_graph" also
    # "sync_ms", "busy_ms", "idle_ms", "kernels" ("ms" then the op's share of a graph replay: step_profile.merge)
    ops: dict = field(default_factory=dict)
    timed: str = "sync"                 # "cuda_graph": the ops' ms from graph replays' kernels; "sync": per op synced
    replay_ms: float = 0.0              # the graph replay's span (kernels' first start to last end); 0: not replayed
    outside_ms: float = 0.0             # replay time of the kernels no op launched (the model's glue)
    replay_note: str = ""               # why a GPU's sync-timed figures stayed (capture refused, kernels unmatched)

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)


# ----------------------------------------------------------------------------------- requests
@dataclass(frozen=True)
class Request:
    TYPE: ClassVar[str] = ""
    token: str = ""


@dataclass(frozen=True)
class LoadCandidate(Request):
    """Load a candidate source as a fresh module (static checks first); replaces any loaded one."""
    TYPE: ClassVar[str] = "load_candidate"
    source: str = ""
    name: str = "candidate"
    timeout_s: float = 0.0          # the judge kills the executor past this (0: the judge's default)


@dataclass(frozen=True)
class Prepare(Request):
    """Have a warm executor ready for the next candidate (waits for the pool; not part of a candidate's time).
    ``sources``: the next candidate's source first, then those queued behind it: each gets an executor that
    loads it and compiles its kernels ahead, as the pool's ready ones allow (never waited for), which its load
    then takes; an ahead executor of a source not listed is discarded. Empty: only the executor for the next
    load."""
    TYPE: ClassVar[str] = "prepare"
    sources: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Verify(Request):
    """Op-level and layer-level verification of the loaded candidate (DESIGN.md steps 2-3)."""
    TYPE: ClassVar[str] = "verify"
    seed: int | None = None         # None: a fresh seed from the engine's own generator
    timeout_s: float = 0.0          # the judge kills the executor past this (0: the judge's default)


@dataclass(frozen=True)
class Bench(Request):
    """A/B timing of candidate vs baseline at every workload point, then the spot re-check."""
    TYPE: ClassVar[str] = "bench"
    samples: int = 0                # per point and side; 0: the engine's default for its device
    warmup: int = 0
    timeout_s: float = 0.0          # the judge kills the executor past this (0: the judge's default)


@dataclass(frozen=True)
class Unload(Request):
    """Drop the candidate and restore the engine's previous state."""
    TYPE: ClassVar[str] = "unload"


@dataclass(frozen=True)
class Profile(Request):
    """Per-op time of the baseline forward at each workload point."""
    TYPE: ClassVar[str] = "profile"


@dataclass(frozen=True)
class Status(Request):
    TYPE: ClassVar[str] = "status"


@dataclass(frozen=True)
class Shutdown(Request):
    TYPE: ClassVar[str] = "shutdown"


# ------------------------------------------------------------------------------------ replies
@dataclass(frozen=True)
class Reply:
    TYPE: ClassVar[str] = ""
    ok: bool = True
    message: str = ""


@dataclass(frozen=True)
class ErrorReply(Reply):
    """Any request that could not be served: malformed, unauthenticated, oversize, or it raised."""
    TYPE: ClassVar[str] = "error"
    ok: bool = False
    kind: str = "error"             # protocol | auth | too_large | no_candidate | internal | oom


@dataclass(frozen=True)
class LoadReply(Reply):
    TYPE: ClassVar[str] = "load_candidate"
    ops: list[str] = field(default_factory=list)        # overridden op names
    config: dict = field(default_factory=dict)          # CONFIG as applied
    description: str = ""
    reasons: list[str] = field(default_factory=list)    # one per failed static/load check
    seconds: float = 0.0
    sandbox: dict = field(default_factory=dict)         # mechanisms confining this candidate's executor
    ahead: bool = False                                 # loaded by an executor that compiled it while it was queued


@dataclass(frozen=True)
class PrepareReply(Reply):
    TYPE: ClassVar[str] = "prepare"
    pool_wait_s: float = 0.0                            # how long the judge waited for a warm executor
    ahead: int = 0                                      # executors compiling queued sources ahead now


@dataclass(frozen=True)
class VerifyReply(Reply):
    TYPE: ClassVar[str] = "verify"
    reasons: list[str] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    seed: int = 0
    seconds: float = 0.0


@dataclass(frozen=True)
class BenchReply(Reply):
    TYPE: ClassVar[str] = "bench"
    reasons: list[str] = field(default_factory=list)    # spot re-check and guard failures
    per_point: list[PointTiming] = field(default_factory=list)
    speedup: float | None = None                        # weighted by the points' time weights
    timer: str = ""                                     # "judge_wall_clock"
    samples: int = 0
    seconds: float = 0.0
    baseline: str = ""                                  # what ``speedup`` is against, in words


@dataclass(frozen=True)
class UnloadReply(Reply):
    TYPE: ClassVar[str] = "unload"
    restored: list[str] = field(default_factory=list)   # what had to be put back
    reasons: list[str] = field(default_factory=list)    # guard findings after the candidate left: reject it


@dataclass(frozen=True)
class ProfileReply(Reply):
    TYPE: ClassVar[str] = "profile"
    per_point: list[PointProfile] = field(default_factory=list)
    timer: str = ""


@dataclass(frozen=True)
class StatusReply(Reply):
    TYPE: ClassVar[str] = "status"
    model: str = ""
    layers: list[int] = field(default_factory=list)
    device: str = ""
    dtype: str = ""
    points: list[WorkloadPoint] = field(default_factory=list)
    startup: dict = field(default_factory=dict)         # stage -> seconds
    # [point][variant]: the re-rounded reference's relative logits error, and the layer-level bound from it
    logit_noise: list = field(default_factory=list)
    logit_tol: list = field(default_factory=list)
    candidate: str | None = None
    served: int = 0
    pid: int = 0
    sandbox: str = ""                                   # what confines the executors
    executors_used: int = 0                             # one per candidate loaded
    pool_size: int = 0                                  # warm candidate executors kept (0: pool not started)
    pool_wait_s: float = 0.0                            # how long the last load waited for a warm executor
    pool_ready: int = 0                                 # warm executors waiting now
    ahead: int = 0                                      # executors compiling queued sources ahead now
    ahead_used: int = 0                                 # candidates loaded by one that compiled them ahead
    compiled_seeded: int = 0                            # compiled mode: executors given a trusted compile of their op set
    compiled_kept: int = 0                              # op sets whose trusted compile is kept


@dataclass(frozen=True)
class ShutdownReply(Reply):
    TYPE: ClassVar[str] = "shutdown"


REQUESTS: dict[str, type[Request]] = {c.TYPE: c for c in (
    LoadCandidate, Prepare, Verify, Bench, Unload, Profile, Status, Shutdown)}
REPLIES: dict[str, type[Reply]] = {c.TYPE: c for c in (
    ErrorReply, LoadReply, PrepareReply, VerifyReply, BenchReply, UnloadReply, ProfileReply, StatusReply,
    ShutdownReply)}


# ------------------------------------------------------------------------------ type checking
class _Mismatch(Exception):
    pass


def _convert(value: Any, tp: Any) -> Any:
    """A decoded msgpack value as the annotation ``tp`` of the small set used above (an int where a
    float is wanted becomes a float; a value type arrives as the list of its fields in order); raises
    ``_Mismatch`` when it is not one."""
    origin = typing.get_origin(tp)
    if origin in (typing.Union, types.UnionType):
        for a in typing.get_args(tp):
            try:
                return _convert(value, a)
            except _Mismatch:
                pass
        raise _Mismatch
    if tp is type(None):
        ok = value is None
    elif tp is bool:
        ok = isinstance(value, bool)
    elif tp is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif tp is float:
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            return float(value)
        ok = False
    elif tp is str:
        ok = isinstance(value, str)
    elif dataclasses.is_dataclass(tp):
        fields = dataclasses.fields(tp)
        if not isinstance(value, list) or len(value) != len(fields):
            raise _Mismatch
        hints = _hints(tp)
        return tp(**{f.name: _convert(v, hints[f.name]) for f, v in zip(fields, value)})
    elif tp is dict or origin is dict:
        ok = isinstance(value, dict)
    elif origin is list:
        if not isinstance(value, list):
            raise _Mismatch
        (item,) = typing.get_args(tp)
        return [_convert(v, item) for v in value]
    elif tp is list:
        ok = isinstance(value, list)
    else:
        ok = False
    if not ok:
        raise _Mismatch
    return value


def _wire(value: Any) -> Any:
    """A field's value as msgpack carries it: a value type as the list of its fields (compact: no keys)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return [_wire(getattr(value, f.name)) for f in dataclasses.fields(value)]
    if isinstance(value, (list, tuple)):
        return [_wire(v) for v in value]
    if isinstance(value, dict):
        return {k: _wire(v) for k, v in value.items()}
    return value


_HINTS: dict[type, dict[str, Any]] = {}


def _hints(cls: type) -> dict[str, Any]:
    if cls not in _HINTS:
        _HINTS[cls] = {f.name: typing.get_type_hints(cls)[f.name] for f in dataclasses.fields(cls)}
    return _HINTS[cls]


def _build(cls: type, data: dict, what: str):
    hints = _hints(cls)
    kwargs = {}
    for key, value in data.items():
        if key in ("type", "v"):
            continue
        if not isinstance(key, str) or key not in hints:
            raise ProtocolError(f"{what} {cls.TYPE!r} has no field {key!r}")
        try:
            kwargs[key] = _convert(value, hints[key])
        except _Mismatch:
            raise ProtocolError(f"{what} {cls.TYPE!r} field {key!r} must be {hints[key]}, "
                                f"got {type(value).__name__}") from None
    if data.get("v") != WIRE_VERSION:
        raise ProtocolError(f"{what} {cls.TYPE!r} is wire version {data.get('v')!r}; this side speaks "
                            f"{WIRE_VERSION} (engine and client from different tkcc versions)")
    return cls(**kwargs)


def _unpack(data: bytes, what: str, limits: dict | None = None) -> dict:
    if not isinstance(data, (bytes, bytearray, memoryview)):
        raise ProtocolError(f"{what} frame must be bytes")
    try:
        obj = msgpack.unpackb(bytes(data), raw=False, strict_map_key=True, **(limits or {}))
    except Exception as e:  # noqa: BLE001 - msgpack raises many types on garbage
        raise ProtocolError(f"{what} is not valid msgpack: {type(e).__name__}") from None
    if not isinstance(obj, dict):
        raise ProtocolError(f"{what} must be a msgpack map, got {type(obj).__name__}")
    return obj


# ------------------------------------------------------------------------------------ frames
def encode(msg: Request | Reply) -> bytes:
    data = {f.name: _wire(getattr(msg, f.name)) for f in dataclasses.fields(msg)}
    data["type"], data["v"] = msg.TYPE, WIRE_VERSION
    return msgpack.packb(data, use_bin_type=True)


def unpack_request(data: bytes) -> dict:
    """The raw map of a request frame (the server checks its token before building it)."""
    return _unpack(data, "request", _UNPACK_LIMITS)


def build_request(obj: dict) -> Request:
    kind = obj.get("type")
    if not isinstance(kind, str) or kind not in REQUESTS:
        raise ProtocolError(f"unknown request type {kind!r}; known: {', '.join(REQUESTS)}")
    return _build(REQUESTS[kind], obj, "request")


def decode_request(data: bytes) -> Request:
    return build_request(unpack_request(data))


def decode_reply(data: bytes) -> Reply:
    obj = _unpack(data, "reply")
    kind = obj.get("type")
    if not isinstance(kind, str) or kind not in REPLIES:
        raise ProtocolError(f"unknown reply type {kind!r}")
    return _build(REPLIES[kind], obj, "reply")


def to_dict(msg: Request | Reply) -> dict:
    d = dataclasses.asdict(msg)
    d["type"] = msg.TYPE
    return d
