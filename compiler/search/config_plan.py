"""Config search in every optimize: engine and scheduler knobs as optimizations like kernels.

After the baseline, :func:`start` builds the config judge (``agents.offline.ConfigJudge``) from the
traffic log and the step times the engine just measured, puts it on every offline team and adds a
config search agent to the swarm (so every run has config ideas on its board, whatever ``--agents``
says). The agents judge each setting by replaying the traffic through the scheduler model
(``traffic_profiles.scheduler``, the policy ``tkcc serve`` runs); a setting that beats the best so far
is submitted to the engine as a CONFIG-only candidate, like any kernel.

What is measured and what is modelled:
  measured   the step time of the fast tier's slice at every workload point (the engine's baseline
             executor; the points are the steps the trace replay spends its time in)
  modelled   between and beyond those points: ``t = a + b * new tokens + c * KV tokens`` fitted to
             them; the full model as the slice's time x (model layers / slice layers); CUDA-graph
             padding and the eager factor of uncaptured decode batches (1 on CPU, 3 on CUDA); the KV
             capacity lost to partly filled blocks; the first MAX_REPLAY_ROWS requests stand for the
             trace, and where the measured engine cannot keep up with their rate they arrive slower
             (``ConfigJudge.fit_load``: the traffic's mix at 80% of the load the engine carries)

:class:`ConfigAcceptor` wraps the kernels' ``compiler.search.acceptance.Acceptor``: a CONFIG-only candidate is
accepted when the engine finds it correct, not slower per step than its noise allows (only for the knobs
a step can show: KV block size, CUDA-graph sizes on CUDA), and its replay
beats the baseline setting (``ConfigJudge`` score > 1 + ``min_gain``: no TTFT, TPOT or capacity worse
by more than the judge's tolerance). Only the best accepted setting goes into the plan (settings share
knobs), with its projected TTFT, TPOT and tokens/s for the traffic (``PlanOptimization.projected``).
"""

from __future__ import annotations

import ast
import hashlib
import threading
from dataclasses import dataclass, field
from typing import Any, Callable

from compiler.search.acceptance import Accepted, Composition, Decision, threshold
from compiler.plan.compose import Part, compose

__all__ = ["ConfigAccepted", "ConfigAcceptor", "start", "config_only", "make_judge", "projected_effect",
           "replay_key", "slo_of", "MODELLED"]

MODELLED = ("step time between the measured workload points (a + b*new + c*kv fit)",
            "full model = fast-tier slice x layers ratio",
            "CUDA-graph padding and eager factor", "KV capacity lost to partly filled blocks",
            "the trace's first requests, slowed to the load the measured engine carries (time_scale)")
MIN_GAIN = 0.01
MAX_REPLAY_ROWS = 2000           # requests of the trace replayed per setting (its first ones)


@dataclass(frozen=True)
class ConfigAccepted(Accepted):
    """An accepted engine/scheduler setting: ``fast`` is the engine's per-step speedup of it (scheduler
    knobs change no single step: ~1), ``projected`` what the replay projects for the traffic."""

    projected: dict = field(default_factory=dict)
    score: float = 1.0


def config_only(source: str) -> dict | None:
    """The CONFIG literal of a candidate that overrides no op; None for anything else."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return None
    found: dict[str, Any] = {}
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
            try:
                found[stmt.targets[0].id] = ast.literal_eval(stmt.value)
            except ValueError:
                found[stmt.targets[0].id] = None
    config, overrides = found.get("CONFIG"), found.get("OVERRIDES", {})
    return dict(config) if isinstance(config, dict) and config and overrides == {} else None


def projected_effect(base: dict, after: dict) -> dict:
    """TTFT, TPOT (ms) and tokens/s before and after, for the report and the plan."""
    def ms(x: float | None) -> float | None:
        return None if x is None else round(1e3 * x, 3)

    def rounded(x: float | None) -> float | None:
        return None if x is None else round(x, 3)

    rows = {"ttft_mean_ms": ("ttft_mean_s", ms), "ttft_p50_ms": ("ttft_p50_s", ms),
            "ttft_p99_ms": ("ttft_p99_s", ms), "tpot_mean_ms": ("tpot_mean_s", ms),
            "tpot_p50_ms": ("tpot_p50_s", ms), "tokens_per_s": ("tokens_per_s", rounded),
            "tokens_per_busy_s": ("tokens_per_busy_s", rounded)}
    if after.get("goodput_tokens_per_s") is not None:        # scored under an SLO
        rows.update(goodput_tokens_per_s=("goodput_tokens_per_s", rounded), slo_attained=("slo_attained", rounded))
    out = {name: {"before": f(base.get(k)), "after": f(after.get(k))} for name, (k, f) in rows.items()}
    out["ratios"] = {k: round(v, 4) for k, v in (after.get("ratios") or {}).items()}
    out["label"] = "projected: traffic replay with measured step times"
    out["modelled"] = list(MODELLED)
    return out


@dataclass
class ConfigAcceptor:
    """The kernels' acceptor plus config acceptance (module doc); the loop uses it in the Acceptor's place."""

    inner: Any                                  # compiler.search.acceptance.Acceptor
    judge: Any                                  # agents.offline.ConfigJudge
    min_gain: float = MIN_GAIN
    device_kind: str = "cpu"
    on_accept: Callable[[Accepted], None] | None = None
    configs: list[ConfigAccepted] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @property
    def accepted(self) -> list[Accepted]:
        return list(self.inner.accepted) + self.best()

    def best(self) -> list[ConfigAccepted]:
        return [max(self.configs, key=lambda c: c.score)] if self.configs else []

    def consider(self, source: str, fast_verdict: Any, *, author: str, idea_id: Any = None,
                 candidate_id: Any = None) -> Decision:
        config = config_only(source)
        if config is None:
            return self.inner.consider(source, fast_verdict, author=author, idea_id=idea_id,
                                       candidate_id=candidate_id)
        return self._consider_config(source, config, fast_verdict, author, idea_id, candidate_id)

    def _consider_config(self, source: str, config: dict, verdict: Any, author: str, idea_id: Any,
                         candidate_id: Any) -> Decision:
        noise = self.inner.noise.get("fast", 0.0)
        floor = 1.0 / threshold(noise, self.inner.cfg)          # not slower per step than the noise allows
        speedup = getattr(verdict, "speedup", None)
        if not getattr(verdict, "correct", False):
            why = (getattr(verdict, "reasons", None) or ["incorrect"])[0]
            return Decision(False, "fast", f"config rejected by the engine: {why}")
        if speedup is not None and speedup < floor and _changes_a_step(config, self.device_kind):
            return Decision(False, "fast", f"config slows a step: {speedup:.3f}x < {floor:.3f}x", fast=speedup)
        overloaded = self.judge.overloaded()
        if overloaded:
            return Decision(False, "fast", f"config not accepted: {overloaded}", fast=speedup)
        result = self.judge.evaluate_config(config)
        need = 1.0 + self.min_gain
        if not result["feasible"] or result["score"] <= need:
            how = f"in goodput under {self.judge.slo.describe()}" if self.judge.slo else "without a loss"
            return Decision(False, "fast", f"config replay x{result['score']:.3f} does not beat the baseline "
                                           f"setting by {100 * self.min_gain:.0f}% {how}", fast=speedup)
        effect = {**projected_effect(self.judge.baseline(), result), "time_scale": round(self.judge.time_scale, 6)}
        name = "config-" + hashlib.sha256(source.encode()).hexdigest()[:8]
        acc = ConfigAccepted(name=name, source=source, author=author, targets=("config",),
                             config_keys=tuple(sorted(config)), fast=float(speedup or 1.0),
                             slow=float(speedup or 1.0), per_point=(), noise=noise,
                             description=_describe(config, effect), idea_id=idea_id, candidate_id=candidate_id,
                             projected=effect, score=float(result["score"]))
        with self._lock:
            self.configs.append(acc)
        if self.on_accept is not None:
            self.on_accept(acc)
        return Decision(True, "fast", f"config replay x{result['score']:.3f} ({_ratios_line(effect['ratios'])})",
                        fast=speedup, slow=speedup)

    def compose(self, deadline: float | None = None) -> Composition | None:
        """The kernels composed and re-measured by the inner acceptor, then the best setting's CONFIG
        added to the composed source (its per-step effect was measured alone; the composition's
        speedups are the kernels')."""
        kernels = self.inner.compose(deadline=deadline)
        return with_config(kernels, self.best())


    def plan_wide_pdl(self, composition: Composition, deadline: float | None = None) -> Composition:
        """The inner acceptor's plan-wide PDL step (``Acceptor.plan_wide_pdl``) on the composed source."""
        return self.inner.plan_wide_pdl(composition, deadline=deadline)

    def bucket_variants(self, composition: Composition, deadline: float | None = None) -> Composition:
        """The inner acceptor's bucket variants (``Acceptor.bucket_variants``): the settings stay in every one."""
        return self.inner.bucket_variants(composition, deadline=deadline)


def with_config(kernels: Composition | None, configs: list[ConfigAccepted]) -> Composition | None:
    """``kernels`` (or nothing) plus the accepted settings, one composed source."""
    if not configs:
        return kernels
    parts = tuple(kernels.parts if kernels else ()) + tuple(configs)
    src = compose([Part(a.name, a.source, a.targets, a.config_keys) for a in parts])
    if kernels is None:                 # the forward pass is the reference: a step is as fast as before
        return Composition(parts, src, 1.0, 1.0, (), ())
    return Composition(parts, src, kernels.fast, kernels.slow, kernels.per_point, kernels.dropped,
                       kernels.vs_torch_compile)


def _changes_a_step(config: dict, device_kind: str) -> bool:
    """Whether the engine's per-step timing can show the setting: a KV block size other than the
    engine's, or CUDA-graph sizes on CUDA. Scheduler knobs change no single step (their measured
    speedup is noise), so only these must not slow a step."""
    from persistent_engine import DEFAULT_BLOCK_SIZE

    return (int(config.get("kv_block_size", DEFAULT_BLOCK_SIZE)) != DEFAULT_BLOCK_SIZE
            or (device_kind == "cuda" and "cuda_graph_batch_sizes" in config))


def _describe(config: dict, effect: dict) -> str:
    knobs = ", ".join(f"{k}={v}" for k, v in sorted(config.items()) if k != "cuda_graph_batch_sizes")
    graphs = config.get("cuda_graph_batch_sizes")
    if graphs is not None:
        knobs += f", {len(graphs)} CUDA-graph sizes"
    return f"{knobs}: projected {_ratios_line(effect['ratios'])}"


def _ratios_line(r: dict) -> str:
    """"goodput x.., TTFT x.., TPOT x.., capacity x.." (goodput only when scored under an SLO)."""
    names = (("goodput", "goodput"), ("ttft", "TTFT"), ("tpot", "TPOT"), ("capacity", "capacity"))
    return ", ".join(f"{label} x{r[k]:.3f}" for k, label in names if k in r)


def slo_of(ttft_ms: float | None, tpot_ms: float | None) -> Any:
    """The deployment's per-request SLO (``traffic_profiles.Slo``, seconds) from ``--ttft-ms`` and
    ``--tpot-ms``; None when neither is given."""
    from traffic_profiles import Slo

    if ttft_ms is None and tpot_ms is None:
        return None
    return Slo(None if ttft_ms is None else ttft_ms / 1e3, None if tpot_ms is None else tpot_ms / 1e3)


def replay_key(traffic_hash: str, ttft_ms: float | None, tpot_ms: float | None) -> str:
    """What a config verdict depends on beside the shapes: the trace, and the SLO it was scored by."""
    if ttft_ms is None and tpot_ms is None:
        return traffic_hash
    return f"{traffic_hash}+slo:ttft={ttft_ms}ms,tpot={tpot_ms}ms"


def make_judge(traffic_path: str, profile: dict, layer_scale: float, device_kind: str, slo: Any = None) -> Any:
    """The config judge of a run (``agents.offline.ConfigJudge``): the trace's first ``MAX_REPLAY_ROWS``
    requests, the step times of ``profile`` x ``layer_scale`` (model layers / fast-tier layers), the eager
    factor of ``device_kind``, arrivals slowed to the load the measured engine carries (``fit_load``)."""
    from agents.offline import EAGER_FACTOR_CUDA, ConfigJudge
    from traffic_profiles import read_trace

    trace = read_trace(traffic_path)
    if trace.rows > MAX_REPLAY_ROWS:            # a replay holds the GIL: keep it short beside the agents
        trace = trace.take(slice(0, MAX_REPLAY_ROWS))
    judge = ConfigJudge.from_profile(trace, profile, layer_scale=layer_scale,
                                     eager_factor=EAGER_FACTOR_CUDA if device_kind == "cuda" else 1.0, slo=slo)
    judge.fit_load()
    return judge


def start(acceptor: Any, agents: list[Any], traffic_path: str, profile: dict, spec: Any,
          fast_layers: list[int], device_kind: str, on_accept: Callable[[Accepted], None] | None = None,
          event: Callable[[str], None] | None = None, slo: Any = None) -> tuple[Any, list[Any]]:
    """(the acceptor to use, the agents to run): a :class:`ConfigAcceptor` and the agents with the
    judge on every offline team plus one config search agent; unchanged (with a line saying why) when
    the engine measured no step time to replay with. ``slo`` (``slo_of``): the settings are scored by
    their goodput under it (``agents.offline.ConfigJudge``)."""
    from agents.offline import ConfigSearchAgent, OfflineTeam, samples_from_profile

    if not samples_from_profile(profile):
        if event is not None:
            event("config search left out: the engine measured no step time to replay the traffic with")
        return acceptor, agents
    judge = make_judge(traffic_path, profile, spec.num_layers / max(len(fast_layers), 1), device_kind, slo)
    scale = judge.time_scale
    teams = {id(a.team): a.team for a in agents if isinstance(getattr(a, "team", None), OfflineTeam)}
    for team in teams.values():
        team.judge = judge
    team = next(iter(teams.values()), None) or OfflineTeam(device=device_kind, judge=judge)
    st = judge.step_time
    if event is not None:
        event(f"config search: step time {1e3 * st.a:.3f} ms + {1e6 * st.b:.3f} us/token + "
              f"{1e9 * st.c:.3f} ns/KV token, fitted to the engine's {len(samples_from_profile(profile))} "
              "measured points (full model projected)" + ("" if scale == 1.0 else
              f"; the traffic replayed at {scale:.3g}x its rate, the load the measured engine carries")
              + (f"; settings scored by their goodput under {slo.describe()}" if slo is not None else ""))
    agents = list(agents) + [ConfigSearchAgent("config-search", team)]
    return ConfigAcceptor(acceptor, judge, device_kind=device_kind, on_accept=on_accept), agents
