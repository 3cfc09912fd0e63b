"""TrafficProfile: what a request log looks like, as a small stable JSON document with a content hash.

It holds length distributions (summary quantiles and fixed-bin histograms, see ``stats``), arrival
rate over time, burstiness (inter-arrival CV, Fano factor per window), the prefix-cache hit rate
(from ``cached_tokens``, or from ``hash_ids`` with an unbounded and optionally an LRU cache), sessions
(explicit or inferred from shared prefixes) and per-model / per-region breakdowns. Everything drift
needs is in the document, so an old profile is enough to compare new traffic against.

JSON is written with sorted keys and floats rounded to 6 significant digits; ``hash`` is the sha256
of that text without the ``hash``, ``source`` and ``format`` fields, so the same traffic always hashes the same.
Cost: O(N) vectorized passes plus O(B log B) over hash blocks; 1M requests profile in a few seconds.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from . import cache, stats
from .readers import read_trace
from .trace import Trace, TraceError

PROFILE_KIND = "tkcc.traffic_profile"
PROFILE_VERSION = 1
FANO_WINDOWS_S = (1.0, 10.0, 60.0)
UNHASHED = ("hash", "source", "format")   # not content: the same traffic hashes the same


@dataclass(frozen=True)
class ProfileConfig:
    lru_blocks: int | None = None       # also simulate an LRU prefix cache of this many blocks
    max_rate_windows: int = 120         # points of the arrival-rate-over-time series
    max_groups: int = 20                # largest models / regions listed


@dataclass(frozen=True)
class TrafficProfile:
    rows: int
    duration_s: float
    requests_per_s: float
    input_tokens: dict                  # {mean, std, min, p50, p90, p99, max, quantiles}
    output_tokens: dict
    interarrival_cv: float | None
    fano: dict                          # {"1s": x, "10s": y, "60s": z} (None when too short)
    arrival_rate: dict                  # {window_s, requests_per_s: [...]}
    prefix_cache_hit_rate: float | None
    prefix_cache: dict | None           # {source, block_size, unbounded, lru_blocks, lru}
    sessions: dict | None               # {source, count, mean_turns, max_turns, multi_turn_share}
    histograms: dict                    # {"input_tokens": [[bin, count], ...], "output_tokens": ...}
    groups: dict = field(default_factory=dict)   # {"model": {name: {...}}, "region": {...}}
    format: str = "canonical"
    start_time: str | None = None
    source: str = ""
    hash: str = ""

    # ------------------------------------------------------------------ JSON
    def to_dict(self) -> dict[str, Any]:
        d = rounded_json(asdict(self))
        d["kind"], d["version"] = PROFILE_KIND, PROFILE_VERSION
        d["hash"] = content_hash(d)
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True, indent=1)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "TrafficProfile":
        if not isinstance(d, dict) or d.get("kind") != PROFILE_KIND:
            raise TraceError("not a tkcc traffic profile (no \"kind\": \"tkcc.traffic_profile\")")
        names = {f for f in cls.__dataclass_fields__}
        try:
            return cls(**{k: v for k, v in d.items() if k in names})
        except TypeError as e:
            raise TraceError(f"incomplete traffic profile: {e}") from None

    def save(self, path: str | os.PathLike) -> None:
        """Write atomically (temp file in the same directory, then rename)."""
        path = Path(path)
        fd, tmp = tempfile.mkstemp(dir=path.parent or ".", prefix=f".{path.name}.", suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as f:
                f.write(self.to_json() + "\n")
            os.replace(tmp, path)
        except BaseException:
            os.unlink(tmp)
            raise

    @classmethod
    def load(cls, path: str | os.PathLike) -> "TrafficProfile":
        try:
            d = json.loads(Path(path).read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise TraceError(f"{path}: not a JSON traffic profile: {e}") from None
        try:
            profile = cls.from_dict(d)
        except TraceError as e:
            raise TraceError(f"{path}: {e}") from None
        if d.get("hash") != content_hash(d):
            raise TraceError(f"{path}: traffic profile content does not match its hash (edited or corrupt)")
        return profile

    def hist(self, name: str) -> np.ndarray:
        return stats.dense(self.histograms[name])


def content_hash(d: dict[str, Any]) -> str:
    body = {k: v for k, v in d.items() if k not in UNHASHED}
    text = json.dumps(body, sort_keys=True, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode()).hexdigest()[:32]


def rounded_json(x: Any) -> Any:
    """``x`` as JSON-safe values: floats to 6 significant digits, non-finite ones None, numpy scalars unwrapped."""
    if isinstance(x, float):
        if not math.isfinite(x):
            return None
        return float(f"{x:.6g}")
    if isinstance(x, (np.floating, np.integer)):
        return rounded_json(x.item())
    if isinstance(x, dict):
        return {str(k): rounded_json(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [rounded_json(v) for v in x]
    return x


# ---------------------------------------------------------------------------- building
def _prefix_cache(trace: Trace, config: ProfileConfig) -> tuple[float | None, dict | None]:
    total = float(trace.input_tokens.sum())
    if trace.cached_tokens is not None:
        rate = float(trace.cached_tokens.sum()) / total if total else 0.0
        return rate, {"source": "cached_tokens", "unbounded": rate}
    if not trace.has_hashes:
        return None, None
    rate = float(cache.unbounded_hits(trace).sum()) / total if total else 0.0
    info: dict[str, Any] = {"source": "hash_ids", "block_size": trace.block_size, "unbounded": rate}
    if config.lru_blocks:
        lru = float(cache.lru_hits(trace, config.lru_blocks).sum()) / total if total else 0.0
        info.update(lru_blocks=int(config.lru_blocks), lru=lru)
    return rate, info


def _sessions(trace: Trace) -> dict | None:
    if trace.session_id is not None:
        return {"source": "explicit", **cache.session_summary(trace.session_id)}
    if trace.has_hashes:
        return {"source": "inferred", **cache.session_summary(cache.infer_sessions(trace))}
    return None


def _groups(trace: Trace, config: ProfileConfig) -> dict:
    out = {}
    for name in ("model", "region"):
        labels = getattr(trace, name)
        if labels is None:
            continue
        keys, codes = np.unique(labels.astype(str), return_inverse=True)
        counts = np.bincount(codes)
        inp = np.bincount(codes, weights=trace.input_tokens) / counts
        outp = np.bincount(codes, weights=trace.output_tokens) / counts
        top = np.argsort(-counts, kind="stable")[:config.max_groups]
        out[name] = {str(keys[g]): {"rows": int(counts[g]), "share": counts[g] / trace.rows,
                                    "input_mean": float(inp[g]), "output_mean": float(outp[g])}
                     for g in top}
    return out


def build_profile(trace: Trace, config: ProfileConfig = ProfileConfig()) -> TrafficProfile:
    """Profile a trace (in its canonical form: rounded as saved, ``hash`` set). Raises TraceError for a
    trace with no rows."""
    if trace.rows == 0:
        raise TraceError(f"{trace.source or 'trace'}: empty trace (no rows)")
    ts = trace.timestamp_s
    dur = trace.duration_s
    rate, cache_info = _prefix_cache(trace, config)
    raw = TrafficProfile(
        rows=trace.rows, duration_s=dur,
        requests_per_s=(trace.rows - 1) / dur if dur > 0 else 0.0,
        input_tokens=stats.summary(trace.input_tokens), output_tokens=stats.summary(trace.output_tokens),
        interarrival_cv=stats.interarrival_cv(ts),
        fano={f"{w:g}s": stats.fano(ts, w) for w in FANO_WINDOWS_S},
        arrival_rate=stats.rate_series(ts, config.max_rate_windows),
        prefix_cache_hit_rate=rate, prefix_cache=cache_info, sessions=_sessions(trace),
        histograms={"input_tokens": stats.sparse(stats.histogram(trace.input_tokens)),
                    "output_tokens": stats.sparse(stats.histogram(trace.output_tokens))},
        groups=_groups(trace, config), format=trace.format, start_time=trace.start_time,
        source=trace.source)
    return TrafficProfile.from_dict(raw.to_dict())    # the canonical (rounded, hashed) form


def _saved_profile(path: str | os.PathLike) -> dict | None:
    """The parsed JSON when ``path`` is a saved profile (one JSON object with our ``kind``), else None
    (a JSON-lines trace also starts with ``{`` but is not one JSON document)."""
    p = Path(path)
    try:
        if p.stat().st_size > (64 << 20):
            return None
        with open(p, "rb") as f:
            if f.read(64).lstrip()[:1] != b"{":
                return None
        d = json.loads(p.read_bytes())
    except (OSError, ValueError):
        return None
    return d if isinstance(d, dict) and d.get("kind") == PROFILE_KIND else None


def profile_file(path: str | os.PathLike, config: ProfileConfig = ProfileConfig()) -> TrafficProfile:
    """A saved profile JSON, or the profile of a trace file in any supported format."""
    if _saved_profile(path) is not None:
        return TrafficProfile.load(path)
    return build_profile(read_trace(path), config)
