"""Workload points: replay a trace through a continuous-batching scheduler model and reduce the
time-weighted shapes it runs to at most 16 weighted points (docs/internals.md, "Workload points").

Scheduler (``traffic_profiles.scheduler``, the one the serving engine runs; vLLM v1 style): every step, each running sequence past its prompt decodes one token;
the rest of ``max_num_batched_tokens`` goes to prompt chunks (chunked prefill), first to sequences
already prefilling, then to newly admitted ones, FCFS, while fewer than ``max_num_seqs`` run and their
KV (prompt + output tokens, reserved at admission, so nothing is ever preempted) fits
``kv_capacity_tokens``. With prefix caching a prompt's cached tokens (``cached_tokens``, or hits of the
``hash_ids`` in an unbounded cache, or in an LRU of the KV capacity) are not recomputed. The first
output token comes out of the last prompt chunk.

Step times come from a pluggable ``StepTime`` (``StepShape -> seconds``); ``RooflineStepTime`` is the
default. Stretches of pure decode steps between events (an arrival, a finish) are advanced in one go,
their time integrated with Simpson's rule, so the replay costs O(events x running), not O(steps):
~1 s for the 19k-request Azure conversation trace.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Callable

import numpy as np

from . import cache
from .scheduler import Scheduler, SchedulerConfig, Seq, TokenBudget
from .trace import Trace


@dataclass(frozen=True)
class TrafficPoint:
    phase: str          # "decode" | "prefill"
    batch: int          # sequences in the step
    context: int = 0    # tokens already in the KV cache per sequence
    chunk: int = 1      # new tokens per sequence (1 for decode)
    weight: float = 1.0  # share of GPU time spent at this point (all points sum to 1)

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> "TrafficPoint":
        """A point stored as a map (JSON: profiles, calibration files); the map may leave out ``phase``
        (decode), ``context`` (0), ``chunk`` (1) and ``weight`` (1)."""
        return cls(phase=str(d.get("phase", "decode")), batch=int(d["batch"]), context=int(d.get("context", 0)),
                   chunk=int(d.get("chunk", 1)), weight=float(d.get("weight", 1.0)))


@dataclass(frozen=True)
class StepShape:
    decode_batch: int = 0                                   # sequences decoding one token each
    decode_context: float = 0.0                             # sum of their contexts (tokens in KV)
    prefill: tuple[tuple[int, int], ...] = ()               # (chunk tokens, cached context) each


StepTime = Callable[[StepShape], float]


@dataclass(frozen=True)
class Slo:
    """A per-request service level: time to first token and time per output token, in seconds (None: no
    bound). A request meets it when it was served, its first token came within ``ttft_s`` of its arrival
    and its later tokens at ``tpot_s`` each on average (a one-token answer has no TPOT)."""

    ttft_s: float | None = None
    tpot_s: float | None = None

    def met(self, ttft: float, tpot: float | None) -> bool:
        return ((self.ttft_s is None or ttft <= self.ttft_s)
                and (self.tpot_s is None or tpot is None or tpot <= self.tpot_s))

    def describe(self) -> str:
        parts = [f"TTFT <= {1e3 * self.ttft_s:g} ms" if self.ttft_s is not None else "",
                 f"TPOT <= {1e3 * self.tpot_s:g} ms" if self.tpot_s is not None else ""]
        return " and ".join(p for p in parts if p) or "no SLO"


@dataclass(frozen=True)
class RooflineStepTime:
    """Step time = overhead + max(bytes / bandwidth, FLOPs / FLOP/s) for one forward step.

    bytes = weight_bytes + kv_bytes_per_token x (KV tokens read); FLOPs = flops_per_token x new
    tokens + attn_flops x (new token, context token) pairs. All plain numbers from the caller."""

    weight_bytes: float                 # bytes of weights read per step
    kv_bytes_per_token: float           # KV bytes per token, all layers
    flops_per_token: float              # ~2 x active parameters
    bandwidth: float                    # bytes/s achievable
    flops: float                        # FLOP/s achievable
    attn_flops_per_pair: float = 0.0    # FLOPs per (query token, context token), all layers
    overhead_s: float = 20e-6           # launch / scheduling floor per step

    def __call__(self, s: StepShape) -> float:
        new = s.decode_batch + sum(c for c, _ in s.prefill)
        kv_read = s.decode_context + sum(c + ctx for c, ctx in s.prefill)
        pairs = s.decode_context + sum(c * (ctx + c / 2) for c, ctx in s.prefill)
        mem = self.weight_bytes + self.kv_bytes_per_token * kv_read
        comp = self.flops_per_token * new + self.attn_flops_per_pair * pairs
        return self.overhead_s + max(mem / self.bandwidth, comp / self.flops)


@dataclass(frozen=True)
class TrafficWorkload:
    points: tuple[TrafficPoint, ...]
    summary: dict                           # replay figures: time shares, mean batch, TTFT, ...
    scheduler: SchedulerConfig = field(default_factory=SchedulerConfig)

    def to_dict(self) -> dict:
        return {"points": [p.to_dict() for p in self.points], "summary": self.summary,
                "scheduler": asdict(self.scheduler)}


# ---------------------------------------------------------------------------- replay
def _prompt_cached(trace: Trace, cfg: SchedulerConfig) -> np.ndarray:
    if not cfg.prefix_caching:
        return np.zeros(trace.rows, dtype=np.int64)
    if trace.cached_tokens is not None:
        return trace.cached_tokens
    if trace.has_hashes:
        if cfg.kv_capacity_tokens:
            return cache.lru_hits(trace, max(1, cfg.kv_capacity_tokens // trace.block_size))
        return cache.unbounded_hits(trace)
    return np.zeros(trace.rows, dtype=np.int64)


def _decode_time(step_time: StepTime, batch: int, ctx_sum: float, k: int) -> float:
    """Time of k decode steps, the context sum growing by ``batch`` a step (Simpson's rule)."""
    f = lambda j: step_time(StepShape(batch, ctx_sum + batch * j))  # noqa: E731
    if k == 1:
        return f(0)
    return k * (f(0) + 4 * f((k - 1) / 2) + f(k - 1)) / 6


def replay(trace: Trace, step_time: StepTime, cfg: SchedulerConfig = SchedulerConfig(),
           slo: Slo | None = None) -> TrafficWorkload:
    """Simulate serving ``trace`` with the serving engine's scheduler (``traffic_profiles.scheduler``)
    and return its workload points (at most ``cfg.max_points``). With ``slo`` the summary also has
    ``slo_attained`` (the share of the trace's requests that met it) and ``goodput_tokens_per_s`` (their
    output tokens per second of the replay)."""
    arr = (trace.timestamp_s / cfg.time_scale).tolist()
    inp, out = trace.input_tokens.tolist(), trace.output_tokens.tolist()
    n = trace.rows
    sched = Scheduler(cfg, TokenBudget(cfg.kv_capacity_tokens, _prompt_cached(trace, cfg).tolist()))
    dec: list[tuple[int, float, float]] = []            # (batch, mean context, seconds)
    pre: list[tuple[int, int, float]] = []              # (chunk, context, seconds)
    ttft: list[float] = []
    tpot: list[float] = []                              # per request: (finish - first token) / (outputs - 1)
    first_at: dict[int, float] = {}
    met, met_tokens = 0, 0                              # requests that met ``slo``, and their output tokens
    t, nxt, rejected, idle = 0.0, 0, 0, 0.0
    while True:
        while nxt < n and arr[nxt] <= t:
            sched.add(Seq(nxt, inp[nxt], out[nxt], arr[nxt]))
            nxt += 1
        if not sched.has_work():
            if nxt >= n:
                break
            idle += arr[nxt] - t
            t = arr[nxt]
            continue
        plan = sched.schedule()
        rejected += len(plan.rejected)
        if not sched.running:
            continue
        decoders = plan.decodes
        b = len(decoders)
        ctx_sum = float(sum(s.computed for s in decoders))
        if not plan.chunks:                         # a stretch of pure decode steps
            k = min(s.out_left for s in decoders)
            if not sched.waiting and nxt < n:
                tau = step_time(StepShape(b, ctx_sum))
                k = max(1, min(k, math.ceil((arr[nxt] - t) / tau)))
            dt = _decode_time(step_time, b, ctx_sum, k)
            dec.append((b, ctx_sum / b + (k - 1) / 2, dt))
            _, done = sched.advance(plan, k)
        else:
            dt = step_time(StepShape(b, ctx_sum, tuple((c, s.computed) for s, c in plan.chunks)))
            t_dec = step_time(StepShape(b, ctx_sum)) if b else 0.0
            if b:
                dec.append((b, ctx_sum / b, t_dec))
            tokens = sum(c for _, c in plan.chunks)
            for s, c in plan.chunks:
                pre.append((c, s.computed, (dt - t_dec) * c / tokens))
            first, done = sched.advance(plan)
            for s in first:
                first_at[s.rid] = t + dt
                ttft.append(t + dt - s.arrival)
        t += dt
        for s in done:
            t_first = first_at.pop(s.rid, None)
            if t_first is None:
                continue
            per_token = (t - t_first) / (s.max_new - 1) if s.max_new > 1 else None
            if per_token is not None:
                tpot.append(per_token)
            if slo is not None and slo.met(t_first - s.arrival, per_token):
                met, met_tokens = met + 1, met_tokens + s.max_new
    slo_figures = {} if slo is None else {"slo_attained": met / n if n else 0.0,
                                           "goodput_tokens_per_s": met_tokens / t if t > 0 else 0.0}
    return _finish(dec, pre, ttft, tpot, t, idle, rejected, trace, cfg, slo_figures)


# ---------------------------------------------------------------------------- reduction
def _ward(x: np.ndarray, w: np.ndarray, v: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Merge weighted points (features x [m, d] in log space, values v [m, d]) into k clusters by
    Ward's criterion; returns (weights [k], weighted-mean values [k, d]). O(m^2) a merge."""
    x, w, v = x.copy(), w.copy(), v * w[:, None]
    alive = np.ones(len(w), dtype=bool)
    while alive.sum() > k:
        idx = np.flatnonzero(alive)
        xa, wa = x[idx], w[idx]
        d2 = ((xa[:, None, :] - xa[None, :, :]) ** 2).sum(-1)
        cost = d2 * (wa[:, None] * wa[None, :]) / (wa[:, None] + wa[None, :])
        np.fill_diagonal(cost, np.inf)
        i, j = np.unravel_index(np.argmin(cost), cost.shape)
        a, b = idx[i], idx[j]
        x[a] = (x[a] * w[a] + x[b] * w[b]) / (w[a] + w[b])
        w[a] += w[b]
        v[a] += v[b]
        alive[b] = False
    idx = np.flatnonzero(alive)
    return w[idx], v[idx] / w[idx, None]


def _reduce(rows: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """rows [m, 3] = (size, context, seconds) -> k weighted centroids, via a log2 grid of 1/2 steps."""
    size, ctx, sec = rows[:, 0], rows[:, 1], rows[:, 2]
    keep = sec > 0
    size, ctx, sec = size[keep], ctx[keep], sec[keep]
    feat = np.stack([np.log2(size), np.log2(ctx + 1)], axis=1)
    cell = np.floor(feat * 2).astype(np.int64)
    _, inv = np.unique(cell, axis=0, return_inverse=True)
    inv = inv.reshape(-1)
    w = np.bincount(inv, weights=sec)
    vals = np.stack([np.bincount(inv, weights=sec * size), np.bincount(inv, weights=sec * ctx)], 1) / w[:, None]
    fx = np.stack([np.bincount(inv, weights=sec * feat[:, 0]), np.bincount(inv, weights=sec * feat[:, 1])], 1) / w[:, None]
    return _ward(fx, w, vals, min(k, len(w)))


def _finish(dec, pre, ttft, tpot, t_end, idle, rejected, trace: Trace, cfg: SchedulerConfig,
            extra: dict) -> TrafficWorkload:
    d = np.asarray(dec, dtype=np.float64).reshape(-1, 3)
    p = np.asarray(pre, dtype=np.float64).reshape(-1, 3)
    t_dec, t_pre = float(d[:, 2].sum()), float(p[:, 2].sum())
    total = t_dec + t_pre
    points: list[TrafficPoint] = []
    if total > 0:
        k_pre = 0 if t_pre <= 0 else min(max(1, round(cfg.max_points * t_pre / total)), cfg.max_points - (t_dec > 0))
        for phase, rows, k in (("decode", d, cfg.max_points - k_pre), ("prefill", p, k_pre)):
            if k <= 0 or not len(rows) or rows[:, 2].sum() <= 0:
                continue
            w, vals = _reduce(rows, k)
            for wi, (size, ctx) in zip(w, vals):
                size = max(1, int(round(size)))
                if phase == "decode":
                    points.append(TrafficPoint("decode", size, int(round(ctx)), 1, float(wi / total)))
                else:
                    points.append(TrafficPoint("prefill", 1, int(round(ctx)), size, float(wi / total)))
    points.sort(key=lambda q: (q.phase, q.batch, q.context, q.chunk))
    busy = t_end - idle
    summary = {
        "requests": trace.rows, "rejected": rejected, "simulated_s": t_end,
        "busy_share": busy / t_end if t_end > 0 else 0.0,
        "decode_share": t_dec / total if total else 0.0, "prefill_share": t_pre / total if total else 0.0,
        "mean_decode_batch": float((d[:, 0] * d[:, 2]).sum() / t_dec) if t_dec else 0.0,
        "mean_decode_context": float((d[:, 1] * d[:, 2]).sum() / t_dec) if t_dec else 0.0,
        "output_tokens_per_s": float(trace.output_tokens.sum() / t_end) if t_end > 0 else 0.0,
        "ttft_p50_s": float(np.quantile(ttft, 0.5)) if ttft else None,
        "ttft_p99_s": float(np.quantile(ttft, 0.99)) if ttft else None,
        "ttft_mean_s": float(np.mean(ttft)) if ttft else None,
        "tpot_p50_s": float(np.quantile(tpot, 0.5)) if tpot else None,
        "tpot_mean_s": float(np.mean(tpot)) if tpot else None,
        **extra,
    }
    return TrafficWorkload(tuple(points), summary, cfg)


def workload_points(trace: Trace, step_time: StepTime, cfg: SchedulerConfig = SchedulerConfig()) -> list[TrafficPoint]:
    """The replay's workload points."""
    return list(replay(trace, step_time, cfg).points)
