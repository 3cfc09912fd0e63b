"""Per-op efficiency curves fitted to measured kernel latencies, and their transfer to GPUs with no data.

The measurements are NVIDIA AIConfigurator's timings of vLLM's kernels on H100 SXM and H200 SXM
(``cost_model/data/``: fitted curves plus a subsample of the measurements, with provenance and the
Apache-2.0 licence; ``scripts/calibrate_aiconfigurator.py`` regenerates them from the parquet files).

One op at one shape on one GPU, per op family (gemm, moe, attention_decode, attention_prefill,
and the decode attention modules mla_decode (DeepSeek-V3) and dsa_decode (DeepSeek-V3.2 sparse
attention)) and dtype:

    t_mem  = bytes / hbm_bw          t_comp = flops / peak[compute dtype]      datasheet figures
    t_roof = max(t_mem, t_comp)
    u = log10(t_comp / t_mem)        where the shape sits against the ridge point (u > 0: compute-bound)
    v = log10(t_roof / 1 us)         how big it is (small kernels pay launch, tail and occupancy)
    t = t_roof * exp(P(u, v))        P a full cubic in (u, v), (u, v) clamped to the fitted range,
                                     and t >= t_roof (no kernel beats the datasheet)

so the achieved fraction of the roofline, exp(-P), is a smooth function of arithmetic intensity
relative to the ridge point and of problem size; one curve per family and dtype (10 coefficients),
fitted by least squares on log(t / t_roof), i.e. on relative error.

Transfer to a GPU with no data (B200, B300, GB200/GB300, MI300X, MI355X): (u, v) are computed with
*that* GPU's datasheet peak and bandwidth, and the curve comes from the measured GPU whose ridge
point (bf16 peak / HBM bandwidth) is nearest in log scale (H100 295 FLOP/B, H200 206; B200 292 and
B300 290 take H100's, MI300X 247 H200's). In other words: at the same position against its ridge
and the same kernel duration, a GPU reaches the same fraction of its datasheet. A dtype the
measured GPU lacks (fp4 on Hopper) takes the fp8 curve with the target's fp4 peak and 0.5-byte
weights. The AMD parts have no measurements of their own: their figures are NVIDIA curves on AMD
datasheets, a projection.

Collectives: the measured NCCL latencies (all_reduce, all_gather, all_to_all, reduce_scatter over 2,
4, 8 GPUs, 256 B - 512 MB) are interpolated log-log. Elsewhere the latency part (the smallest
message's time) is kept and the bandwidth part scaled by the scale-up bandwidth ratio; more GPUs
than measured scale the bandwidth part by the ring factor ((n-1)/n against 7/8) and, for ring
collectives (not all-to-all), add per-hop latency; beyond the scale-up domain the bandwidth is the scale-out one.
"""

from __future__ import annotations

import functools
import itertools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from cost_model.hardware import DTYPE_BYTES, CostModelError, Hardware

DATA_DIR = Path(__file__).with_name("data")
MEASURED_GPUS = ("h100", "h200")
FAMILIES = ("gemm", "moe", "attention_decode", "attention_prefill", "mla_decode", "dsa_decode")
MODULES = ("mla_decode", "dsa_decode")  # whole attention modules of one layer; their dtype key is weights/KV
DSA_TOPK, DSA_INDEX_HEADS, DSA_INDEX_DIM = 2048, 64, 128     # DeepSeek-V3.2's lightning indexer
COLLECTIVES = ("all_reduce", "all_gather", "all_to_all", "reduce_scatter")
U_CLIP = (-4.0, 4.0)
ACT = 2.0                               # bf16 activation bytes


# ------------------------------------------------------------------ roofline of one op at one shape
DTYPES = ("bf16", "fp8", "fp8_block", "fp4")     # fp8: per-tensor scales; fp8_block: 128x128 blocks


def weight_bytes(dtype: str) -> float:
    if dtype not in (*DTYPES, "fp16"):
        raise CostModelError(f"unknown dtype {dtype!r}; one of {', '.join(DTYPES)}")
    return DTYPE_BYTES["fp8" if dtype == "fp8_block" else dtype]


def compute_dtype(dtype: str, hw: Hardware) -> str:
    """The tensor-core dtype an op of ``dtype`` operands runs in (weight-only fp4 on a GPU without
    fp4 tensor cores dequantizes to bf16)."""
    dtype = "fp8" if dtype == "fp8_block" else dtype
    return dtype if hw.supports(dtype) else "bf16"


def _moe_rank_load(tokens: float, topk: int, experts: int, ep: int, skew: float) -> tuple[float, float]:
    """(token-expert assignments, distinct experts touched) on the busiest EP rank. ``skew`` 0:
    balanced routing (every rank gets T k / ep assignments spread evenly); > 0: Zipf popularity with
    that exponent, experts placed round-robin by popularity, expert e touched with probability
    1 - (1 - min(1, k p_e))^T."""
    local = max(1, experts // ep)
    if skew <= 0:
        assign = tokens * topk / ep
        return assign, min(float(local), assign)
    p = np.arange(1, experts + 1, dtype=float) ** -skew
    p /= p.sum()
    hot = max((p[r::ep] for r in range(ep)), key=lambda x: x.sum())
    assign = tokens * topk * hot.sum()
    distinct = float(np.sum(1.0 - (1.0 - np.minimum(1.0, topk * hot)) ** tokens))
    return assign, max(distinct, min(1.0, assign))


def _mla_module(shape: dict, hw: Hardware, dtype: str, kv_dtype: str) -> tuple[float, float]:
    """(memory s, compute s) at datasheet figures of one layer's MLA attention module in decode
    (DeepSeek-V3 geometry: projections, absorbed BMMs, the latent-cache kernel, o_proj), with
    ``heads`` query heads on this GPU (128 / heads-way tensor parallel)."""
    from cost_model.layout import Layout
    from cost_model.ops import _attention_ops

    spec = _deepseek_v3()
    heads = int(shape["heads"])
    layout = Layout(tp=max(1, spec.num_heads // heads), dtype=dtype, kv_dtype=kv_dtype)
    t_mem = t_comp = 0.0
    for op in _attention_ops(spec, layout, int(shape["batch"]), 1, int(shape["ctx"])):
        t_mem += op.bytes / hw.hbm_bw
        t_comp += op.flops / hw.peak_flops(compute_dtype(op.dtype, hw))
    return t_mem, t_comp


def _dsa_module(shape: dict, hw: Hardware, dtype: str, kv_dtype: str) -> tuple[float, float]:
    """(memory s, compute s) of DeepSeek-V3.2's sparse-attention module in decode: the MLA module
    over the top-2048 selected keys, plus the lightning indexer (q / k / head-weight projections,
    a read of the fp8 index-key cache, 128 bytes + a 4-byte scale per cached token, its scores
    over every cached token and the top-k over them)."""
    b, ctx = float(shape["batch"]), float(shape["ctx"])
    t_mem, t_comp = _mla_module({**shape, "ctx": min(ctx, DSA_TOPK)}, hw, dtype, kv_dtype)
    h, q_rank, width = 7168, 1536, DSA_INDEX_HEADS * DSA_INDEX_DIM
    proj = q_rank * width + h * DSA_INDEX_DIM + h * DSA_INDEX_HEADS          # wq_b, wk, weights_proj
    nbytes = proj * weight_bytes(dtype) + b * ctx * (DSA_INDEX_DIM + 4) + 2 * b * ctx * 4
    flops = 2 * b * proj + 2 * b * width * ctx
    return t_mem + nbytes / hw.hbm_bw, t_comp + flops / hw.peak_flops(compute_dtype(dtype, hw))


@functools.lru_cache(maxsize=1)
def _deepseek_v3():
    """DeepSeek-V3's attention geometry (the model AIConfigurator's MLA tables measure)."""
    from persistent_engine.models.spec import ModelSpec

    return ModelSpec(name="deepseek-v3-mla", family="deepseek_v3", hidden_size=7168, num_layers=61,
                     vocab_size=129280, num_heads=128, num_kv_heads=128, head_dim=192, intermediate_size=18432,
                     q_lora_rank=1536, kv_lora_rank=512, qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128)


def roofline_parts(family: str, shape: dict, hw: Hardware, dtype: str = "bf16",
                   kv_dtype: str | None = None) -> tuple[float, float]:
    """(memory seconds, compute seconds) of one op at ``shape`` on ``hw`` at datasheet figures.
    ``dtype``: weights (gemm, moe, mla_decode) or the KV cache (attention); ``kv_dtype``: MLA's cache."""
    s = {k: float(v) for k, v in shape.items()}
    if family == "gemm":
        m, n, k = s["m"], s["n"], s["k"]
        a_in = 1.0 if dtype in ("fp8", "fp8_block") else ACT                     # fp8 GEMMs quantize activations too
        flops, nbytes = 2 * m * n * k, k * n * weight_bytes(dtype) + m * k * a_in + m * n * ACT
    elif family == "moe":
        h, inter = s["hidden"], s["inter"] / s.get("tp", 1.0)
        assign, distinct = _moe_rank_load(s["tokens"], int(s["topk"]), int(s["experts"]), int(s.get("ep", 1)),
                                          s.get("skew", 0.0))
        flops = 2 * 3 * h * inter * assign                        # w13 [2I, H] and w2 [H, I] per assignment
        nbytes = distinct * 3 * h * inter * weight_bytes(dtype) + assign * (2 * h + 3 * inter) * ACT
    elif family == "attention_decode":
        w = s.get("window", 0.0)
        keys = min(s["ctx"], w) if w > 0 else s["ctx"]
        b, hq, hk, d = s["batch"], s["heads"], s["kv_heads"], s["head_dim"]
        flops = 4 * b * hq * d * keys
        nbytes = b * keys * 2 * hk * d * weight_bytes(dtype) + 2 * b * hq * d * ACT
        dtype = "bf16"
    elif family == "attention_prefill":
        n, w = s["isl"], s.get("window", 0.0)
        keys = n * (n + 1) / 2 if not w or w >= n else w * (w + 1) / 2 + (n - w) * w   # causal key count
        b, hq, hk, d = s["batch"], s["heads"], s["kv_heads"], s["head_dim"]
        flops = 4 * b * hq * d * keys
        nbytes = b * n * (2 * hq * d * ACT + 2 * hk * d * weight_bytes(dtype))
        dtype = "bf16"
    elif family == "mla_decode":
        return _mla_module(shape, hw, dtype, kv_dtype or "bf16")
    elif family == "dsa_decode":
        return _dsa_module(shape, hw, dtype, kv_dtype or "bf16")
    else:
        raise CostModelError(f"unknown op family {family!r}; one of {', '.join(FAMILIES)}")
    return nbytes / hw.hbm_bw, flops / hw.peak_flops(compute_dtype(dtype, hw))


# ------------------------------------------------------------------ the curve
def _lg(x: float) -> float:
    return math.log2(max(float(x), 1.0))


def shape_variables(family: str, shape: dict) -> list[float]:
    """The dimensions a family's efficiency depends on besides (u, v), log2-scaled: tile and wave
    quantization (GEMM M, N, K), experts per rank and tokens per expert (MoE), heads and the KV
    length (attention)."""
    s = shape
    if family == "gemm":
        return [_lg(s["m"]), _lg(s["n"]), _lg(s["k"])]
    if family == "moe":
        return [_lg(s["tokens"]), _lg(s["hidden"]), _lg(s["inter"] / s.get("tp", 1)), _lg(s["topk"]),
                _lg(s["experts"] / s.get("ep", 1)), float(s.get("skew", 0.0))]
    if family == "attention_decode":
        w = s.get("window", 0)
        return [_lg(s["batch"]), _lg(min(s["ctx"], w) if w else s["ctx"]), _lg(s["heads"]), _lg(s["kv_heads"]),
                _lg(s["head_dim"])]
    if family == "attention_prefill":
        return [_lg(s["batch"]), _lg(s["isl"]), _lg(s["heads"]), _lg(s["kv_heads"]), _lg(s["head_dim"]),
                _lg(s.get("window", 0) + 1)]
    if family in MODULES:
        return [_lg(s["batch"]), _lg(s["ctx"]), _lg(s["heads"])]
    raise CostModelError(f"unknown op family {family!r}; one of {', '.join(FAMILIES)}")


DEGREE = {"attention_decode": 4, "gemm": 4}        # polynomial degree per family (default 3)


@functools.lru_cache(maxsize=None)
def monomials(nvars: int, degree: int) -> list[tuple]:
    """Exponent index tuples of every monomial of total degree <= ``degree``, in a fixed order."""
    out: list[tuple] = [()]
    for d in range(1, degree + 1):
        out += list(itertools.combinations_with_replacement(range(nvars), d))
    return out


@functools.lru_cache(maxsize=None)
def exponents(nvars: int, degree: int) -> np.ndarray:
    """[monomials, vars] exponent matrix of ``monomials``."""
    e = np.zeros((len(monomials(nvars, degree)), nvars))
    for i, m in enumerate(monomials(nvars, degree)):
        for j in m:
            e[i, j] += 1
    return e


def uv(t_mem, t_comp) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(u, v, t_roof) of arrays of memory and compute seconds."""
    t_mem, t_comp = np.asarray(t_mem, dtype=float), np.asarray(t_comp, dtype=float)
    t_roof = np.maximum(t_mem, t_comp)
    u = np.clip(np.log10(np.maximum(t_comp, 1e-15) / np.maximum(t_mem, 1e-15)), *U_CLIP)
    return u, np.log10(np.maximum(t_roof, 1e-15) / 1e-6), t_roof


def variables(family: str, shapes: list[dict], t_mem, t_comp) -> np.ndarray:
    """[rows, 2 + shape variables]: u, v, then ``shape_variables``."""
    u, v, _ = uv(t_mem, t_comp)
    dims = np.array([shape_variables(family, s) for s in shapes], dtype=float).reshape(len(shapes), -1)
    return np.column_stack([np.atleast_1d(u), np.atleast_1d(v), dims])


@dataclass(frozen=True)
class Curve:
    """log(t / t_roof) = sum_j coef_j * monomial_j(z), z = the standardized ``variables`` clipped
    to the range they were fitted on (lo, hi: raw units)."""

    family: str
    degree: int
    coef: tuple
    mean: tuple
    std: tuple
    lo: tuple
    hi: tuple
    rows: int = 0
    floor_s: float = 0.0            # the fastest measured latency: launch and sync, what no GPU speeds up

    def design(self, z: np.ndarray) -> np.ndarray:
        """[rows, monomials] of the variables ``z`` [rows, vars]."""
        z = (np.clip(z, self.lo, self.hi) - np.asarray(self.mean)) / np.asarray(self.std)
        e = exponents(z.shape[1], self.degree)                         # [monomials, vars]
        return np.prod(z[:, None, :] ** e[None, :, :], axis=2)

    def seconds(self, shapes: list[dict], t_mem, t_comp) -> np.ndarray:
        """Modelled seconds of each op (``t_mem``, ``t_comp`` arrays matching ``shapes``)."""
        t_mem, t_comp = np.atleast_1d(np.asarray(t_mem, dtype=float)), np.atleast_1d(np.asarray(t_comp, dtype=float))
        z = variables(self.family, shapes, t_mem, t_comp)
        ratio = np.maximum(1.0, np.exp(np.minimum(self.design(z) @ np.asarray(self.coef), 20.0)))
        return np.maximum(t_mem, t_comp) * ratio

    def to_dict(self) -> dict:
        r = lambda xs, n=6: [round(float(x), n) for x in xs]          # noqa: E731
        return {"family": self.family, "degree": self.degree, "coef": r(self.coef), "mean": r(self.mean, 4),
                "std": r(self.std, 4), "lo": r(self.lo, 4), "hi": r(self.hi, 4), "rows": self.rows,
                "floor_s": float(f"{self.floor_s:.4g}")}

    @classmethod
    def from_dict(cls, d: dict) -> "Curve":
        t = lambda k: tuple(float(x) for x in d[k])                   # noqa: E731
        return cls(str(d["family"]), int(d["degree"]), t("coef"), t("mean"), t("std"), t("lo"), t("hi"),
                   int(d.get("rows", 0)), float(d.get("floor_s", 0.0)))


def fit_curve(family: str, shapes: list[dict], t_mem, t_comp, measured, ridge: float = 1e-6,
              degree: int | None = None) -> Curve:
    """Least squares of log(measured / t_roof) on the monomials of the standardized variables (a
    weak ridge keeps the polynomial tame where the data is thin); ``measured`` in seconds."""
    z = variables(family, shapes, t_mem, t_comp)
    mean, std = z.mean(axis=0), z.std(axis=0) + 1e-9
    lo, hi = z.min(axis=0), z.max(axis=0)
    degree = degree or DEGREE.get(family, 3)
    curve = Curve(family, degree, (), tuple(mean), tuple(std), tuple(lo), tuple(hi), len(shapes))
    a = curve.design(z)
    y = np.log(np.asarray(measured, dtype=float) / np.maximum(np.asarray(t_mem), np.asarray(t_comp)))
    reg = ridge * len(y) * np.diag((np.arange(a.shape[1]) > 0).astype(float))
    coef = np.linalg.solve(a.T @ a + reg, a.T @ y)
    return Curve(family, degree, tuple(coef.tolist()), tuple(mean), tuple(std), tuple(lo), tuple(hi), len(shapes),
                 float(np.min(measured)))


# ------------------------------------------------------------------ shipped tables
@functools.lru_cache(maxsize=None)
def load_tables(gpu: str) -> dict:
    """The shipped calibration of one measured GPU: ``curves`` (family -> dtype -> Curve dict),
    ``nccl`` (collective -> GPUs -> [[bytes, seconds], ...]), ``provenance``."""
    path = DATA_DIR / f"aiconfigurator_{gpu}.json"
    try:
        return json.loads(path.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise CostModelError(f"cannot read the shipped calibration {path}: {e}") from None


def ridge_point(hw: Hardware) -> float:
    """bf16 FLOP per byte of HBM at which an op turns compute-bound."""
    return hw.peak_flops("bf16") / hw.hbm_bw


def source_gpu(hw: Hardware) -> str:
    """The measured GPU whose curves ``hw`` uses: itself when measured, else the nearest ridge point."""
    if hw.name in MEASURED_GPUS:
        return hw.name
    from cost_model.hardware import get_hardware

    return min(MEASURED_GPUS, key=lambda g: abs(math.log(ridge_point(get_hardware(g)) / ridge_point(hw))))


def curve_key(family: str, dtype: str, kv_dtype: str | None = None) -> str:
    return f"{dtype}/{kv_dtype or 'bf16'}" if family in MODULES else dtype


def curve_for(hw: Hardware, family: str, dtype: str, kv_dtype: str | None = None) -> tuple[Curve, str, str]:
    """(curve, the dtype it was measured in, note) for ``family`` in ``dtype`` on ``hw`` (the curve
    of ``source_gpu(hw)``); the note says how it was obtained, for the output."""
    gpu = source_gpu(hw)
    curves = load_tables(gpu)["curves"].get(family, {})
    key = curve_key(family, dtype, kv_dtype)
    note = f"fitted on {gpu} measurements" if gpu == hw.name else \
        f"{gpu} curve transferred by datasheet compute and bandwidth (nearest ridge point)"
    if key not in curves:
        order = {"fp8": ("fp8_block",), "fp8_block": ("fp8",), "fp4": ("fp8", "fp8_block")}.get(dtype, ())
        fallback = [k for k in (*(curve_key(family, d, kv_dtype) for d in order), curve_key(family, "bf16", kv_dtype),
                                curve_key(family, "bf16", "bf16"), "bf16") if k in curves]
        if not fallback:
            raise CostModelError(f"no calibration for {family} on {hw.name}")
        note += f"; no {key} data: the {fallback[0]} curve"
        key = fallback[0]
    return Curve.from_dict(curves[key]), key.split("/")[0], note


# ------------------------------------------------------------------ collectives
def _interp_loglog(table: list, nbytes: float) -> float:
    x = np.log([max(r[0], 1.0) for r in table])
    y = np.log([r[1] for r in table])
    lx = math.log(max(nbytes, 1.0))
    if lx >= x[-1]:                                   # beyond the largest message: bandwidth-bound, linear
        return float(math.exp(y[-1]) * nbytes / table[-1][0])
    return float(math.exp(np.interp(lx, x, y)))


_HW: dict = {}


def _hw_key(hw: Hardware) -> tuple:
    """A hashable key of the figures a cached cost depends on (Hardware holds a dict)."""
    key = (hw.name, hw.hbm_bw, tuple(sorted(hw.tflops.items())), hw.scale_up_bw, hw.scale_out_bw, hw.domain,
           hw.hop_latency_s)
    _HW.setdefault(key, hw)
    return key


def collective_seconds(hw: Hardware, collective: str, gpus: int, nbytes: float) -> float:
    """Seconds of one NCCL collective over ``gpus`` GPUs moving ``nbytes`` per GPU (the message
    size of nccl-tests: all_gather / reduce_scatter the whole buffer); memoized."""
    return _collective_seconds(_hw_key(hw), collective, int(gpus), float(nbytes))


@functools.lru_cache(maxsize=100_000)
def _collective_seconds(key: tuple, collective: str, gpus: int, nbytes: float) -> float:
    hw = _HW[key]
    if gpus <= 1 or nbytes <= 0:
        return 0.0
    if collective not in COLLECTIVES:
        raise CostModelError(f"unknown collective {collective!r}; one of {', '.join(COLLECTIVES)}")
    gpu = source_gpu(hw) if hw.vendor != "cpu" else "h200"
    from cost_model.hardware import get_hardware

    ref = get_hardware(gpu)
    tables = load_tables(gpu)["nccl"][collective]
    n_ref = min((int(n) for n in tables), key=lambda n: (abs(n - min(gpus, 8)), n))
    table = tables[str(n_ref)]
    t = _interp_loglog(table, nbytes)
    alpha = table[0][1]
    bw = hw.scale_up_bw if gpus <= hw.domain else hw.scale_out_bw
    ring = ((gpus - 1) / gpus) / ((n_ref - 1) / n_ref)
    # ring collectives add a step per extra GPU; an all-to-all sends to every peer at once
    hop = hw.hop_latency_s * (1 if gpus <= hw.domain else 5)
    hops = 0.0 if collective == "all_to_all" else max(0, gpus - n_ref) * hop
    return alpha + hops + max(0.0, t - alpha) * ring * ref.scale_up_bw / bw


# ------------------------------------------------------------------ one op, as the CLI asks
@dataclass(frozen=True)
class OpLatency:
    op: str
    hw: str
    dtype: str
    shape: dict
    seconds: float
    roofline_s: float
    bound: str                  # memory | compute | comm
    note: str = ""
    extra: dict = field(default_factory=dict)

    @property
    def efficiency(self) -> float:
        return self.roofline_s / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict:
        return {"op": self.op, "hw": self.hw, "dtype": self.dtype, "shape": self.shape,
                "latency_ms": self.seconds * 1e3, "roofline_ms": self.roofline_s * 1e3,
                "efficiency": round(self.efficiency, 4), "bound": self.bound, "calibration": self.note, **self.extra}


def op_latency(family: str, hw: Hardware, shape: dict, dtype: str = "bf16", kv_dtype: str | None = None) -> OpLatency:
    """Modelled latency of one op (a family of ``FAMILIES``) at ``shape`` on ``hw``."""
    t_mem, t_comp = roofline_parts(family, shape, hw, dtype, kv_dtype)
    bound = "compute" if t_comp > t_mem else "memory"
    if hw.vendor == "cpu":
        t = max(t_mem / hw.mem_efficiency, t_comp / hw.compute_efficiency) + hw.kernel_overhead_s
        return OpLatency(family, hw.name, dtype, shape, t, max(t_mem, t_comp), bound,
                         "measured CPU figures, uncalibrated roofline")
    return OpLatency(family, hw.name, dtype, shape, float(modelled_seconds(family, hw, [shape], dtype, kv_dtype)[0]),
                     max(t_mem, t_comp), bound, curve_for(hw, family, dtype, kv_dtype)[2])


def modelled_seconds(family: str, hw: Hardware, shapes: list[dict], dtype: str = "bf16",
                     kv_dtype: str | None = None, source: str | None = None, exact: bool = False) -> np.ndarray:
    """Seconds of each op at ``shapes`` on ``hw`` (see ``_modelled``). Weights in "fp8" (gemm, moe)
    take the faster of vLLM's per-tensor and block-scaled fp8 kernels, as a deployment would,
    unless ``exact`` (the per-tensor curve only)."""
    t = _modelled(family, hw, shapes, dtype, kv_dtype, source)
    if dtype == "fp8" and not exact and family in ("gemm", "moe"):
        t = np.minimum(t, _modelled(family, hw, shapes, "fp8_block", kv_dtype, source))
    return t


def _modelled(family: str, hw: Hardware, shapes: list[dict], dtype: str, kv_dtype: str | None,
              source: str | None) -> np.ndarray:
    """Seconds of each op at ``shapes`` on ``hw`` from the curves. On a measured GPU: the curve.
    Elsewhere: the curve's time t_ref on the source GPU, its launch floor a kept and the rest scaled
    by the roofline ratio, t = a + (t_ref - a) * t_roof(hw) / t_roof(source) (memory-bound ops by
    the bandwidth ratio, compute-bound ones by the peak ratio, each bound taken on its own GPU).
    ``source`` forces the measured GPU whose curve is used (to validate the transfer: h100 -> h200)."""
    from cost_model.hardware import get_hardware

    ref = get_hardware(source or source_gpu(hw))
    curve, ref_dtype, _ = _cached_curve(ref.name, family, dtype, kv_dtype)
    ref_kv = kv_dtype if family in MODULES else None
    parts = np.array([roofline_parts(family, s, ref, ref_dtype, ref_kv) for s in shapes]).reshape(-1, 2)
    t_ref = curve.seconds(shapes, parts[:, 0], parts[:, 1])
    if ref.name == hw.name:
        return t_ref
    mine = np.array([roofline_parts(family, s, hw, dtype, kv_dtype) for s in shapes]).reshape(-1, 2)
    floor = np.minimum(curve.floor_s, t_ref)
    return floor + (t_ref - floor) * mine.max(axis=1) / parts.max(axis=1)


def collective_latency(collective: str, hw: Hardware, gpus: int, nbytes: float) -> OpLatency:
    t = collective_seconds(hw, collective, gpus, nbytes)
    bw = hw.scale_up_bw if gpus <= hw.domain else hw.scale_out_bw
    note = "NCCL 2.29.2 measured on " + (source_gpu(hw) if hw.vendor != "cpu" else "h200")
    if hw.name not in MEASURED_GPUS:
        note += ", bandwidth part scaled by scale-up bandwidth"
    return OpLatency(collective, hw.name, "bf16", {"bytes": nbytes, "gpus": gpus}, t, nbytes / bw, "comm", note)


# ------------------------------------------------------------------ whole steps (cost_model.estimate)
@functools.lru_cache(maxsize=None)
def _cached_curve(hw_name: str, family: str, dtype: str, kv_dtype: str | None):
    from cost_model.hardware import get_hardware

    return curve_for(get_hardware(hw_name), family, dtype, kv_dtype)


@dataclass(frozen=True)
class CurveEfficiency:
    """Per-op step costing for ``cost_model.estimate``: an op carrying a measured family's shape
    (GEMMs, routed experts, attention kernels) takes that family's curve, scaled by its own
    roofline against the family's at that shape (t = curve(shape) * t_roof(op) / t_roof(shape):
    1 where the formulas agree; it carries the chunk-over-cache prefill over, and MLA's latent
    kernel takes the measured MLA module's fraction of roofline at its batch, context and heads);
    collectives take the NCCL table; everything else (norms, rotary, routing, sampling,
    point-to-point) the roofline at the hardware's default efficiencies plus its kernel cost
    (``base``, an ``estimate.Efficiency``)."""

    hw: str
    base: object = None
    per_op: bool = True

    def op_seconds(self, op, hw: Hardware, instance_gpus: int = 1) -> float | None:
        """Seconds of all ``op.count`` occurrences of ``op`` (kernel costs included), or None when
        no curve covers it."""
        if op.cls == "comm" and op.collective in COLLECTIVES:
            nbytes = op.bytes * op.group / max(op.group - 1, 1) if op.collective == "all_to_all" else op.bytes
            return collective_seconds(hw, op.collective, op.group, nbytes) * op.count
        for family, shape in op.shape.items():
            t, ref = _shape_seconds(_hw_key(hw), family, op.dtype, tuple(sorted(shape.items())))
            own = max(op.bytes / hw.hbm_bw, op.flops / hw.peak_flops(compute_dtype(op.dtype, hw)))
            return t * (own / ref if ref > 0 else 1.0) * op.count
        return None

    def step_time(self, ops, hw: Hardware, instance_gpus: int = 1) -> tuple[float, dict]:
        """(seconds, seconds per op class plus "overhead") of one stage's ``ops``."""
        from cost_model.estimate import DEFAULT_EFFICIENCY, features

        base = self.base or DEFAULT_EFFICIENCY
        by = {c: 0.0 for c in ("gemm", "attention", "moe", "elementwise", "comm")}
        by["overhead"] = 0.0
        rest = []
        for op in ops:
            t = self.op_seconds(op, hw, instance_gpus)
            if t is None:
                rest.append(op)
            else:
                by[op.cls] += t
        if rest:
            f = features(rest, hw, instance_gpus)
            for c in by:
                if c != "overhead":
                    by[c] += base.class_time(c, f)
            by["overhead"] = base.overhead(hw) * f["kernels"]
        return sum(by.values()), by


@functools.lru_cache(maxsize=200_000)
def _shape_seconds(key: tuple, family: str, op_dtype: str, items: tuple) -> tuple[float, float]:
    """(curve seconds, roofline seconds at datasheet figures) of one op of ``family`` at the shape
    ``items`` on the hardware of ``key``; memoized: a search costs the same shapes for many layouts
    and batches."""
    hw = _HW[key]
    shape = dict(items)
    kv = shape.pop("kv_dtype", None)
    if family.startswith("attention"):
        dtype, kv = kv or "bf16", None
    else:
        dtype = "fp8" if op_dtype == "fp8" and family == "mla_decode" else op_dtype
    return (float(modelled_seconds(family, hw, [shape], dtype, kv)[0]),
            max(roofline_parts(family, shape, hw, dtype, kv)))


def curve_efficiency(hw: Hardware) -> CurveEfficiency | None:
    """The measured-kernel costing for ``hw`` (None on the CPU, which has no curves)."""
    return None if hw.vendor == "cpu" else CurveEfficiency(hw.name)
