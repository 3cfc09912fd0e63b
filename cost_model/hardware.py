"""The hardware catalogue: peak FLOP/s per dtype, HBM capacity and bandwidth, and the interconnect.

Figures come from ``hardware.json`` next to this file (vendor datasheets, dense tensor-core
throughput). ``cpu`` is not in the file: it is measured at run time with a quick numpy probe
(copy bandwidth and fp32 matmul throughput, ~0.2 s, once per process).

    hw = get_hardware("h200")          # or an alias: "nvl72" -> gb200
    hw.peak_flops("fp8")               # 1.978e15
    hw.usable_bytes                    # HBM the engine may use for weights, KV and activations

Efficiency defaults (before calibration) follow what is seen in practice: ~0.8 of datasheet HBM
bandwidth, ~0.7 of peak tensor-core throughput on large GEMMs, ~3 us fixed cost per kernel,
~10 us per point-to-point message, ~0.375 GB of communication buffers per GPU.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import os
import time
from dataclasses import dataclass, field
from pathlib import Path

from persistent_engine.models.spec import DTYPE_BYTES as _SPEC_DTYPE_BYTES

CATALOGUE_FILE = Path(__file__).with_name("hardware.json")

# weight dtypes the cost model knows; activations and the KV cache stay in bf16 unless told otherwise
WEIGHT_DTYPES = ("bf16", "fp8", "fp4")
# the dtype names the cost model accepts, their bytes from the one table (persistent_engine.models.spec)
DTYPE_BYTES = {k: _SPEC_DTYPE_BYTES[k] for k in ("bf16", "fp16", "fp32", "fp8", "fp4")}


class CostModelError(ValueError):
    """A bad input to the cost model (unknown hardware, impossible layout, bad measurements file).
    The CLI prints it as one line and exits 2."""

    user_error = True


@dataclass(frozen=True)
class Hardware:
    name: str                       # canonical catalogue name ("h200", "cpu")
    label: str                      # human-readable ("NVIDIA H200")
    tflops: dict                    # dtype -> dense TFLOP/s, None when the dtype has no tensor cores; fp32: FFMA (no TF32)
    hbm_bytes: float                # memory per device
    hbm_bw: float                   # bytes/s, datasheet
    scale_up_bw: float              # bytes/s per GPU, one direction, inside the scale-up domain
    domain: int                     # GPUs in one scale-up domain (NVLink / Infinity Fabric)
    scale_out_bw: float             # bytes/s per GPU across domains
    vendor: str = "nvidia"
    mem_efficiency: float = 0.8     # achievable fraction of hbm_bw
    compute_efficiency: float = 0.7  # achievable fraction of peak on large GEMMs
    kernel_overhead_s: float = 3e-6  # fixed cost per kernel (launch, tail)
    message_latency_s: float = 10e-6  # fixed cost per collective / point-to-point message
    hop_latency_s: float = 1e-6     # per ring step inside the domain (x5 across domains)
    comm_buffer_bytes: float = 0.375e9  # NCCL-style buffers per GPU when it talks to others
    memory_utilization: float = 0.92  # fraction of hbm_bytes the engine may claim
    measured: bool = False          # True for the cpu probe
    aliases: tuple = field(default=(), compare=False)

    def supports(self, dtype: str) -> bool:
        return self.tflops.get(dtype) is not None

    def peak_flops(self, dtype: str) -> float:
        """Dense FLOP/s for GEMMs with ``dtype`` operands; bf16 for anything without tensor cores."""
        t = self.tflops.get(dtype)
        if t is None:
            t = self.tflops["bf16"]
        return float(t) * 1e12

    @property
    def usable_bytes(self) -> float:
        return self.hbm_bytes * self.memory_utilization

    @property
    def mem_bw(self) -> float:
        """Achievable memory bandwidth (bytes/s) before calibration."""
        return self.hbm_bw * self.mem_efficiency

    def replace(self, **changes) -> "Hardware":
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d["aliases"] = list(self.aliases)
        return d


@functools.lru_cache(maxsize=1)
def _catalogue() -> dict[str, Hardware]:
    raw = json.loads(CATALOGUE_FILE.read_text())["devices"]
    out = {}
    for name, d in raw.items():
        out[name] = Hardware(name=name, label=d["label"], vendor=d["vendor"], tflops=dict(d["tflops"]),
                             hbm_bytes=float(d["hbm_bytes"]), hbm_bw=float(d["hbm_bw"]),
                             scale_up_bw=float(d["scale_up_bw"]), domain=int(d["domain"]),
                             scale_out_bw=float(d["scale_out_bw"]), aliases=tuple(d.get("aliases", ())))
    return out


def _alias_table() -> dict[str, str]:
    table = {"cpu": "cpu"}
    for name, hw in _catalogue().items():
        table[name] = name
        for a in hw.aliases:
            table[a] = name
    return table


def known_hardware() -> list[str]:
    """Canonical names, catalogue order, ``cpu`` last."""
    return [*_catalogue(), "cpu"]


def resolve_name(name: str) -> str:
    key = str(name).strip().lower().replace("_", "-")
    table = _alias_table()
    if key in table:
        return table[key]
    compact = key.replace("-", "").replace(" ", "")
    for alias, canon in table.items():
        if alias.replace("-", "") == compact:
            return canon
    raise CostModelError(f"unknown hardware {name!r}; known: {', '.join(known_hardware())} "
                         f"(aliases: {', '.join(sorted(a for a in table if a not in known_hardware()))})")


def get_hardware(name: str) -> Hardware:
    """The catalogue entry for ``name`` (or an alias); ``cpu`` is probed on this machine."""
    canon = resolve_name(name)
    if canon == "cpu":
        return probe_cpu()
    return _catalogue()[canon]


def _best_time(fn, reps: int) -> float:
    best = float("inf")
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


@functools.lru_cache(maxsize=1)
def probe_cpu() -> Hardware:
    """Measure this CPU: copy bandwidth over a 64 MiB array (read + write counted) and fp32
    matmul throughput (1024^3, 2.1 GFLOP). Efficiencies are 1.0 because the figures are achieved
    ones; calibration corrects for torch's bf16 kernels being slower than numpy's fp32 BLAS."""
    import numpy as np

    n = 16 * 1024 * 1024                       # 64 MiB of fp32
    a = np.ones(n, dtype=np.float32)
    b = np.empty_like(a)
    t_copy = _best_time(lambda: np.copyto(b, a), 5)
    bw = 2 * a.nbytes / t_copy
    m = np.random.default_rng(0).standard_normal((1024, 1024)).astype(np.float32)
    t_mm = _best_time(lambda: m @ m, 3)
    flops = 2 * 1024 ** 3 / t_mm
    try:
        mem = float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        mem = 16e9
    tf = flops / 1e12
    return Hardware(name="cpu", label=f"CPU ({os.cpu_count()} cores, measured)", vendor="cpu",
                    tflops={"bf16": tf, "fp8": tf, "fp4": None}, hbm_bytes=mem, hbm_bw=bw,
                    scale_up_bw=bw / 2, domain=1, scale_out_bw=1e9, mem_efficiency=1.0,
                    compute_efficiency=1.0, kernel_overhead_s=10e-6, message_latency_s=20e-6,
                    comm_buffer_bytes=0.0, memory_utilization=0.5, measured=True)
