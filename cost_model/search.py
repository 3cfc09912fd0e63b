"""Parallelism search: every layout x weight dtype x batch on N GPUs, its TTFT, TPOT and
throughput, the Pareto front of tokens/s/GPU against tokens/s/user, and the best config under SLAs.

Per layout (cost_model.layout) and decode batch B per instance (pp micro-batches of B in flight):
    lat_dec   one decode step through all stages at the mean decode context
    T_pf      chunked prefill of one request's uncached input, summed over stages (= TTFT alone)
    P_rate    prefills per second one instance sustains: dp groups in parallel, pipelined stages
  colocated (chunked prefill mixed into decode):
    TPOT = lat_dec + B pp / (osl P_rate)           the share of time each step loses to prefills
    out  = replicas * B pp / TPOT                   output tokens/s of all instances
  disaggregated xPyD (x prefill and y decode instances of the same layout, x + y = replicas):
    TPOT = lat_dec; TTFT = T_pf + KV transfer over scale-out
    out  = min(y B pp / lat_dec, x P_rate osl), best x
tokens/s/GPU = out / N (output tokens), tokens/s/user = 1 / TPOT.

With length distributions the prefill figures are expectations over the input-length buckets, and
TTFT adds the queueing delay (cost_model.queueing, G/G/c): requests arrive at the trace's rate per
instance (or, without one, at the rate the config itself sustains, out / osl) with the trace's
inter-arrival CV, and wait for one of the instance's dp prefill servers (xPyD: one of x prefill
instances). A config whose utilisation reaches 1 is unstable (TTFT null, never meets an SLA).

Free factors, as the framework can launch them (cost_model.sharding): EP dividing the expert count,
under vLLM 1 or all tp*dp GPUs of a stage (--enable-expert-parallel), under SGLang any power-of-two
divisor of tp*dp or tp*dp itself (--ep-size), so EP larger than TP with DP-attention; DCP any divisor of
tp for MLA (vLLM only); the KV cache in bf16 or fp8. Each row carries its serving flags per framework.
Quality: weights below the checkpoint's own dtype (``native_weight_dtype``) and an fp8 KV cache
are quality trade-offs, listed per config (``quality``) and never chosen as best unless
``allow_quantized``. Objective: the SLA when given; with none, ``DEFAULT_OBJECTIVE``: the most
tokens/s/GPU at TPOT <= 50 ms (20 tokens/s per user, faster than reading) with a stable queue.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field, replace

from traffic_profiles import TrafficPoint

from cost_model import queueing
from cost_model.estimate import DEFAULT_EFFICIENCY, Efficiency, estimate_step
from cost_model.hardware import DTYPE_BYTES, WEIGHT_DTYPES, CostModelError, Hardware
from cost_model.layout import Layout, MemoryFit, layout_is_valid, max_batch, memory_fit, weight_bytes_gpu
from cost_model.sharding import FRAMEWORKS, expressible, serving_flags
from cost_model.traffic import TrafficShape

BATCHES = tuple(2 ** i for i in range(12))          # 1 .. 2048 sequences per attention group
MAX_TP = 8
DEFAULT_TPOT_MS = 50.0
DEFAULT_OBJECTIVE = (f"no SLA given: the most tokens/s/GPU at TPOT <= {DEFAULT_TPOT_MS:g} ms "
                     f"(>= {1e3 / DEFAULT_TPOT_MS:g} tokens/s/user) with a stable prefill queue")


@dataclass(frozen=True)
class SLA:
    ttft_ms: float | None = None
    tpot_ms: float | None = None

    def met(self, ttft_ms: float, tpot_ms: float) -> bool:
        return (self.ttft_ms is None or ttft_ms <= self.ttft_ms) and (self.tpot_ms is None or tpot_ms <= self.tpot_ms)

    def describe(self) -> str:
        parts = [f"TTFT <= {self.ttft_ms:g} ms" if self.ttft_ms is not None else "",
                 f"TPOT <= {self.tpot_ms:g} ms" if self.tpot_ms is not None else ""]
        return " and ".join(p for p in parts if p) or "no SLA"


@dataclass(frozen=True)
class ConfigResult:
    layout: Layout
    batch: int                      # sequences per instance per micro-batch
    replicas: int                   # instances on the N GPUs
    pd: str                         # "colocated" or "xPyD"
    fits: bool
    memory: MemoryFit
    ttft_ms: float
    tpot_ms: float
    tokens_per_s_per_gpu: float
    tokens_per_s_per_user: float
    meets_sla: bool = True
    pareto: bool = False
    quality: tuple = ()             # quality trade-offs of this config (quantized weights, fp8 KV)
    queue_ms: float = 0.0           # mean queueing delay inside ttft_ms (inf: unstable)
    serving: dict = field(default_factory=dict)    # framework -> its flags and memory (``serving_options``)

    @property
    def stable(self) -> bool:
        return math.isfinite(self.ttft_ms)

    def label(self) -> str:
        pd = "" if self.pd == "colocated" else f" {self.pd}"
        return f"{self.layout.label()} x{self.replicas}{pd} b{self.batch}"

    def to_dict(self) -> dict:
        L = self.layout
        return {"label": L.label(), "framework": L.framework, "tp": L.tp, "pp": L.pp, "ep": L.ep, "dp": L.dp,
                "dcp": L.dcp, "moe_tp": L.moe_tp, "sharding": L.sharding.to_dict(), "serving": self.serving,
                "dtype": L.dtype, "kv_dtype": L.kv_dtype, "batch": self.batch, "replicas": self.replicas, "pd": self.pd,
                "fits": self.fits, "memory": self.memory.to_dict(),
                "ttft_ms": round(self.ttft_ms, 4) if self.stable else None,
                "queue_ms": round(self.queue_ms, 4) if self.stable else None, "stable": self.stable,
                "quality": list(self.quality),
                "tpot_ms": round(self.tpot_ms, 4), "tokens_per_s_per_gpu": round(self.tokens_per_s_per_gpu, 3),
                "tokens_per_s_per_user": round(self.tokens_per_s_per_user, 3), "meets_sla": self.meets_sla,
                "pareto": self.pareto}


@dataclass(frozen=True)
class SearchResult:
    model: str
    hw: str
    gpus: int
    traffic: TrafficShape
    sla: SLA
    configs: list = field(default_factory=list)    # ConfigResult, best per layout/pd + the Pareto front
    best: ConfigResult | None = None
    message: str = ""
    objective: str = ""
    allow_quantized: bool = False

    def to_dict(self) -> dict:
        return {"model": self.model, "hw": self.hw, "gpus": self.gpus, "traffic": self.traffic.to_dict(),
                "sla": {"ttft_ms": self.sla.ttft_ms, "tpot_ms": self.sla.tpot_ms}, "objective": self.objective,
                "allow_quantized": self.allow_quantized,
                "configs": [c.to_dict() for c in self.configs],
                "best": self.best.to_dict() if self.best else None, "message": self.message}


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _ep_choices(spec, group: int, framework: str = "vllm") -> list[int]:
    """EP degrees for an MLP group of ``group`` GPUs that ``framework`` can launch and that divide the
    expert count: vLLM's --enable-expert-parallel is all of the group or nothing; SGLang's --ep-size
    any power-of-two divisor of the group, or the whole group."""
    if not spec.is_moe:
        return [1]
    cands = {1, group} if framework == "vllm" else {d for d in _divisors(group) if d & (d - 1) == 0 or d == group}
    return sorted(d for d in cands if d <= spec.num_experts and spec.num_experts % d == 0)


def enumerate_layouts(spec, hw: Hardware, gpus: int, dtypes=WEIGHT_DTYPES, kv_dtypes=("bf16",),
                      framework: str = "vllm") -> list[Layout]:
    """Every layout ``framework`` can launch (cost_model.sharding.expressible) that uses all ``gpus``
    as whole instances: tp a power of two up to min(8, domain, heads); DP-attention and EP
    (``_ep_choices``) for MoE models; DCP any divisor of tp for MLA; pp a power of two; weight and KV
    dtypes the hardware supports."""
    out = []
    dts = [d for d in dtypes if d == "bf16" or hw.supports(d)]
    kvs = [d for d in kv_dtypes if d == "bf16" or hw.supports(d)]
    tps = [t for t in (1, 2, 4, 8) if t <= min(MAX_TP, hw.domain, gpus, spec.num_heads) and gpus % t == 0]
    for dt, kv, tp in ((dt, kv, tp) for dt in dts for kv in kvs for tp in tps):
        for dp in (_divisors(gpus // tp) if spec.is_moe else [1]):
            for pp in (p for p in (1, 2, 4, 8) if (gpus // (tp * dp)) % p == 0 and p <= spec.num_layers):
                dcps = _divisors(tp) if spec.attention == "mla" else [1]
                for ep in _ep_choices(spec, tp * dp, framework):
                    for dcp in dcps:
                        L = Layout(tp=tp, pp=pp, ep=ep, dp=dp, dcp=dcp, dtype=dt, kv_dtype=kv, framework=framework)
                        if layout_is_valid(spec, L) is None and expressible(L) is None:
                            out.append(L)
    return out


def native_weight_dtype(spec) -> str:
    """The dtype the model's checkpoint ships its linear weights in: the ``quantization_config`` of
    its config.json (fp8 for DeepSeek-V3 / Kimi-K2), else bf16."""
    from persistent_engine.models.spec import ALIASES, CONFIG_DIR

    if getattr(spec, "expert_dtype", "") == "mxfp4":      # gpt-oss: MXFP4 experts only (layout.expert_wbytes)
        return "bf16"
    path = CONFIG_DIR / ALIASES[spec.name] if spec.name in ALIASES else None
    try:
        q = json.loads(path.read_text()).get("quantization_config") or {} if path else {}
    except (OSError, ValueError):
        q = {}
    method = str(q.get("quant_method", "")).lower() + str(q.get("fmt", "")).lower()
    if "fp4" in method or "mxfp4" in method:
        return "fp4"
    return "fp8" if "fp8" in method or "e4m3" in method else "bf16"


def quality_tradeoffs(spec, L: Layout) -> tuple:
    """What ``L`` gives up in accuracy: weights below the checkpoint's dtype, an fp8 KV cache."""
    out = []
    native = native_weight_dtype(spec)
    if DTYPE_BYTES[L.dtype] < DTYPE_BYTES[native]:
        out.append(f"{L.dtype} weights (checkpoint {native})")
    if DTYPE_BYTES[L.kv_dtype] < 2.0:
        out.append(f"{L.kv_dtype} KV cache")
    return tuple(out)


@dataclass(frozen=True)
class Prefill:
    latency_s: float                # mean over the input-length buckets of one request's prefill alone
    stage_s: float                  # mean busy time of the slowest stage per request (the service time)
    cv: float                       # coefficient of variation of the service time
    rate: float                     # prefills/s one instance sustains (dp groups in parallel)

    def ttft(self, arrival_rate: float, ca: float, servers: int) -> tuple[float, float]:
        """(TTFT seconds, queueing seconds in it) at ``arrival_rate`` requests/s over ``servers``."""
        q = queueing.wait_s(arrival_rate, self.stage_s, ca, self.cv, servers)
        return self.latency_s + q, q


def _prefill(spec, hw, L, traffic, eff) -> Prefill:
    lats, stages, probs = [], [], []
    for isl, p in traffic.isl_buckets():
        lat = stage = 0.0
        for pt in traffic.prefill_points(isl):
            e = estimate_step(spec, hw, L, pt, eff=eff, skew=traffic.expert_skew)
            lat += e.latency_s
            stage += e.stage_s
        lats.append(lat), stages.append(stage), probs.append(p)
    lat, _ = queueing.service_moments(lats, probs)
    stage, cv = queueing.service_moments(stages, probs)
    return Prefill(lat, stage, cv, L.dp / stage if stage > 0 else float("inf"))


def _arrivals(traffic: TrafficShape, capacity_rps: float, instances: int) -> float:
    """Requests/s one of ``instances`` servers sees: the trace's rate split evenly, else the rate
    the config sustains (``capacity_rps`` for all of them)."""
    total = traffic.rate if traffic.rate is not None else capacity_rps
    return total / max(instances, 1)


def _kv_transfer_s(spec, hw, L, traffic) -> float:
    """Moving one request's KV from a prefill to a decode instance, over scale-out links of all
    the instance's GPUs at once."""
    nbytes = traffic.isl * spec.kv_bytes_per_token(L.kv_dtype)
    return hw.message_latency_s + nbytes / (hw.scale_out_bw * L.gpus)


def serving_options(L: Layout, mem: MemoryFit, weights: dict) -> dict:
    """Per framework: the flags that launch ``L`` and the memory per GPU under that framework's own
    sharding (``weights``: framework -> weight bytes per GPU), or ``flags`` None and the reason: the
    framework cannot express the layout, or its sharding does not fit where ``L``'s does."""
    out = {}
    for fw in FRAMEWORKS:
        why = expressible(L, fw)
        if why is not None:
            out[fw] = {"flags": None, "reason": why}
            continue
        total = mem.total - mem.weights + weights[fw]
        row = {"weights_gb": round(weights[fw] / 1e9, 3), "total_gb": round(total / 1e9, 3)}
        if mem.fits and total > mem.capacity:
            out[fw] = {"flags": None, **row, "reason": f"{fw} shards the weights into {weights[fw] / 1e9:.1f} GB "
                       f"per GPU: {total / 1e9:.1f} GB with this batch's KV, over {mem.capacity / 1e9:.1f} GB usable"}
        else:
            out[fw] = {"flags": serving_flags(L, fw), **row}
    return out


def evaluate_layout(spec, hw: Hardware, gpus: int, L: Layout, traffic: TrafficShape, sla: SLA,
                    eff: Efficiency = DEFAULT_EFFICIENCY, batches=BATCHES) -> list[ConfigResult]:
    """All rows of one layout: colocated and (with >= 2 instances) the best xPyD, per batch."""
    replicas = gpus // L.gpus
    ctx = traffic.max_context
    quality = quality_tradeoffs(spec, L)
    weights = {fw: weight_bytes_gpu(spec, replace(L, framework=fw)) for fw in FRAMEWORKS}
    bmax = max_batch(spec, hw, L, ctx, traffic.chunk)
    pf = _prefill(spec, hw, L, traffic, eff)
    ca = traffic.interarrival_cv
    rows = []
    cap = max(batches) * L.dp
    sizes = sorted({b * L.dp for b in batches if b * L.dp <= bmax} | ({bmax} if 0 < bmax < cap else set()))
    if not sizes:   # does not fit: one row at batch 1 so that the memory figures are reported
        dec = estimate_step(spec, hw, L, TrafficPoint("decode", 1, traffic.decode_context, 1, 1.0),
                            eff=eff, skew=traffic.expert_skew)
        mem = memory_fit(spec, hw, L, 1, ctx, traffic.chunk)
        tpot = dec.latency_s * 1e3
        return [ConfigResult(L, 1, replicas, "colocated", False, mem, pf.latency_s * 1e3, tpot, 0.0, 1e3 / tpot,
                             False, quality=quality, serving=serving_options(L, mem, weights))]
    for b in sizes:
        dec = estimate_step(spec, hw, L, TrafficPoint("decode", b, traffic.decode_context, 1, 1.0),
                            eff=eff, skew=traffic.expert_skew)
        mem = memory_fit(spec, hw, L, b, ctx, traffic.chunk)
        serving = serving_options(L, mem, weights)
        inflight = b * L.pp
        tpot = dec.latency_s + inflight / (traffic.osl * pf.rate)
        out = replicas * inflight / tpot
        ttft, q = pf.ttft(_arrivals(traffic, out / traffic.osl, replicas), ca, L.dp)
        if traffic.rate is not None and traffic.rate * traffic.osl > out:
            ttft = q = math.inf                                    # the trace outruns this config
        rows.append(ConfigResult(L, b, replicas, "colocated", True, mem, ttft * 1e3, tpot * 1e3, out / gpus,
                                 1.0 / tpot, math.isfinite(ttft) and sla.met(ttft * 1e3, tpot * 1e3),
                                 quality=quality, queue_ms=q * 1e3, serving=serving))
        if replicas >= 2:
            dec_rate = inflight / dec.latency_s                    # output tokens/s per decode instance
            pre_rate = pf.rate * traffic.osl                       # output tokens/s one prefill instance feeds
            x = max(range(1, replicas), key=lambda x: min((replicas - x) * dec_rate, x * pre_rate))
            out = min((replicas - x) * dec_rate, x * pre_rate)
            ttft, q = pf.ttft(_arrivals(traffic, out / traffic.osl, x), ca, L.dp)
            if traffic.rate is not None and traffic.rate * traffic.osl > out:
                ttft = q = math.inf
            ttft = (ttft + _kv_transfer_s(spec, hw, L, traffic)) * 1e3
            tpot_pd = dec.latency_s * 1e3
            rows.append(ConfigResult(L, b, replicas, f"{x}P{replicas - x}D", True, mem, ttft, tpot_pd, out / gpus,
                                     1e3 / tpot_pd, math.isfinite(ttft) and sla.met(ttft, tpot_pd),
                                     quality=quality, queue_ms=q * 1e3, serving=serving))
    return rows


def pareto_front(rows: list[ConfigResult]) -> set[int]:
    """Indices of the fitting rows no other fitting row beats on both tokens/s/GPU and /user."""
    cand = sorted((i for i, r in enumerate(rows) if r.fits),
                  key=lambda i: (-rows[i].tokens_per_s_per_gpu, -rows[i].tokens_per_s_per_user))
    front, best_user = set(), -1.0
    for i in cand:
        if rows[i].tokens_per_s_per_user > best_user:
            front.add(i)
            best_user = rows[i].tokens_per_s_per_user
    return front


def _rank(r: ConfigResult) -> tuple:
    return (r.tokens_per_s_per_gpu, r.tokens_per_s_per_user)


def search(spec, hw: Hardware, gpus: int, traffic: TrafficShape | None = None, sla: SLA | None = None,
           eff: Efficiency | None = None, dtypes=None, allow_quantized: bool = False,
           framework: str = "vllm") -> SearchResult:
    """Evaluate every layout; keep per layout and pd mode its best row (under the objective when
    any row meets it) plus the whole Pareto front; pick the best config that fits, meets the
    objective (the SLA, else ``DEFAULT_OBJECTIVE``) and, unless ``allow_quantized``, gives up no
    quality. ``eff``: None = the measured-kernel curves for ``hw`` (cost_model.efficiency).
    ``dtypes``: weight dtypes to try (None: those of WEIGHT_DTYPES no wider than the checkpoint's).
    ``framework``: whose sharding and flags (vllm | sglang; cost_model.sharding)."""
    if gpus < 1:
        raise CostModelError(f"--gpus must be >= 1, got {gpus}")
    traffic = traffic or TrafficShape()
    sla = sla or SLA()
    given = sla.ttft_ms is not None or sla.tpot_ms is not None
    objective = f"SLA: {sla.describe()}" if given else DEFAULT_OBJECTIVE
    target = sla if given else SLA(tpot_ms=DEFAULT_TPOT_MS)
    if eff is None:
        from cost_model.efficiency import curve_efficiency

        eff = curve_efficiency(hw) or DEFAULT_EFFICIENCY
    if dtypes is None:                                              # no upcasting past the checkpoint
        dtypes = [d for d in WEIGHT_DTYPES if DTYPE_BYTES[d] <= DTYPE_BYTES[native_weight_dtype(spec)]]
    if framework not in FRAMEWORKS:
        raise CostModelError(f"unknown framework {framework!r} (one of {', '.join(FRAMEWORKS)})")
    layouts = enumerate_layouts(spec, hw, gpus, dtypes, kv_dtypes=("bf16", "fp8") if allow_quantized else ("bf16",),
                                framework=framework)
    if not layouts:
        raise CostModelError(f"no parallelism layout of {spec.name} uses {gpus} GPUs of {hw.name}")
    rows: list[ConfigResult] = []
    for L in layouts:
        rows += evaluate_layout(spec, hw, gpus, L, traffic, target, eff)
    front = pareto_front(rows)
    rows = [r if i not in front else _with(r, pareto=True) for i, r in enumerate(rows)]
    keep: dict[tuple, ConfigResult] = {}
    for r in rows:
        key = (r.layout, r.pd if r.pd == "colocated" else "pd")
        cur = keep.get(key)
        if cur is None or (r.fits and r.meets_sla, _rank(r)) > (cur.fits and cur.meets_sla, _rank(cur)):
            keep[key] = r
    chosen = {id(r) for r in keep.values()} | {id(r) for r in rows if r.pareto}
    configs = sorted((r for r in rows if id(r) in chosen), key=lambda r: (not r.fits, -r.tokens_per_s_per_gpu))
    ok = [r for r in rows if r.fits and r.meets_sla and (allow_quantized or not r.quality)]
    best = max(ok, key=_rank) if ok else None
    msg = _message(spec, hw, gpus, rows, best, target, allow_quantized)
    return SearchResult(spec.name, hw.name, gpus, traffic, sla, configs, best, f"{msg} [{objective}]", objective,
                        allow_quantized)


def _with(r: ConfigResult, **changes) -> ConfigResult:
    return replace(r, **changes)


def _message(spec, hw, gpus, rows, best, sla, allow_quantized=False) -> str:
    where = f"{spec.name} on {gpus}x {hw.name}"
    fitting = [r for r in rows if r.fits]
    exact = [r for r in fitting if not r.quality]
    if best is None and fitting and not allow_quantized and (not exact or any(
            r.meets_sla for r in fitting if r.quality) and not any(r.meets_sla for r in exact)):
        q = max((r for r in fitting if r.meets_sla) or fitting, key=_rank)
        return (f"{where}: only quantized configurations {'fit' if not exact else 'meet ' + sla.describe()} "
                f"(e.g. {q.label()}: {', '.join(q.quality)}, {q.tokens_per_s_per_gpu:.1f} tokens/s/GPU); "
                f"pass --allow-quantized to accept the quality trade-off")
    if not fitting:
        need = min(r.memory.weights for r in rows) / 1e9
        return (f"{where}: no layout fits in memory in any dtype (at least {need:.1f} GB of weights per GPU "
                f"against {hw.usable_bytes / 1e9:.1f} GB usable)")
    if best is None:
        fast = min(fitting, key=lambda r: r.tpot_ms)
        quick = min(fitting, key=lambda r: r.ttft_ms)
        if not math.isfinite(quick.ttft_ms):
            return f"{where}: every configuration is overloaded by the traffic's arrival rate (unbounded queue)"
        return (f"{where}: no configuration meets {sla.describe()}; the lowest TPOT is {fast.tpot_ms:.2f} ms "
                f"({fast.label()}), the lowest TTFT {quick.ttft_ms:.2f} ms ({quick.label()})")
    return (f"{where}: best {best.label()}{' kv ' + best.layout.kv_dtype if best.layout.kv_dtype != 'bf16' else ''}: "
            f"{best.tokens_per_s_per_gpu:.1f} tokens/s/GPU, "
            f"{best.tokens_per_s_per_user:.1f} tokens/s/user, TTFT {best.ttft_ms:.2f} ms, TPOT {best.tpot_ms:.2f} ms")
