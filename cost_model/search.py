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
"""

from __future__ import annotations

from dataclasses import dataclass, field

from cost_model.estimate import DEFAULT_EFFICIENCY, Efficiency, estimate_step
from cost_model.hardware import WEIGHT_DTYPES, CostModelError, Hardware
from cost_model.layout import Layout, MemoryFit, layout_is_valid, max_batch, memory_fit
from cost_model.traffic import TrafficShape

BATCHES = tuple(2 ** i for i in range(12))          # 1 .. 2048 sequences per attention group
MAX_TP = 8


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

    def label(self) -> str:
        pd = "" if self.pd == "colocated" else f" {self.pd}"
        return f"{self.layout.label()} x{self.replicas}{pd} b{self.batch}"

    def to_dict(self) -> dict:
        L = self.layout
        return {"tp": L.tp, "pp": L.pp, "ep": L.ep, "dp": L.dp, "dcp": L.dcp, "dtype": L.dtype,
                "kv_dtype": L.kv_dtype, "batch": self.batch, "replicas": self.replicas, "pd": self.pd,
                "fits": self.fits, "memory": self.memory.to_dict(), "ttft_ms": round(self.ttft_ms, 4),
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

    def to_dict(self) -> dict:
        return {"model": self.model, "hw": self.hw, "gpus": self.gpus, "traffic": self.traffic.to_dict(),
                "sla": {"ttft_ms": self.sla.ttft_ms, "tpot_ms": self.sla.tpot_ms},
                "configs": [c.to_dict() for c in self.configs],
                "best": self.best.to_dict() if self.best else None, "message": self.message}


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def enumerate_layouts(spec, hw: Hardware, gpus: int, dtypes=WEIGHT_DTYPES) -> list[Layout]:
    """Every layout that uses all ``gpus`` as whole instances: tp a power of two up to
    min(8, domain, heads); DP-attention and EP for MoE models; DCP = tp for MLA; pp a power of two."""
    out = []
    dts = [d for d in dtypes if d == "bf16" or hw.supports(d)]
    tps = [t for t in (1, 2, 4, 8) if t <= min(MAX_TP, hw.domain, gpus, spec.num_heads) and gpus % t == 0]
    for dt in dts:
        for tp in tps:
            for dp in (_divisors(gpus // tp) if spec.is_moe else [1]):
                for pp in (p for p in (1, 2, 4, 8) if (gpus // (tp * dp)) % p == 0 and p <= spec.num_layers):
                    eps = [1] if not spec.is_moe else sorted({1, tp * dp} if tp * dp <= spec.num_experts else {1})
                    dcps = [1, tp] if spec.attention == "mla" and tp > 1 else [1]
                    for ep in eps:
                        for dcp in dcps:
                            L = Layout(tp=tp, pp=pp, ep=ep, dp=dp, dcp=dcp, dtype=dt)
                            if layout_is_valid(spec, L) is None:
                                out.append(L)
    return out


def _prefill(spec, hw, L, traffic, eff) -> tuple[float, float]:
    """(TTFT seconds alone, prefills/s one instance sustains)."""
    lat = stage = 0.0
    for p in traffic.prefill_points():
        e = estimate_step(spec, hw, L, p, eff=eff, skew=traffic.expert_skew)
        lat += e.latency_s
        stage += e.stage_s
    rate = L.dp / stage if stage > 0 else float("inf")
    return lat, rate


def _kv_transfer_s(spec, hw, L, traffic) -> float:
    """Moving one request's KV from a prefill to a decode instance, over scale-out links of all
    the instance's GPUs at once."""
    nbytes = traffic.isl * spec.kv_bytes_per_token(L.kv_dtype)
    return hw.message_latency_s + nbytes / (hw.scale_out_bw * L.gpus)


def evaluate_layout(spec, hw: Hardware, gpus: int, L: Layout, traffic: TrafficShape, sla: SLA,
                    eff: Efficiency = DEFAULT_EFFICIENCY, batches=BATCHES) -> list[ConfigResult]:
    """All rows of one layout: colocated and (with >= 2 instances) the best xPyD, per batch."""
    replicas = gpus // L.gpus
    ctx = traffic.max_context
    bmax = max_batch(spec, hw, L, ctx, traffic.chunk)
    t_pf, p_rate = _prefill(spec, hw, L, traffic, eff)
    rows = []
    cap = max(batches) * L.dp
    sizes = sorted({b * L.dp for b in batches if b * L.dp <= bmax} | ({bmax} if 0 < bmax < cap else set()))
    if not sizes:   # does not fit: one row at batch 1 so that the memory figures are reported
        dec = estimate_step(spec, hw, L, {"phase": "decode", "batch": 1, "context": traffic.decode_context},
                            eff=eff, skew=traffic.expert_skew)
        mem = memory_fit(spec, hw, L, 1, ctx, traffic.chunk)
        tpot = dec.latency_s * 1e3
        return [ConfigResult(L, 1, replicas, "colocated", False, mem, t_pf * 1e3, tpot, 0.0, 1e3 / tpot, False)]
    for b in sizes:
        dec = estimate_step(spec, hw, L, {"phase": "decode", "batch": b, "context": traffic.decode_context},
                            eff=eff, skew=traffic.expert_skew)
        mem = memory_fit(spec, hw, L, b, ctx, traffic.chunk)
        inflight = b * L.pp
        tpot = dec.latency_s + inflight / (traffic.osl * p_rate)
        out = replicas * inflight / tpot
        rows.append(ConfigResult(L, b, replicas, "colocated", True, mem, t_pf * 1e3, tpot * 1e3, out / gpus,
                                 1.0 / tpot, sla.met(t_pf * 1e3, tpot * 1e3)))
        if replicas >= 2:
            dec_rate = inflight / dec.latency_s                    # output tokens/s per decode instance
            pre_rate = p_rate * traffic.osl                        # output tokens/s one prefill instance feeds
            x = max(range(1, replicas), key=lambda x: min((replicas - x) * dec_rate, x * pre_rate))
            out = min((replicas - x) * dec_rate, x * pre_rate)
            ttft = (t_pf + _kv_transfer_s(spec, hw, L, traffic)) * 1e3
            tpot_pd = dec.latency_s * 1e3
            rows.append(ConfigResult(L, b, replicas, f"{x}P{replicas - x}D", True, mem, ttft, tpot_pd, out / gpus,
                                     1e3 / tpot_pd, sla.met(ttft, tpot_pd)))
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
           eff: Efficiency | None = None, dtypes=WEIGHT_DTYPES) -> SearchResult:
    """Evaluate every layout; keep per layout and pd mode its best row (under the SLA when any
    row meets it) plus the whole Pareto front; pick the best config that fits and meets the SLA."""
    if gpus < 1:
        raise CostModelError(f"--gpus must be >= 1, got {gpus}")
    traffic = traffic or TrafficShape()
    sla = sla or SLA()
    eff = eff or DEFAULT_EFFICIENCY
    layouts = enumerate_layouts(spec, hw, gpus, dtypes)
    if not layouts:
        raise CostModelError(f"no parallelism layout of {spec.name} uses {gpus} GPUs of {hw.name}")
    rows: list[ConfigResult] = []
    for L in layouts:
        rows += evaluate_layout(spec, hw, gpus, L, traffic, sla, eff)
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
    ok = [r for r in rows if r.fits and r.meets_sla]
    best = max(ok, key=_rank) if ok else None
    return SearchResult(spec.name, hw.name, gpus, traffic, sla, configs, best,
                        _message(spec, hw, gpus, rows, best, sla))


def _with(r: ConfigResult, **changes) -> ConfigResult:
    from dataclasses import replace
    return replace(r, **changes)


def _message(spec, hw, gpus, rows, best, sla) -> str:
    where = f"{spec.name} on {gpus}x {hw.name}"
    fitting = [r for r in rows if r.fits]
    if not fitting:
        need = min(r.memory.weights for r in rows) / 1e9
        return (f"{where}: no layout fits in memory in any dtype (at least {need:.1f} GB of weights per GPU "
                f"against {hw.usable_bytes / 1e9:.1f} GB usable)")
    if best is None:
        fast = min(fitting, key=lambda r: r.tpot_ms)
        quick = min(fitting, key=lambda r: r.ttft_ms)
        return (f"{where}: no configuration meets {sla.describe()}; the lowest TPOT is {fast.tpot_ms:.2f} ms "
                f"({fast.label()}), the lowest TTFT {quick.ttft_ms:.2f} ms ({quick.label()})")
    return (f"{where}: best {best.label()}: {best.tokens_per_s_per_gpu:.1f} tokens/s/GPU, "
            f"{best.tokens_per_s_per_user:.1f} tokens/s/user, TTFT {best.ttft_ms:.2f} ms, TPOT {best.tpot_ms:.2f} ms")
