"""The traffic summary the parallelism search needs, from workload points or a profile.

``TrafficShape`` holds the mean input and output lengths and, when known, their distributions
(``isl_dist`` / ``osl_dist``: (length, probability) buckets), the arrival rate and the
inter-arrival coefficient of variation (for the queueing delay in TTFT, cost_model.queueing), the
prefill chunk, the prefix-cache hit rate and the expert skew. A profile's length percentiles
become buckets through a log-normal fitted to p50 and p90, cut at the max and rescaled to the
mean. It is built from:
  - nothing (defaults: 1024 in, 256 out, chunks of 8192 tokens),
  - workload-point dicts (docs/internals.md): prefill points give the input length and the chunk,
    decode points the mean decode context (= input + output / 2, so output = 2 (ctx - input)),
  - a ``traffic profile --json`` dict (DESIGN.md keys ``input_tokens`` / ``output_tokens`` with
    ``mean``, ``prefix_cache_hit_rate``), or any object with ``to_dict()`` giving those keys.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from traffic_profiles import TrafficPoint

from cost_model.hardware import CostModelError
from cost_model.ops import DEFAULT_EXPERT_SKEW


@dataclass(frozen=True)
class TrafficShape:
    isl: int = 1024                 # mean input tokens per request
    osl: int = 256                  # mean output tokens per request
    chunk: int = 8192               # prefill chunk (max tokens per prefill step)
    prefix_hit: float = 0.0         # fraction of input tokens served from the prefix cache
    expert_skew: float = DEFAULT_EXPERT_SKEW
    rate: float | None = None       # requests/s arriving (None: each config at its own capacity)
    interarrival_cv: float = 1.0    # 1: Poisson arrivals
    isl_dist: tuple = ()            # ((input tokens, probability), ...); () = all at the mean
    osl_dist: tuple = ()            # ((output tokens, probability), ...)

    def __post_init__(self):
        if self.isl < 1 or self.osl < 1 or self.chunk < 1 or not 0.0 <= self.prefix_hit < 1.0 or \
                (self.rate is not None and not self.rate > 0) or not self.interarrival_cv >= 0:
            raise CostModelError(f"bad traffic shape: {self}")

    def isl_buckets(self) -> list[tuple[int, float]]:
        return [(int(n), float(p)) for n, p in self.isl_dist] or [(self.isl, 1.0)]

    def osl_buckets(self) -> list[tuple[int, float]]:
        return [(int(n), float(p)) for n, p in self.osl_dist] or [(self.osl, 1.0)]

    @property
    def decode_context(self) -> int:
        """Mean tokens in the KV cache of a decoding sequence, averaged over decode steps: a request
        with o output tokens spends o steps, at input + o / 2 on average, so long outputs weigh
        more: E[isl] + E[osl^2] / (2 E[osl]) (isl + osl / 2 when only means are known)."""
        osl = self.osl_buckets()
        m1 = sum(n * p for n, p in osl)
        m2 = sum(n * n * p for n, p in osl)
        return int(round(self.isl + m2 / (2 * m1))) if self.osl_dist else self.isl + self.osl // 2

    @property
    def max_context(self) -> int:
        """Tokens one sequence holds at its end: what the KV budget must cover."""
        return self.isl + self.osl

    def prefill_points(self, isl: int | None = None) -> list[TrafficPoint]:
        """Chunked prefill of one request's uncached input (``isl`` tokens, default the mean): one
        point per chunk."""
        isl = self.isl if isl is None else max(1, int(isl))
        start = int(isl * self.prefix_hit)
        pts, ctx = [], start
        while ctx < isl:
            n = min(self.chunk, isl - ctx)
            pts.append(TrafficPoint("prefill", 1, ctx, n, 0.0))
            ctx += n
        return pts

    def to_dict(self) -> dict:
        d = asdict(self)
        d["isl_dist"], d["osl_dist"] = [list(b) for b in self.isl_dist], [list(b) for b in self.osl_dist]
        return d

    @classmethod
    def from_points(cls, points: list[TrafficPoint], **overrides) -> "TrafficShape":
        pre = [p for p in points if p.phase == "prefill"]
        dec = [p for p in points if p.phase == "decode"]
        if not pre and not dec:
            raise CostModelError("no workload points to derive the traffic from")

        def wmean(ps, f):
            w = sum(float(p.weight) for p in ps) or len(ps)
            return sum(f(p) * float(p.weight) for p in ps) / w if ps else None

        isl = wmean(pre, lambda p: int(p.context) + int(p.chunk))
        ctx = wmean(dec, lambda p: int(p.context))
        isl = int(round(isl)) if isl else max(1, int(round((ctx or 1024) * 0.8)))
        osl = max(16, int(round(2 * (ctx - isl)))) if ctx else cls.osl
        chunk = max((int(p.chunk) for p in pre), default=cls.chunk)
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
        kw = {"isl": max(1, isl), "osl": max(1, osl), "prefix_hit": min(float(hit), 0.99),
              "isl_dist": length_buckets(d["input_tokens"]), "osl_dist": length_buckets(d["output_tokens"])}
        rate, cv = d.get("requests_per_s"), d.get("interarrival_cv")
        if isinstance(rate, (int, float)) and rate > 0 and math.isfinite(rate):
            kw["rate"] = float(rate)
        if isinstance(cv, (int, float)) and cv >= 0 and math.isfinite(cv):
            kw["interarrival_cv"] = float(cv)
        if d.get("expert_skew") is not None:
            kw["expert_skew"] = float(d["expert_skew"])
        kw.update(overrides)
        return cls(**kw)


BUCKETS = 6


def length_buckets(stats: dict, buckets: int = BUCKETS) -> tuple:
    """((length, probability), ...) of a length distribution given as ``{mean, p50, p90, max}``:
    a log-normal through p50 and p90 (sigma = ln(p90 / p50) / 1.2816), sampled at the midpoints of
    ``buckets`` equal-probability slices, capped at max, rescaled so the mean matches; () when the
    percentiles are missing or degenerate (then only the mean is used)."""
    from statistics import NormalDist

    try:
        mean, p50, p90 = float(stats["mean"]), float(stats["p50"]), float(stats["p90"])
        top = float(stats.get("max") or p90 * 10)
    except (KeyError, TypeError, ValueError):
        return ()
    if not (mean > 0 and p50 > 0 and p90 > p50 and top >= p90):
        return ()
    sigma = math.log(p90 / p50) / 1.2816
    z = [NormalDist().inv_cdf((i + 0.5) / buckets) for i in range(buckets)]
    lengths = [min(top, p50 * math.exp(sigma * zi)) for zi in z]
    scale = mean / (sum(lengths) / buckets)
    return tuple((max(1, int(round(min(top, n * scale)))), 1.0 / buckets) for n in lengths)


def roofline_step_time(spec, hw):
    """The traffic package's step-time model for replaying a trace (``traffic_profiles.RooflineStepTime``)
    of ``spec`` on ``hw`` (a ``Hardware``): weights and KV read at the achievable HBM bandwidth, ~2 x the
    active parameters of FLOPs per new token at the achievable peak of the spec's dtype, and attention
    FLOPs per (query, context) token pair over every layer's heads (absorbed MLA: scores over latent +
    rope dims, values over latent; GQA: keys and values of ``head_dim`` each)."""
    from traffic_profiles import RooflineStepTime

    if spec.attention == "mla":
        per_head = spec.kv_lora_rank + spec.qk_rope_head_dim + spec.kv_lora_rank
    elif getattr(spec, "global_head_dim", 0):      # Gemma-4: K and V dims per layer kind, the mean
        n = spec.num_layers
        per_head = sum(spec.layer_head_dim(i) + spec.layer_v_head_dim(i) for i in range(n)) / n
    else:
        per_head = 2 * spec.head_dim
    peak = hw.tflops.get(spec.dtype) or hw.tflops.get("bf16") or max(v for v in hw.tflops.values() if v)
    return RooflineStepTime(weight_bytes=spec.weight_bytes(), kv_bytes_per_token=spec.kv_bytes_per_token(),
                            flops_per_token=2.0 * spec.active_params(), bandwidth=hw.hbm_bw * hw.mem_efficiency,
                            flops=peak * 1e12 * hw.compute_efficiency,
                            attn_flops_per_pair=2.0 * spec.num_layers * spec.num_heads * per_head)
