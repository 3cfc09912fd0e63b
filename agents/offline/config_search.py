"""The config search agent: engine and scheduler settings judged by replaying the traffic.

Knobs (:class:`ConfigSpace`): ``max_num_seqs``, ``max_num_batched_tokens``, ``max_chunk_tokens``
(the chunked-prefill size: one prompt chunk at most this; 0: the step's whole token budget),
``kv_block_size`` and ``cuda_graph_batch_sizes`` (a family: ``vllm`` 1, 2, 4 and multiples of 8;
``pow2``; ``small`` up to 8; ``none``), each capped at ``max_num_seqs``.

Judging (:class:`ConfigJudge`): the traffic log is replayed through ``traffic_profiles.replay`` (the
continuous-batching scheduler model) with :class:`MeasuredStepTime`, a step-time model fitted to the
engine's measured baseline step times (``t = a + b * new tokens + c * KV tokens read``, least squares,
non-negative; from the profile's ``per_point`` ``step_ms``, or any measured samples). The CUDA-graph
sizes enter as padding (a decode batch runs at the next captured size) and as ``eager_factor`` for
decode steps no graph covers (1 on CPU, where nothing is captured); the KV block size as capacity
lost to partly filled blocks (half a block per sequence). Figures per setting: TTFT (mean, p50, p99),
TPOT (mean, p50), output tokens per second of the trace and per busy second (the capacity). Score
without a service level: the product of the three ratios against the baseline setting (TTFT mean, TPOT
mean: baseline / this; capacity: this / baseline), so 1 is the baseline; 0 ("infeasible") when any of them
is worse than the baseline by more than ``tolerance`` or when it drops more requests than the baseline: a
setting is only better when it trades nothing away. With a service level (``slo``, the user's TTFT and TPOT
bounds per request) the trade is the user's to make, and the score is the goodput ratio: output tokens per
second of the requests that met the SLO, this setting's over the baseline's (DistServe's measure); 0 when
it drops more requests or when no setting's requests meet it, and at most 1 unless ``MIN_ATTAINED_GAIN`` more
of the trace's requests meet it (a handful of requests is no evidence: on an overloaded replay 0.5% -> 0.9%
of them read as 1.3x the goodput). A configuration that beats the best so far
by more than ``min_gain`` is also submitted to the engine (``ctx.evaluate``) as a CONFIG-only candidate,
so it is verified and recorded with the run.

``propose`` (:class:`ConfigSearchAgent`): the baseline first, then a mutation of one or two knobs of
the best configuration so far (random restarts when a neighbourhood is spent), only among the knobs
the replay can tell apart (``ConfigJudge.live_knobs``); posted as an idea with title ``config{...}``,
target ``config``, and worked by the agent itself (it claims config ideas only, several a cycle). It
stops proposing once ``patience`` configurations in a row failed to beat the best.
"""

from __future__ import annotations

import json
import math
import threading
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from agents.base import AgentContext, verdict_summary
from agents.offline.strategy import order_key
from agents.offline.worker import CONFIG, OfflineAgent, OfflineTeam
from agents.templates import render_candidate


MIN_ATTAINED_GAIN = 0.01         # a goodput gain counts when this much more of the trace meets the SLO


@dataclass(frozen=True)
class ConfigSpace:
    """Values of each knob, the engine's default first."""

    max_num_seqs: tuple = (256, 8, 16, 32, 64, 128, 512)
    max_num_batched_tokens: tuple = (8192, 512, 1024, 2048, 4096, 16384)
    max_chunk_tokens: tuple = (0, 128, 256, 512, 1024, 2048, 4096)
    kv_block_size: tuple = (16, 32, 64, 128)
    graphs: tuple = ("vllm", "pow2", "small", "none")

    def knobs(self) -> dict[str, tuple]:
        return {"max_num_seqs": self.max_num_seqs, "max_num_batched_tokens": self.max_num_batched_tokens,
                "max_chunk_tokens": self.max_chunk_tokens, "kv_block_size": self.kv_block_size,
                "graphs": self.graphs}

    def default(self) -> dict:
        return {k: v[0] for k, v in self.knobs().items()}


def graph_sizes(family: str, max_num_seqs: int) -> list[int]:
    if family == "none":
        return []
    if family == "small":
        sizes = [1, 2, 4, 8]
    elif family == "pow2":
        sizes = [1 << i for i in range(int(math.log2(max(max_num_seqs, 1))) + 1)]
    elif family == "vllm":
        sizes = [1, 2, 4] + list(range(8, max_num_seqs + 1, 8))
    else:
        raise ValueError(f"unknown CUDA-graph family {family!r}")
    return [s for s in sizes if s <= max_num_seqs]


def engine_config(knobs: Mapping[str, Any]) -> dict:
    """The candidate's CONFIG dict (DESIGN.md names) for a knob setting (``max_chunk_tokens`` only when
    it caps a chunk below the token budget)."""
    cfg = {"max_num_seqs": int(knobs["max_num_seqs"]),
           "max_num_batched_tokens": int(knobs["max_num_batched_tokens"]),
           "kv_block_size": int(knobs["kv_block_size"]),
           "cuda_graph_batch_sizes": graph_sizes(knobs["graphs"], int(knobs["max_num_seqs"]))}
    chunk = int(knobs.get("max_chunk_tokens") or 0)
    if 0 < chunk < cfg["max_num_batched_tokens"]:
        cfg["max_chunk_tokens"] = chunk
    return cfg


def config_key(config: Mapping[str, Any]) -> str:
    """A CONFIG dict as one canonical string (what the judge's ``results`` are keyed by)."""
    return json.dumps({k: config[k] for k in sorted(config)}, sort_keys=True)


def config_title(knobs: Mapping[str, Any]) -> str:
    return "config{" + ",".join(f"{k}={knobs[k]}" for k in sorted(knobs)) + "}"


# ----------------------------------------------------------------------------- step-time model
@dataclass(frozen=True)
class MeasuredStepTime:
    """``StepShape -> seconds``: ``a + b * new_tokens + c * kv_tokens`` fitted to measurements, with
    CUDA-graph padding for decode batches and ``eager_factor`` for decode steps no graph covers."""

    a: float
    b: float
    c: float
    graph_sizes: tuple[int, ...] = ()
    eager_factor: float = 1.0

    @classmethod
    def fit(cls, samples: Sequence[tuple[Any, float]], **kw) -> "MeasuredStepTime":
        """Least squares over ``(StepShape, seconds)`` samples; as many terms as the samples support
        (one sample: a constant), coefficients clipped at zero and the rest refitted."""
        if not samples:
            raise ValueError("no measured step times to fit")
        rows = np.array([[1.0, _new_tokens(s), _kv_tokens(s)] for s, _ in samples])
        y = np.array([float(t) for _, t in samples])
        cols = [0]
        for j in (1, 2):
            if len(cols) < len(samples) and np.ptp(rows[:, j]) > 0:
                cols.append(j)
        coef = np.zeros(3)
        while True:
            sol, *_ = np.linalg.lstsq(rows[:, cols], y, rcond=None)
            neg = [c for c, v in zip(cols, sol) if v < 0 and c != 0]
            if not neg:
                coef[cols] = sol
                break
            cols = [c for c in cols if c not in neg]
        coef[0] = max(coef[0], 0.0)
        if coef.sum() <= 0:
            coef[0] = float(y.mean())
        return cls(float(coef[0]), float(coef[1]), float(coef[2]), **kw)

    def with_graphs(self, sizes: Sequence[int], eager_factor: float) -> "MeasuredStepTime":
        return MeasuredStepTime(self.a, self.b, self.c, tuple(sorted(sizes)), eager_factor)

    def __call__(self, s) -> float:
        new, kv = _new_tokens(s), _kv_tokens(s)
        factor = 1.0
        if not s.prefill and self.eager_factor != 1.0:
            padded = next((g for g in self.graph_sizes if g >= s.decode_batch), None)
            if padded is None:
                factor = self.eager_factor
            else:
                new = padded
        return factor * (self.a + self.b * new + self.c * kv)


def _new_tokens(s) -> float:
    return s.decode_batch + sum(c for c, _ in s.prefill)


def _kv_tokens(s) -> float:
    return s.decode_context + sum(c + ctx for c, ctx in s.prefill)


def samples_from_profile(profile: Mapping[str, Any] | None) -> list[tuple[Any, float]]:
    """``(StepShape, seconds)`` for every profiled workload point with a measured ``step_ms``."""
    from traffic_profiles import StepShape

    out = []
    for row in (profile or {}).get("per_point", []) or []:
        p, ms = row.get("point"), row.get("step_ms")
        if not isinstance(p, Mapping) or not isinstance(ms, (int, float)) or ms <= 0:
            continue
        b, ctx, chunk = int(p.get("batch", 1)), int(p.get("context", 0)), int(p.get("chunk", 1))
        if p.get("phase", "decode") == "decode":
            shape = StepShape(decode_batch=b, decode_context=float(b * ctx))
        else:
            shape = StepShape(prefill=tuple((chunk, ctx) for _ in range(b)))
        out.append((shape, ms / 1e3))
    return out


# ----------------------------------------------------------------------------- judge
OVERLOAD_TTFT_S = 30.0          # a baseline replay whose mean TTFT is above this is a growing queue
OVERLOAD_HALVINGS = 6           # fit_load halves the arrival rate at most this often to drain it


class ConfigJudge:
    """Scores configurations by replaying ``trace`` with ``step_time`` (a fitted MeasuredStepTime).
    ``results`` keeps every setting's figures by its CONFIG (``config_key``), so whoever receives the
    engine's verdict on a config candidate can read what the replay projected for it."""

    def __init__(self, trace: Any, step_time: MeasuredStepTime, *, kv_capacity_tokens: int | None = None,
                 slo: Any = None, time_scale: float = 1.0, eager_factor: float = 1.0,
                 tolerance: float = 0.02, space: ConfigSpace = ConfigSpace()):
        """``slo``: a ``traffic_profiles.Slo`` (the score is then the goodput ratio, module doc) or None."""
        self.trace, self.step_time, self.space = trace, step_time, space
        self.kv_capacity_tokens, self.slo = kv_capacity_tokens, slo
        self.time_scale, self.eager_factor, self.tolerance = time_scale, eager_factor, tolerance
        self.mean_len = float(np.mean(trace.input_tokens + trace.output_tokens)) if trace.rows else 1.0
        self.results: dict[str, dict] = {}
        self._baseline: dict | None = None
        self._lock = threading.Lock()

    @classmethod
    def from_profile(cls, trace: Any, profile: Mapping[str, Any], *, layer_scale: float = 1.0,
                     **kw) -> "ConfigJudge":
        """``layer_scale``: full-model layers / profiled layers (the engine measures a tier's slice)."""
        samples = [(shape, t * layer_scale) for shape, t in samples_from_profile(profile)]
        return cls(trace, MeasuredStepTime.fit(samples), **kw)

    def fit_load(self, utilisation: float = 0.8) -> float:
        """When the measured engine cannot keep up with the trace at its own rate (the baseline setting
        busy more than ``utilisation`` of the replay), slow the arrivals down (``time_scale`` < 1) until
        it is about that busy: the traffic's mix at a load the measured engine carries, instead of a
        queue growing without bound (where every setting ties); then, while bursts still leave a queue
        (mean TTFT above ``OVERLOAD_TTFT_S``, :meth:`overloaded`), halve the rate, at most
        ``OVERLOAD_HALVINGS`` times. Returns the time scale (1: unchanged). Cost: 1-10 replays (~0.3 s each)."""
        duration = float(self.trace.timestamp_s[-1]) if self.trace.rows else 0.0
        for _ in range(3):          # busy time grows a little as batches shrink at the lower rate
            busy = self.replay(engine_config(self.space.default()))["busy_s"]
            if duration <= 0 or busy * self.time_scale <= 1.05 * utilisation * duration:
                break
            self._rescale(utilisation * duration / busy)        # arrivals span duration / time_scale
        for _ in range(OVERLOAD_HALVINGS):  # bursts can still queue at that load: halve the rate until drained
            ttft = self.replay(engine_config(self.space.default()))["ttft_mean_s"]
            if duration <= 0 or ttft is None or ttft <= OVERLOAD_TTFT_S:
                break
            self._rescale(self.time_scale / 2)
        return self.time_scale

    def _rescale(self, time_scale: float) -> None:
        self.time_scale = time_scale
        with self._lock:
            self.results.clear()
        self._baseline = None

    def replay(self, cfg: Mapping[str, Any]) -> dict:
        """The replay's figures for one CONFIG (seconds; None where the trace gives none)."""
        from traffic_profiles import SchedulerConfig, replay

        cfg = dict(cfg)
        cap = self.kv_capacity_tokens
        if cap is not None:        # half a block per sequence is lost to the last, partly filled block
            cap = int(cap * self.mean_len / (self.mean_len + cfg.get("kv_block_size", 16) / 2))
        st = self.step_time.with_graphs(cfg.get("cuda_graph_batch_sizes", ()), self.eager_factor)
        work = replay(self.trace, st, SchedulerConfig(
            max_num_seqs=int(cfg.get("max_num_seqs", 256)),
            max_num_batched_tokens=int(cfg.get("max_num_batched_tokens", 8192)),
            max_chunk_tokens=cfg.get("max_chunk_tokens"), kv_capacity_tokens=cap, time_scale=self.time_scale),
            slo=self.slo)
        s = work.summary
        busy = s["simulated_s"] * s["busy_share"]
        tokens = float(self.trace.output_tokens.sum())
        return {"tokens_per_busy_s": tokens / busy if busy > 0 else 0.0,
                "tokens_per_s": s["output_tokens_per_s"], "ttft_mean_s": s.get("ttft_mean_s"),
                "ttft_p50_s": s.get("ttft_p50_s"), "ttft_p99_s": s.get("ttft_p99_s"),
                "tpot_mean_s": s.get("tpot_mean_s"), "tpot_p50_s": s.get("tpot_p50_s"),
                "rejected": s["rejected"], "mean_decode_batch": s["mean_decode_batch"], "busy_s": busy,
                "slo_attained": s.get("slo_attained"), "goodput_tokens_per_s": s.get("goodput_tokens_per_s"),
                "config": cfg}

    def evaluate(self, knobs: Mapping[str, Any]) -> dict:
        """Replay figures for one knob setting (:meth:`evaluate_config` of its CONFIG)."""
        return self.evaluate_config(engine_config(knobs))

    def evaluate_config(self, config: Mapping[str, Any]) -> dict:
        """Replay figures for one CONFIG, its ``ratios`` against the baseline, ``score`` (their
        product; 0 when infeasible, see the module doc) and ``feasible``; each CONFIG replayed once."""
        key = config_key(config)
        with self._lock:
            if key in self.results:
                return self.results[key]
        default = config_key(engine_config(self.space.default()))
        base = self.baseline() if self._baseline is not None or key != default else None
        r = self.replay(config)
        ratios = {"ttft": 1.0, "tpot": 1.0, "capacity": 1.0} | ({"goodput": 1.0} if self.slo else {})
        feasible = True
        if base is not None:
            ratios = {"ttft": _ratio(base["ttft_mean_s"], r["ttft_mean_s"]),
                      "tpot": _ratio(base["tpot_mean_s"], r["tpot_mean_s"]),
                      "capacity": _ratio(r["tokens_per_busy_s"], base["tokens_per_busy_s"])}
            feasible = r["rejected"] <= base["rejected"]
            if self.slo:
                ratios["goodput"] = _goodput_ratio(r["goodput_tokens_per_s"], base["goodput_tokens_per_s"])
            else:
                feasible = feasible and all(v >= 1.0 - self.tolerance for v in ratios.values())
        if self.slo:
            feasible = feasible and bool(r["goodput_tokens_per_s"])      # some request meets it
            gained = (r["slo_attained"] or 0.0) - ((base or r)["slo_attained"] or 0.0)
            score = ratios["goodput"] if gained >= MIN_ATTAINED_GAIN else min(ratios["goodput"], 1.0)
        else:
            score = float(np.prod(list(ratios.values())))
        out = {**r, "ratios": ratios, "score": score if feasible else 0.0, "feasible": feasible}
        with self._lock:
            self.results[key] = out
        return out

    def live_knobs(self) -> dict[str, tuple]:
        """The knobs the replay can tell apart (the others stay at their default): CUDA-graph sizes
        only with an eager factor (1 on CPU: nothing is captured), the KV block size only with a KV
        capacity to lose to partly filled blocks."""
        knobs = self.space.knobs()
        if self.eager_factor == 1.0:
            knobs.pop("graphs")
        if self.kv_capacity_tokens is None:
            knobs.pop("kv_block_size")
        return knobs

    def baseline(self) -> dict:
        if self._baseline is None:
            self._baseline = self.evaluate(self.space.default())
        return self._baseline

    def overloaded(self) -> str:
        """Why the baseline setting's replay is overloaded ("" when it is not): a mean TTFT above
        ``OVERLOAD_TTFT_S`` means requests wait in a queue that the measured engine does not drain (even
        after :meth:`fit_load`), so every ratio against it measures the queue, not the setting: a TPOT or
        goodput "gain" projected from it is no gain (a recompile once accepted a setting on a projected
        TPOT x6.7 from a replay whose mean TTFT was 123 s)."""
        ttft = self.baseline().get("ttft_mean_s")
        if ttft is not None and ttft > OVERLOAD_TTFT_S:
            return (f"the traffic replay is overloaded at the baseline setting (mean TTFT {ttft:.0f} s > "
                    f"{OVERLOAD_TTFT_S:.0f} s: a queue the measured engine does not drain); no setting is "
                    "accepted on a projection from it")
        return ""


def _goodput_ratio(this: float | None, base: float | None) -> float:
    """Goodput this / baseline; a setting whose requests meet the SLO where none of the baseline's did
    scores 2 (better by any measure); when neither's do, 0."""
    if base:
        return float(this or 0.0) / float(base)
    return 2.0 if this else 0.0


def _ratio(num: float | None, den: float | None) -> float:
    """num / den; 1 when either is missing or zero (a figure the trace does not give cannot differ)."""
    return float(num) / float(den) if num and den else 1.0


# ----------------------------------------------------------------------------- agent
class ConfigSearchAgent(OfflineAgent):
    """Proposes configurations around the best one judged so far (needs ``team.judge``); works config
    ideas only (a replay takes ~0.3 s; a kernel idea would keep it waiting on the engine)."""

    claims_target = CONFIG

    def __init__(self, name: str, team: OfflineTeam, *, min_gain: float = 0.01, patience: int = 40,
                 ideas_per_cycle: int = 1, works_per_cycle: int = 8, seed: int = 0):
        if team.judge is None:
            raise ValueError("a config search agent needs a team with a ConfigJudge (the traffic)")
        super().__init__(name, team, ideas_per_cycle=ideas_per_cycle, seed=seed)
        self.min_gain, self.patience, self.works_per_cycle = min_gain, patience, works_per_cycle

    def _stalled(self) -> bool:
        """True once ``patience`` configurations in a row failed to beat the best one."""
        scores = [s for _, s in self.team.configs]
        if len(scores) <= self.patience:
            return False
        best_at = max(range(len(scores)), key=scores.__getitem__)
        return len(scores) - 1 - best_at >= self.patience

    def run_once(self, ctx: AgentContext) -> bool:
        """Up to ``works_per_cycle`` propose-and-replay rounds (a replay is cheap; only a setting that
        beats the best goes to the engine)."""
        more = True
        for _ in range(self.works_per_cycle):
            more = super().run_once(ctx)
            if not more or ctx.expired():
                break
        return more

    def propose(self, ctx: AgentContext) -> bool:
        space = self.team.judge.space
        knobs_space = self.team.judge.live_knobs()
        with self.team.lock:
            if self._stalled():
                return False
            best = max(self.team.configs, key=lambda ks: ks[1])[0] if self.team.configs else None
            candidates = list(self.team.starts) + ([space.default()] if best is None else [])
            for i in range(200):
                base = best or space.default()
                if i < 120:
                    k = dict(base)
                    for name in self.rng.sample(list(knobs_space), min(self.rng.choice((1, 1, 2)), len(knobs_space))):
                        vals = sorted(knobs_space[name], key=order_key)
                        j = vals.index(k[name]) + self.rng.choice((-1, 1))
                        k[name] = vals[min(max(j, 0), len(vals) - 1)]
                else:
                    k = {**base, **{name: self.rng.choice(vals) for name, vals in knobs_space.items()}}
                candidates.append(k)
            for k in candidates:
                title = config_title(k)
                if title in self.team.tried or ctx.already_tried(title, CONFIG):
                    continue
                self.team.tried.add(title)
                break
            else:
                return False
        body = {"kind": CONFIG, "knobs": k, "config": engine_config(k),
                "why": "judged by replaying the traffic through the scheduler model with measured step times"}
        ctx.board.post_idea(ctx.run_id, author=self.name, title=title, body=json.dumps(body), target=CONFIG,
                            tags=[CONFIG], priority=0.05)
        return True


def work_config_idea(agent: OfflineAgent, ctx: AgentContext, lease, doc: Mapping[str, Any]) -> None:
    """Judge a config idea by replay; submit it to the engine when it beats the best so far."""
    judge = agent.team.judge
    knobs = dict(doc["knobs"])
    unknown = set(knobs) ^ set(judge.space.knobs())
    if unknown:
        raise ValueError(f"config idea with unknown or missing knobs: {sorted(unknown)}")
    base = judge.baseline()
    result = judge.evaluate(knobs)
    with agent.team.lock:
        best_before = max([s for _, s in agent.team.configs] + [base["score"]])
        agent.team.configs.append((knobs, result["score"]))
        agent.team.tried.add(config_title(knobs))
    gain = result["score"] / base["score"] if base["score"] > 0 else None
    better = result["feasible"] and result["score"] > best_before * (1 + getattr(agent, "min_gain", 0.01))
    post = {"kind": CONFIG, "knobs": knobs, **result, "baseline_score": base["score"], "gain": gain,
            **config_status(result, gain, better), "submitted": False}
    if better:
        ratios = ", ".join(f"{k} x{v:.3f}" for k, v in result["ratios"].items())
        source = render_candidate([], config=result["config"],
                                  description=f"{config_title(knobs)}: x{gain:.3f} ({ratios}) in the traffic replay")
        verdict = ctx.evaluate(source, author=agent.name, idea_id=lease.idea_id)
        post.update(submitted=True, verdict=verdict_summary(verdict))
    ctx.post(agent.name, json.dumps(post), idea=lease.idea_id, kind="result")
    lease.finish("done")            # judged: "not better" is a verdict; "failed" is left to errors (Lease)


def config_status(result: Mapping[str, Any], gain: float | None, better: bool) -> dict:
    """A judged setting's outcome, ``{"status", "why"}``: "better" (beats the best so far; submitted to the
    engine) or "not better" (trades a figure away or drops requests, or gains too little), with its
    measured ratio against the baseline setting. An idea whose judging raised is finished "failed" instead."""
    ratio = "n/a" if gain is None else f"x{gain:.3f}"
    if better:
        return {"status": "better", "why": f"{ratio} the baseline setting in the replay, above the best so far"}
    if not result["feasible"]:
        worse = ", ".join(f"{k} x{v:.3f}" for k, v in result["ratios"].items() if v < 1.0) or "requests dropped"
        return {"status": "not better", "why": f"trades a figure away ({worse}) or drops requests; score {ratio}"}
    return {"status": "not better", "why": f"{ratio} the baseline setting: not above the best so far by the "
                                          f"minimum gain"}

