"""Everything ``tkcc serve`` runs, built once: the served model (weights + tokenizer), the plan's
overrides and CONFIG knobs, the serving engine and its scheduler (``traffic_profiles.scheduler``, the
one the trace replay runs).

    rt = build_runtime(ServeOptions(plan="plans/llama-1b", device="cuda"))
"""

from __future__ import annotations

import contextlib
import dataclasses
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from compiler.serve.model import ModelLoadError, load_served_model


@dataclass(frozen=True)
class ServeOptions:
    model: str | None = None
    plan: str | None = None
    weights: str | None = None
    device: str = "auto"              # auto | cpu | cuda
    tiny: bool = False
    max_model_len: int | None = None
    kv_cache_bytes: int | None = None
    compile: bool | None = None       # torch.compile the decode forward around the plan's overrides (each an
                                      # opaque call, as the judge timed it); None: on for CUDA, off for CPU
    compile_backend: str = "inductor"  # ("eager": dynamo only, the CPU tests')
    graphs: bool = True               # CUDA graphs for the plan's (or default) decode batch sizes
    graph_sizes: tuple[int, ...] | None = None   # decode graph batch sizes instead of the plan's / default
    max_num_seqs: int | None = None   # when the plan's CONFIG sets none (default 64)
    mixed_batches: bool | None = None  # a step's chunks and decodes in one ragged forward; None: when the plan
                                      # overrides attention_prefill (the reference's cost grows with the sequences)
    seed: int = 0
    spot_check: float = 0.02          # fraction of each override's calls checked against the reference (0: off)


DEFAULT_GRAPH_SIZES = (1, 2, 4, 8, 16, 32, 64)


@dataclass
class Runtime:
    name: str
    spec: Any
    tokenizer: Any
    engine: Any                       # persistent_engine.serving.ServingEngine
    sched_cfg: Any                    # traffic_profiles.scheduler.SchedulerConfig
    source: str
    plan_dir: str | None
    plan_overrides: dict[str, Callable]
    checker: Any = None               # compiler.plan.spot_check.SpotChecker of the plan's overrides
    compiled: bool = False            # the decode forward compiled: overrides enter it as opaque calls
    startup_s: dict[str, float] = field(default_factory=dict)   # load (plan, weights), engine (KV, graphs, compile)
    variants: tuple = ()              # (buckets.BucketVariant, its overrides): decode batch sizes they serve

    @contextlib.contextmanager
    def overrides(self) -> Iterator[None]:
        """The plan's overrides active in the op registry (process-global) while the engine runs."""
        from persistent_engine import opaque
        from persistent_engine.ops import registry

        live = self.checker.wrapped(self.plan_overrides) if self.checker is not None else self.plan_overrides
        if self.compiled:                           # dynamo does not trace into the kernels or the spot check
            live = opaque(live)
        with registry.override(live):               # behind the spot-check's wrappers (compiler.plan.spot_check)
            yield

    @contextlib.contextmanager
    def decode_overrides(self, batch: int) -> Iterator[None]:
        """The overrides of the plan's variant serving decode batches of ``batch`` (``compiler.plan.buckets``)
        instead of the plan's, exactly (an op it does not override runs the reference); the plan's where no
        variant holds ``batch``. The engine enters it around a decode graph's capture and an eager decode."""
        from compiler.plan.buckets import variant_for
        from persistent_engine import opaque
        from persistent_engine.ops import registry

        found = variant_for(batch, [v for v, _ in self.variants])
        if found is None:
            yield
            return
        live = dict(next(o for v, o in self.variants if v is found))
        live = self.checker.wrapped(live) if self.checker is not None else live
        with registry.override_exactly(opaque(live) if self.compiled else live):
            yield


def _load_plan(path: str):
    from compiler.plan import apply
    from compiler.plan import artifact as plan_mod

    verify = getattr(plan_mod, "verify_plan_files", None)      # hashes checked (plan.load does it once merged)
    if verify is not None:
        verify(path)
    return apply.load(path)


def _device(name: str) -> str:
    import torch

    if name == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if name not in ("cpu", "cuda"):
        raise ModelLoadError(f"--device must be auto, cpu or cuda, not {name!r}")
    if name == "cuda" and not torch.cuda.is_available():
        raise ModelLoadError("--device cuda: no CUDA device is available")
    return name


def build_runtime(opts: ServeOptions, progress: Callable[[str], None] | None = None) -> Runtime:
    """``progress``: called with a line per CUDA-graph capture (size, width, seconds, replay ms, compiles so far)."""
    import torch

    from persistent_engine import build_model, make_decoder
    from persistent_engine import compiled_default, opaque
    from persistent_engine.serving import ServingConfig, ServingEngine
    from traffic_profiles import Scheduler, SchedulerConfig

    t0 = time.perf_counter()
    loaded = _load_plan(opts.plan) if opts.plan else None
    model = opts.model or (loaded.plan.model if loaded else None)
    if model is None:
        raise ModelLoadError("give --plan DIR or --model M")
    device = _device(opts.device)
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    compiled = compiled_default(device.split(":")[0]) if opts.compile is None else bool(opts.compile)
    served = load_served_model(model, opts.weights, tiny=opts.tiny, dtype=dtype)
    spec, layers = served.spec, list(range(served.spec.num_layers))
    if any(getattr(spec, "kda_layers", ())) or "M" in getattr(spec, "hybrid_pattern", ""):
        mixer = "Kimi delta attention" if any(getattr(spec, "kda_layers", ())) else "Mamba-2 layers"
        raise ModelLoadError(f"{spec.name}: serving models with {mixer} (a recurrent state per request) "
                             "is not implemented; tkcc optimize and candidate check run it")
    if served.params is None:
        decoder = build_model(spec, layers=layers, device=device, dtype=dtype, seed=opts.seed)
    else:
        decoder = make_decoder(spec, layers, {k: v.to(device) for k, v in served.params.items()}, device, dtype)
    knobs = dict(loaded.config) if loaded else {}
    max_len = opts.max_model_len or min(spec.max_position_embeddings, 4096 if device != "cpu" else 2048)
    if opts.kv_cache_bytes:
        kv_bytes = opts.kv_cache_bytes
    elif device == "cpu":
        kv_bytes = 256 << 20
    else:
        kv_bytes = int(torch.cuda.mem_get_info()[0] * 0.5)
    if opts.max_num_seqs:
        knobs.setdefault("max_num_seqs", opts.max_num_seqs)
    graphs = opts.graph_sizes or knobs.get("cuda_graph_batch_sizes", DEFAULT_GRAPH_SIZES)
    graphs = () if not opts.graphs or device == "cpu" else graphs
    overrides = dict(loaded.overrides) if loaded else {}
    mixed = "attention_prefill" in overrides if opts.mixed_batches is None else bool(opts.mixed_batches)
    cfg = ServingConfig.from_knobs({**knobs, "cuda_graph_batch_sizes": graphs}, device=device, dtype=dtype,
                                  max_model_len=max_len, kv_cache_bytes=kv_bytes, compile=compiled,
                                  compile_backend=opts.compile_backend, mixed_batches=mixed)
    cfg = dataclasses.replace(cfg, cuda_graph_batch_sizes=tuple(b for b in cfg.cuda_graph_batch_sizes
                                                                if b <= cfg.max_num_seqs))
    chunk = knobs.get("max_chunk_tokens")             # the plan's chunked-prefill size (config search)
    sched_cfg = SchedulerConfig(max_num_seqs=cfg.max_num_seqs, max_num_batched_tokens=cfg.max_num_batched_tokens,
                                max_chunk_tokens=int(chunk) if chunk else None)
    from compiler.plan.spot_check import SpotChecker
    from persistent_engine.ops import registry

    t1 = time.perf_counter()
    variants = loaded.variants if loaded else ()
    # a disabled override must not replay from a captured graph: later decodes run eager (the reference)
    checker = SpotChecker(overrides, opts.spot_check, on_disable=lambda _ops: setattr(rt.engine, "drop_graphs", True))
    rt = Runtime(served.name, spec, served.tokenizer, None, sched_cfg, served.source,
                 str(loaded.version_dir) if loaded else None, overrides,
                 checker if overrides or variants else None, compiled, variants=variants)
    with registry.override(opaque(overrides) if compiled else overrides):   # CUDA graphs capture the plan's kernels
        rt.engine = ServingEngine(decoder, lambda kv: Scheduler(sched_cfg, kv), cfg, progress,
                                  decode_context=rt.decode_overrides if variants else None)
    rt.startup_s = {"load_s": t1 - t0, "engine_s": time.perf_counter() - t1}
    return rt
