"""What the optimize loop gathers before it starts engines: the traffic profile and its workload
points, the tiers' layer slices, the device actually present, software versions, and the cost
model's parallelism layout. Each is a thin call into the package that owns it."""

from __future__ import annotations

import dataclasses
import platform
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from persistent_engine import WorkloadPoint


class InputError(ValueError):
    """A bad --traffic, --hw, --device or layer count; printed as one line, exit 2."""

    user_error = True


@dataclass(frozen=True)
class TrafficInput:
    source: str
    profile: dict          # the full profile (stored with the plan; recompile diffs against it)
    summary: dict          # what plan.json carries
    hash: str
    points: tuple[WorkloadPoint, ...]


def read_traffic(path: str, spec: Any, hw: str = "cpu", *, max_points: int = 6,
                 profile_only: bool = False) -> TrafficInput:
    """Profiles a trace and derives the workload points for ``spec`` (the ``max_points`` heaviest,
    weights renormalised to sum to 1; none when ``profile_only``)."""
    from traffic_profiles import build_profile
    from traffic_profiles import read_trace

    if not Path(path).is_file():
        raise InputError(f"traffic file not found: {path}")
    trace = read_trace(path)
    profile = build_profile(trace)
    doc = profile.to_dict()
    summary = {k: doc.get(k) for k in ("rows", "duration_s", "requests_per_s", "input_tokens",
                                       "output_tokens", "interarrival_cv", "prefix_cache_hit_rate")}
    summary = {k: ({q: v.get(q) for q in ("mean", "p50", "p90", "p99", "max")} if isinstance(v, dict) else v)
               for k, v in summary.items()}
    points: list[WorkloadPoint] = []
    if not profile_only:
        points = workload_points(trace, spec, hw, max_points)
        points = sorted(points, key=lambda p: -p.weight)[:max_points]
        total = sum(p.weight for p in points) or 1.0
        points = [dataclasses.replace(p, weight=round(p.weight / total, 6)) for p in points]
    return TrafficInput(source=str(path), profile=doc, summary=summary, hash=str(doc.get("hash", "")),
                        points=tuple(points))


def workload_points(trace: Any, spec: Any, hw: str, max_points: int) -> list[WorkloadPoint]:
    """The traffic package's workload points: the trace replayed through its continuous-batching
    scheduler model, with step times from a roofline of ``spec`` on the target ``hw``. The one place a
    ``traffic_profiles.WorkloadPoint`` becomes the engine's ``io_struct.WorkloadPoint`` (the two
    packages may not import each other; the fields are the same five)."""
    from cost_model import get_hardware, roofline_step_time
    from traffic_profiles import SchedulerConfig, replay

    step = roofline_step_time(spec, get_hardware(hw))
    points = [WorkloadPoint(p.phase, p.batch, p.context, p.chunk, p.weight)
              for p in replay(trace, step, SchedulerConfig(max_points=max_points)).points]
    return fit_positions(points, spec.max_position_embeddings)


def fit_positions(points: list[WorkloadPoint], max_positions: int) -> list[WorkloadPoint]:
    """Points clipped to what the model can attend over: a request longer than the model's context
    window is served truncated, so context + chunk never exceeds ``max_positions`` (the engine
    refuses such a workload). Prefill keeps its chunk and loses cached prefix first."""
    out: dict[tuple, WorkloadPoint] = {}        # points that clip to the same shape are merged
    for p in points:
        chunk = min(int(p.chunk), max_positions)
        q = dataclasses.replace(p, context=min(int(p.context), max_positions - chunk), chunk=chunk)
        if q.key in out:
            q = dataclasses.replace(q, weight=round(out[q.key].weight + q.weight, 6))
        out[q.key] = q
    return list(out.values())


def drift(old_profile: dict, new_profile: dict) -> tuple[bool, list[dict]]:
    """(drifted, per-feature rows) between a stored profile and a new one."""
    from traffic_profiles import compare
    from traffic_profiles import TrafficProfile

    report = compare(TrafficProfile.from_dict(old_profile), TrafficProfile.from_dict(new_profile))
    doc = report.to_dict()
    return bool(doc["drift"]), list(doc["features"])


def validate_hw(hw: str) -> dict:
    """The cost model's catalogue entry for --hw, as a small JSON record (CostModelError if unknown)."""
    from cost_model import get_hardware

    h = get_hardware(hw)
    return {"name": h.name, "label": h.label}


# share of one device's memory the tiers' weights may take together (the rest: KV caches of the workload
# points, activations, MoE and attention intermediates, CUDA-graph pools, candidates' workspaces). At 0.7
# deepseek's tiers (fast [0, 3], slow [0..5]: 104 GB of weights on a 150 GB H200) left < 1 GB free, and
# 30 of 87 candidates failed with CUDA OOM allocating 0.9-1.4 GB; 0.55 kept ~23 GB more (slow [0..4]). At 0.55
# GLM-5.2's tiers (fast [0, 2, 3], slow [0..4]: 70.8 GB) held 118 GB in judges and executors (29.7 + 60.4 +
# 13.3 + 14.9 GB), and the slow tier's confirmation of a 1.36x fused MoE failed allocating 1.5 GiB with 1.2 GiB
# free (benchmarks/results/h200-optimize-glm52-v4-engine-memory.log): 0.45 keeps one MoE layer (~12 GB) more.
TIER_WEIGHT_SHARE = 0.45


def tier_layers(spec: Any, fast_layers: int | None, slow_layers: int | None, device_bytes: float | None = None,
                shared: bool = True, dtype: str = "bf16", notes: list | None = None) -> tuple[list[int], list[int]]:
    """Fast tier: the covering layers (every distinct layer kind), or the first N when given.
    Slow tier: the first ``slow_layers`` layers (default 8), at least covering every kind.

    With ``device_bytes`` (a GPU's memory; ``shared``: both engines on that one device) the default
    slow tier shrinks until the weights fit in ``TIER_WEIGHT_SHARE`` of it (8 deepseek layers hold
    ~115 GB of experts); tiers that cannot fit, given or not, are an InputError naming the sizes.
    ``dtype``: the engines' weights (the fleet's, bf16). ``notes``: gets one line saying so when the default
    slow tier was shrunk to fit."""
    n = spec.num_layers
    for name, v in (("--fast-layers", fast_layers), ("--slow-layers", slow_layers)):
        if v is not None and not 1 <= v:
            raise InputError(f"{name} must be at least 1, got {v}")
    fast = list(spec.covering_layers()) if fast_layers is None else list(range(min(fast_layers, n)))
    slow_n = min(8 if slow_layers is None else slow_layers, n)

    def slow_of(k: int) -> list[int]:
        return sorted(set(range(k)) | set(spec.covering_layers()))

    if device_bytes is None:
        return fast, slow_of(slow_n)
    budget = TIER_WEIGHT_SHARE * device_bytes
    from persistent_engine.models.spec import DTYPE_BYTES

    gb = lambda layers: (spec.embedding_params() * DTYPE_BYTES[dtype]  # noqa: E731 - embedding + lm_head
                         + sum(spec.weight_bytes_layer(i, dtype) for i in layers))
    fast_gb = gb(fast) if shared else 0.0
    wanted = slow_n
    while slow_layers is None and slow_n > 1 and fast_gb + gb(slow_of(slow_n)) > budget:
        slow_n -= 1
    need = fast_gb + gb(slow_of(slow_n))
    if need > budget:
        raise InputError(f"{spec.name}: the tiers' weights (fast {fast}, slow {slow_of(slow_n)}: {need / 1e9:.1f} GB"
                         f"{' on one device' if shared else ''}) exceed {TIER_WEIGHT_SHARE:.0%} of the device's "
                         f"{device_bytes / 1e9:.1f} GB; pass fewer --slow-layers / --fast-layers, or --tiny (the "
                         "same architecture at toy size)")
    if slow_n < wanted and notes is not None:
        notes.append(f"slow tier: layers {slow_of(slow_n)} instead of the default {slow_of(wanted)}: "
                     f"{fast_gb / 1e9 + gb(slow_of(wanted)) / 1e9:.1f} GB of weights would exceed "
                     f"{TIER_WEIGHT_SHARE:.0%} of this device's {device_bytes / 1e9:.1f} GB "
                     f"(fast + slow {need / 1e9:.1f} GB)")
    return fast, slow_of(slow_n)


def device_memory(device: dict) -> float | None:
    """Bytes of memory of the smallest GPU in ``device`` (detect_device's); on CPU the memory available to
    new processes (MemAvailable), None where the system does not say."""
    if device["kind"] != "cuda":
        return cpu_memory()
    import torch

    return float(min(torch.cuda.get_device_properties(i).total_memory for i in range(len(device["devices"]))))


def cpu_memory() -> float | None:
    """Bytes of RAM available now (Linux MemAvailable; else the physical total), None when unknown."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return float(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        import os

        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return None


def detect_device(requested: str) -> dict:
    """``{"kind": "cpu"|"cuda", "name", "devices": [...]}`` for --device auto|cpu|cuda."""
    import torch

    if requested not in ("auto", "cpu", "cuda"):
        raise InputError(f"--device must be auto, cpu or cuda, got {requested!r}")
    has_cuda = torch.cuda.is_available()
    if requested == "cuda" and not has_cuda:
        raise InputError("--device cuda: no CUDA device is visible")
    if requested == "cpu" or not has_cuda:
        return {"kind": "cpu", "name": platform.processor() or platform.machine() or "cpu",
                "devices": ["cpu"]}
    n = torch.cuda.device_count()
    return {"kind": "cuda", "name": torch.cuda.get_device_name(0), "devices": [f"cuda:{i}" for i in range(n)]}


def hw_matches(hw: str, device: dict) -> bool:
    """Whether the detected device is the target the cost model was asked about."""
    if device["kind"] == "cpu":
        return hw.lower() == "cpu"
    name = device["name"].lower().replace(" ", "")
    return hw.lower().replace("-", "") in name


def software_versions() -> dict:
    from persistent_engine import package_version, software_versions as versions

    return {**versions(), "tkcc": package_version("tkcc") or _source_version()}


def _source_version() -> str | None:
    """tkcc run from a source tree without being installed (PYTHONPATH, as on a bare GPU box): the
    version in the tree's pyproject.toml, marked "+source"."""
    import re

    pyproject = Path(__file__).resolve().parents[2] / "pyproject.toml"
    try:
        m = re.search(r'^version\s*=\s*"([^"]+)"', pyproject.read_text(), re.M)
    except OSError:
        return None
    return f"{m.group(1)}+source" if m else None


def parallelism(spec: Any, hw: str, profile: dict, gpus: int, ttft_ms: float | None = None,
                tpot_ms: float | None = None) -> tuple[dict | None, dict | None, str]:
    """(layouts as ``tkcc parallelism --json`` gives them, projected full-model figures of the best,
    note), under the deployment's SLO where one is given. A cost-model failure is recorded as the note,
    never fatal to the run."""
    from cost_model import SLA, get_hardware
    from cost_model import search
    from cost_model import TrafficShape

    try:
        result = search(spec, get_hardware(hw), gpus, traffic=TrafficShape.from_profile(profile),
                        sla=SLA(ttft_ms, tpot_ms))
    except Exception as e:  # noqa: BLE001 - the layout is advice; the measured plan stands without it
        return None, None, f"cost model: {type(e).__name__}: {e}"
    doc = result.to_dict()
    best = doc.get("best") or {}
    projected = {k: best.get(k) for k in ("tokens_per_s_per_gpu", "tokens_per_s_per_user", "ttft_ms",
                                          "tpot_ms") if best.get(k) is not None}
    return doc, projected or None, str(doc.get("message") or "")


# the slow tier's routing skew when neither the traffic nor the user gives one: a power law of this
# exponent (AIConfigurator's power_law_1.2, persistent_engine/inputs/routing.py)
DEFAULT_ROUTING_SKEW = 1.2


def read_histogram(path: str) -> tuple[tuple[float, ...], ...]:
    """Per-expert loads from a file: JSON (a list of numbers, a list of per-layer lists, or
    ``{"layers": [...]}``) or text (one layer per line, numbers separated by commas or spaces)."""
    import json
    import re

    p = Path(path)
    if not p.is_file():
        raise InputError(f"routing histogram not found: {path}")
    try:
        text = p.read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise InputError(f"cannot read routing histogram {path}: {e}") from None
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        try:
            doc = [[float(v) for v in re.split(r"[,\s]+", line.strip()) if v]
                   for line in text.splitlines() if line.strip() and not line.lstrip().startswith("#")]
        except ValueError:
            raise InputError(f"routing histogram {path}: not JSON and not lines of numbers") from None
    if isinstance(doc, dict):
        doc = doc.get("layers")
    if isinstance(doc, list) and doc and all(isinstance(v, (int, float)) for v in doc):
        doc = [doc]
    if not (isinstance(doc, list) and doc and all(isinstance(r, list) and r for r in doc)
            and all(isinstance(v, (int, float)) and not isinstance(v, bool) for r in doc for v in r)):
        raise InputError(f"routing histogram {path}: expected per-expert numbers (one list, or one per layer)")
    return tuple(tuple(float(v) for v in r) for r in doc)


TOKEN_COLUMNS = ("token_ids", "prompt_token_ids", "input_ids")   # a trace's prompt token ids, if it logs them
MAX_TRAFFIC_TOKENS = 65536                                         # ids kept from the trace (its first prompts)


def traffic_token_ids(path: str, vocab_size: int) -> list[int] | None:
    """The prompts' token ids of a trace that logs them (a list column named one of ``TOKEN_COLUMNS`` in a
    parquet or JSON-lines trace), concatenated in request order, the first ``MAX_TRAFFIC_TOKENS``; None
    when the trace has none. Ids outside the model's vocabulary are an InputError (another tokenizer's)."""
    import json

    import pandas as pd

    p = Path(path)
    try:
        with open(p, "rb") as f:
            head = f.read(4)
        if head == b"PAR1":
            import pyarrow.parquet as pq

            names = set(pq.read_schema(p).names)
            col = next((c for c in TOKEN_COLUMNS if c in names), None)
            rows = pd.read_parquet(p, columns=[col])[col].tolist() if col else []
        elif head[:1] == b"{":
            rows, col, n = [], None, 0
            with open(p) as f:
                for i, line in enumerate(f):
                    rec = json.loads(line) if line.strip() else {}
                    col = col or next((c for c in TOKEN_COLUMNS if c in rec), None)
                    if col is None and i == 0:
                        return None     # the first request logs no tokens: the trace has none
                    if col and isinstance(rec.get(col), list):
                        rows.append(rec[col])
                        n += len(rec[col])
                    if n >= MAX_TRAFFIC_TOKENS:
                        break
        else:
            return None             # CSV traces carry lengths only
    except (OSError, ValueError) as e:
        raise InputError(f"{path}: cannot read its token ids: {e}") from None
    ids: list[int] = []
    for r in rows:
        if r is None:
            continue
        ids.extend(int(v) for v in list(r)[: MAX_TRAFFIC_TOKENS - len(ids)])
        if len(ids) >= MAX_TRAFFIC_TOKENS:
            break
    if not ids:
        return None
    if min(ids) < 0 or max(ids) >= vocab_size:
        raise InputError(f"{path}: token ids {min(ids)}..{max(ids)} fall outside the model's vocabulary "
                         f"(0..{vocab_size - 1}): logged with another tokenizer")
    return ids


# said at the start of every CPU run: what a Triton candidate's time there is
INTERPRETER_NOTE = ("CPU: Triton kernels run in Triton's interpreter here (TRITON_INTERPRET=1), 100-1000x slower than "
                    "compiled: a Triton candidate is checked for correctness but not timed (its interpreted time is no "
                    "speedup), so only torch candidates can be accepted here; speed of Triton is judged on a GPU")


RANDOM_WEIGHTS_NOTE = ("weights: seeded random (the model is an alias or a bare config.json; --model DIR of an HF "
                       "checkpoint or --weights loads real ones)")


def checkpoint_weights(model: str, notes: list[str]) -> str | None:
    """``--model DIR`` naming an HF checkpoint (config.json beside safetensors): its weights, which both tiers
    load; None for an alias or a bare config.json (seeded random weights). A line in ``notes`` says which."""
    from persistent_engine import checkpoint_of

    ckpt = checkpoint_of(model)
    notes.append(f"weights: the checkpoint at {ckpt} (not random)" if ckpt is not None else RANDOM_WEIGHTS_NOTE)
    return str(ckpt) if ckpt is not None else None


def tier_inputs(spec: Any, summary: dict, routing_skew: float | None = None,
                routing_histogram: str | None = None, weights: str | None = None,
                token_ids: list[int] | None = None) -> dict:
    """Each tier's input realism (``persistent_engine.tier_inputs``): the fast tier keeps uniform tokens
    and the random (balanced) routers; the slow tier gets Zipf tokens, the traffic's prefix-cache hit rate
    as shared prefixes, and MoE routing from ``routing_histogram`` (measured loads), else a power law of
    exponent ``routing_skew`` (default ``DEFAULT_ROUTING_SKEW``; 0: the random routers). ``weights``: a
    checkpoint both tiers load; its trained routers are kept (a skew or histogram is then an error).
    ``token_ids``: the trace's own prompt tokens (``traffic_token_ids``), used by the slow tier instead of
    Zipf draws (and by both tiers with a checkpoint)."""
    import math

    tokens: Any = {"ids": list(token_ids)} if token_ids else "zipf"

    if weights:
        if not Path(weights).exists():
            raise InputError(f"weights not found: {weights}")
        if routing_skew is not None or routing_histogram:
            raise InputError("--routing-skew/--routing-histogram rebuild random routers; with --weights the "
                             "checkpoint's trained routers are used")
        hit = summary.get("prefix_cache_hit_rate")
        share = float(hit) if isinstance(hit, (int, float)) and math.isfinite(hit) else 0.0
        slow = {"tokens": tokens, "prefix_share": round(min(max(share, 0.0), 1.0), 4), "weights": str(weights)}
        return {"fast": {"weights": str(weights), **({"tokens": tokens} if token_ids else {})}, "slow": slow}

    from persistent_engine import RoutingError, RoutingSpec

    if routing_skew is not None and not (math.isfinite(routing_skew) and 0 <= routing_skew <= 10):
        raise InputError(f"--routing-skew must be a number in [0, 10] (0: uniform routing), got {routing_skew}")
    try:
        if routing_histogram:
            routing = RoutingSpec("histogram", histogram=read_histogram(routing_histogram),
                                  source=Path(routing_histogram).name)
            if spec.is_moe:
                routing.check_experts(spec.num_experts)
        elif routing_skew == 0:
            routing = RoutingSpec("uniform")
        else:
            routing = RoutingSpec("power_law", alpha=DEFAULT_ROUTING_SKEW if routing_skew is None else routing_skew)
    except RoutingError as e:
        raise InputError(f"{routing_histogram or '--routing-skew'}: {e}") from None
    hit = summary.get("prefix_cache_hit_rate")
    share = float(hit) if isinstance(hit, (int, float)) and math.isfinite(hit) else 0.0
    slow = {"tokens": tokens, "routing": routing.to_dict() if spec.is_moe else {"kind": "uniform"},
            "prefix_share": round(min(max(share, 0.0), 1.0), 4)}
    return {"fast": {}, "slow": slow}


def inputs_summary(tier: dict) -> dict:
    """A tier's inputs as plan.json records them: the trace's token ids as their count only."""
    tok = tier.get("tokens")
    return {**tier, "tokens": f"traffic ({len(tok['ids'])} ids)"} if isinstance(tok, dict) else dict(tier)
