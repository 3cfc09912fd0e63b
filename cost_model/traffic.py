"""The traffic summary the parallelism search needs, from workload points or a profile.

``TrafficShape`` holds the mean input and output lengths, the prefill chunk, the prefix-cache
hit rate and the expert skew. It is built from:
  - nothing (defaults: 1024 in, 256 out, chunks of 8192 tokens),
  - workload-point dicts (docs/internals.md): prefill points give the input length and the chunk,
    decode points the mean decode context (= input + output / 2, so output = 2 (ctx - input)),
  - a ``traffic profile --json`` dict (DESIGN.md keys ``input_tokens`` / ``output_tokens`` with
    ``mean``, ``prefix_cache_hit_rate``), or any object with ``to_dict()`` giving those keys.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from cost_model.hardware import CostModelError
from cost_model.ops import DEFAULT_EXPERT_SKEW


@dataclass(frozen=True)
class TrafficShape:
    isl: int = 1024                 # mean input tokens per request
    osl: int = 256                  # mean output tokens per request
    chunk: int = 8192               # prefill chunk (max tokens per prefill step)
    prefix_hit: float = 0.0         # fraction of input tokens served from the prefix cache
    expert_skew: float = DEFAULT_EXPERT_SKEW

    def __post_init__(self):
        if self.isl < 1 or self.osl < 1 or self.chunk < 1 or not 0.0 <= self.prefix_hit < 1.0:
            raise CostModelError(f"bad traffic shape: {self}")

    @property
    def decode_context(self) -> int:
        """Mean tokens in the KV cache of a decoding sequence."""
        return self.isl + self.osl // 2

    @property
    def max_context(self) -> int:
        """Tokens one sequence holds at its end: what the KV budget must cover."""
        return self.isl + self.osl

    def prefill_points(self) -> list[dict]:
        """Chunked prefill of one request's uncached input: one point per chunk."""
        start = int(self.isl * self.prefix_hit)
        pts, ctx = [], start
        while ctx < self.isl:
            n = min(self.chunk, self.isl - ctx)
            pts.append({"phase": "prefill", "batch": 1, "context": ctx, "chunk": n, "weight": 0.0})
            ctx += n
        return pts

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_points(cls, points: list[dict], **overrides) -> "TrafficShape":
        pre = [p for p in points if p.get("phase") == "prefill"]
        dec = [p for p in points if p.get("phase", "decode") == "decode"]
        if not pre and not dec:
            raise CostModelError("no workload points to derive the traffic from")

        def wmean(ps, f):
            w = sum(float(p.get("weight", 1.0)) for p in ps) or len(ps)
            return sum(f(p) * float(p.get("weight", 1.0)) for p in ps) / w if ps else None

        isl = wmean(pre, lambda p: int(p.get("context", 0)) + int(p.get("chunk", 1)))
        ctx = wmean(dec, lambda p: int(p.get("context", 0)))
        isl = int(round(isl)) if isl else max(1, int(round((ctx or 1024) * 0.8)))
        osl = max(16, int(round(2 * (ctx - isl)))) if ctx else cls.osl
        chunk = max((int(p.get("chunk", 1)) for p in pre), default=cls.chunk)
        return cls(**{"isl": max(1, isl), "osl": osl, "chunk": max(chunk, 1), **overrides})

    @classmethod
    def from_profile(cls, profile, **overrides) -> "TrafficShape":
        d = profile.to_dict() if hasattr(profile, "to_dict") else profile
        try:
            isl = int(round(float(d["input_tokens"]["mean"])))
            osl = int(round(float(d["output_tokens"]["mean"])))
        except (KeyError, TypeError, ValueError):
            raise CostModelError("traffic profile lacks input_tokens/output_tokens means") from None
        hit = d.get("prefix_cache_hit_rate") or 0.0
        kw = {"isl": max(1, isl), "osl": max(1, osl), "prefix_hit": min(float(hit), 0.99)}
        if d.get("expert_skew") is not None:
            kw["expert_skew"] = float(d["expert_skew"])
        kw.update(overrides)
        return cls(**kw)
