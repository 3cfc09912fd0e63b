"""Serving side: load a plan's accepted forward pass into a model.

    from compiler.apply import apply_plan, load_plan_overrides
    overrides, config = load_plan_overrides("plans/llama-1b")     # newest version
    with apply_plan("plans/llama-1b"):                             # registry overrides active
        logits = model.step(workload)

The plan's ``kernels/composed.py`` is the one candidate file holding every accepted override (what
the composition step verified and measured); it is loaded as a fresh module, like the engine does.
``check_plan`` runs a model slice at the plan's workload points with and without the plan and
reports the largest logit difference and the measured time of both (what ``tkcc plan apply`` prints).
"""

from __future__ import annotations

import contextlib
import importlib.util
import itertools
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterator

from compiler import plan as plan_mod

_counter = itertools.count()


@contextlib.contextmanager
def engine_threads(device: str) -> Iterator[None]:
    """On CPU, time with the engine's thread count (``TKCC_ENGINE_THREADS``, default 1) so that
    in-process figures compare with the engine's; restored afterwards."""
    import os

    import torch

    if device != "cpu":
        yield
        return
    saved = torch.get_num_threads()
    torch.set_num_threads(int(os.environ.get("TKCC_ENGINE_THREADS", "1")))
    try:
        yield
    finally:
        torch.set_num_threads(saved)


@dataclass(frozen=True)
class LoadedPlan:
    """A plan's overrides ready to install: op name -> callable, and engine CONFIG knobs."""

    version_dir: Path
    plan: plan_mod.Plan
    overrides: dict[str, Callable]
    config: dict


def load_module(path: Path) -> Any:
    """Imports a candidate file as a fresh module (never cached in ``sys.modules`` under a shared name)."""
    name = f"tkcc_plan_{next(_counter)}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise plan_mod.PlanError(f"cannot load {path}")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module      # triton.jit and dataclasses look modules up by name
    try:
        spec.loader.exec_module(module)
    except Exception as e:  # noqa: BLE001 - a broken kernel file is a corrupt plan, one line
        sys.modules.pop(name, None)
        raise plan_mod.PlanError(f"plan kernel {path} fails to load: {type(e).__name__}: {e}") from None
    return module


def overrides_of(source: str) -> dict[str, Callable]:
    """The ``OVERRIDES`` of a candidate source (e.g. a plan's composed file), imported as a fresh module
    from a real file (Triton reads kernel sources through ``inspect``)."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "composed.py"
        path.write_text(source)
        return dict(getattr(load_module(path), "OVERRIDES", {}) or {})


def torch_dtype(name: str) -> Any:
    """``torch.dtype`` of an engine dtype name (bf16, fp16, fp32)."""
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[name]


def _load_verified(kfile: Path, sha256: str) -> Any:
    """Imports the kernel file's bytes only if they still hash to ``sha256``: read once, checked, and
    imported from a private copy, so a file swapped after ``plan.load`` verified it is never run."""
    import hashlib
    import tempfile

    data = kfile.read_bytes()
    if hashlib.sha256(data).hexdigest() != sha256:
        raise plan_mod.PlanError(f"plan {kfile.parent.parent}: kernel file kernels/{kfile.name} does not match "
                                 "its sha256 in plan.json (edited after the plan was written); refused")
    with tempfile.TemporaryDirectory(prefix="tkcc-plan-") as d:
        private = Path(d) / kfile.name
        private.write_bytes(data)
        return load_module(private)


def load(path: str | Path) -> LoadedPlan:
    """Loads and validates a plan (root or version directory) and imports its composed kernels."""
    plan, vdir = plan_mod.load(path)
    kfile = vdir / "kernels" / plan_mod.COMPOSED_KERNEL
    if not kfile.is_file():
        if plan.optimizations:
            raise plan_mod.PlanError(f"corrupt plan {vdir}: kernels/{plan_mod.COMPOSED_KERNEL} is missing")
        return LoadedPlan(vdir, plan, {}, {})
    module = _load_verified(kfile, plan.kernel_sha256.get(f"kernels/{plan_mod.COMPOSED_KERNEL}", ""))
    overrides = getattr(module, "OVERRIDES", None)
    if not isinstance(overrides, dict):
        raise plan_mod.PlanError(f"corrupt plan {vdir}: {kfile.name} defines no OVERRIDES dict")
    return LoadedPlan(vdir, plan, dict(overrides), dict(getattr(module, "CONFIG", None) or {}))


def load_plan_overrides(path: str | Path) -> tuple[dict[str, Callable], dict]:
    """``(overrides, config)`` of a plan: pass ``overrides`` to ``registry.override``."""
    loaded = load(path)
    return loaded.overrides, loaded.config


@contextlib.contextmanager
def apply_plan(path: str | Path) -> Iterator[LoadedPlan]:
    """Context manager: the plan's overrides are active in the op registry inside the block."""
    from persistent_engine.ops import registry

    loaded = load(path)
    with registry.override(loaded.overrides):
        yield loaded


TOLERANCE = {"bf16": (5e-2, 2e-2), "fp16": (1e-2, 1e-2), "fp32": (1e-4, 1e-4)}   # (atol, rtol) on logits


@dataclass(frozen=True)
class PointCheck:
    point: dict
    max_abs_diff: float
    max_abs_reference: float
    reference_ms: float
    plan_ms: float
    ok: bool


def check_plan(path: str | Path, *, model: str | None = None, layers: list[int] | None = None,
               device: str = "cpu", dtype: str = "bf16", repeats: int = 5,
               seed: int = 0) -> tuple[LoadedPlan, list[PointCheck]]:
    """Runs the model (``layers`` slice; default the plan's fast tier) at each of the plan's workload
    points, reference then plan, and returns the logit difference (``ok`` within the dtype's
    tolerance) and median step times (ms). Cost: 2 x (repeats + 1) forward steps per point."""
    import torch

    from persistent_engine.models.decoder import build_model
    from persistent_engine.models.spec import ModelSpec
    from persistent_engine.ops import registry
    from persistent_engine.workloads import make_workload

    loaded = load(path)
    spec = ModelSpec.from_name(model or loaded.plan.model)
    if layers is None:
        layers = loaded.plan.tiers.get("fast", {}).get("layers") or list(spec.covering_layers())
    if dtype not in TOLERANCE:
        raise plan_mod.PlanError(f"dtype must be one of {', '.join(TOLERANCE)}, got {dtype!r}")
    atol, rtol = TOLERANCE[dtype]
    m = build_model(spec, layers=list(layers), device=device, dtype=torch_dtype(dtype), seed=seed)
    out = []

    def timed(workload) -> tuple[Any, float]:
        samples, logits = [], m.step(workload)          # one warm-up step, untimed
        for _ in range(repeats):
            if device != "cpu":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            logits = m.step(workload)
            if device != "cpu":
                torch.cuda.synchronize()
            samples.append(time.perf_counter() - t0)
        return logits, sorted(samples)[len(samples) // 2] * 1e3

    with torch.no_grad(), engine_threads(device):
        for point in loaded.plan.workload_points:
            w = make_workload(m, dict(point), seed)
            ref, ref_ms = timed(w)
            with registry.override(loaded.overrides):
                got, plan_ms = timed(w)
            diff = float((ref.float() - got.float()).abs().max())
            scale = float(ref.float().abs().max())
            out.append(PointCheck(dict(point), diff, scale, ref_ms, plan_ms, diff <= atol + rtol * scale))
    return loaded, out


def op_times_with(spec: Any, layers: list[int], points: list[dict], source: str, *, device: str = "cpu",
                  reps: int = 3, seed: int = 0) -> dict[str, dict[str, float]]:
    """``{"before": {op: ms}, "after": {op: ms}}``: per-op time of one step of the ``layers`` slice,
    weighted over ``points``, with the reference and with the candidate ``source`` (a plan's composed
    file), measured the same way in this process by the engine's profiler
    (``persistent_engine.profiler.profile_point``: each outermost op call wrapped, device synchronised
    around it, so a composite op's parts are not counted twice; median over ``reps`` after a warm-up).
    Cost: 2 x (reps + 1) steps per point."""
    from collections import defaultdict

    import torch

    from persistent_engine.models.decoder import build_model
    from persistent_engine.ops import registry
    from persistent_engine.profiler import profile_point
    from persistent_engine.workloads import make_workload

    overrides = overrides_of(source)
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    model = build_model(spec, layers=list(layers), device=device, dtype=dtype, seed=seed)
    result: dict[str, dict[str, float]] = {"before": defaultdict(float), "after": defaultdict(float)}
    with torch.no_grad(), engine_threads(device):
        for point in points:
            workload = make_workload(model, dict(point), seed)
            for side in ("before", "after"):
                ctx = registry.override(overrides) if side == "after" else contextlib.nullcontext()
                with ctx:
                    prof = profile_point(model, workload, torch.device(device), reps)
                for op, row in prof.items():
                    result[side][op] += float(point.get("weight", 1.0)) * row["ms"]
    return {side: {k: round(v, 6) for k, v in ops.items()} for side, ops in result.items()}
