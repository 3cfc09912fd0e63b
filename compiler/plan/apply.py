"""Serving side: load a plan's accepted forward pass into a model.

    from compiler.plan.apply import apply_plan, load_plan_overrides
    overrides, config = load_plan_overrides("plans/llama-1b")     # newest version
    with apply_plan("plans/llama-1b"):                             # registry overrides active
        logits = model.step(workload)

The plan's ``kernels/composed.py`` is the one candidate file holding every accepted override (what
the composition step verified and measured); it is loaded as a fresh module named and placed as an
executor loads a judged candidate. ``check_plan`` (what ``tkcc plan apply`` prints) runs the plan's
kernels in a sandboxed executor of the judge engine, the reference and the comparison in this process:
the largest logit difference and the measured time of both at the plan's workload points.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator

from compiler.plan import artifact as plan_mod
from persistent_engine import WorkloadPoint, read_contract

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
    checker: Any = None               # compiler.plan.spot_check.SpotChecker, inside ``apply_plan``
    weights: str | None = None        # the checkpoint ``check_plan`` ran (``--model DIR``); None: seeded random
    variants: tuple = ()              # (buckets.BucketVariant, its overrides): decode batch sizes they serve


def load_module(path: Path) -> Any:
    """Imports a candidate file as a fresh module, named and placed as an executor places a judged candidate
    (``persistent_engine.import_source``: named by its hash, in a fresh ``tkcc-exec-`` directory of
    ``scratch.module_dir``): harness-blind. The directory lives as long as this process (Triton reads a
    kernel's file lazily) and is removed at exit. For a plan's verified kernels only: this runs their code
    in this process."""
    from persistent_engine import import_source, scratch

    try:
        source = Path(path).read_text()
    except (OSError, UnicodeDecodeError) as e:
        raise plan_mod.PlanError(f"cannot load {path}: {e}") from None
    try:
        return import_source(source, scratch.module_dir())
    except Exception as e:  # noqa: BLE001 - a broken kernel file is a corrupt plan, one line
        raise plan_mod.PlanError(f"plan kernel {path} fails to load: {type(e).__name__}: {e}") from None


def overrides_of(source: str) -> dict[str, Callable]:
    """The ``OVERRIDES`` of a candidate source (e.g. a plan's composed file), imported as a fresh module
    from a real file (Triton reads kernel sources through ``inspect``)."""
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "composed.py"
        path.write_text(source)
        overrides, _, _, _ = read_contract(load_module(path), None)
        return overrides


def _engine_state():
    """Save torch's thread count and grad mode (the judge engine sets both in this process)."""
    import torch

    threads, grad = torch.get_num_threads(), torch.is_grad_enabled()

    def restore():
        torch.set_num_threads(threads)
        torch.set_grad_enabled(grad)
    return restore


def torch_dtype(name: str) -> Any:
    """``torch.dtype`` of an engine dtype name (bf16, fp16, fp32)."""
    import torch

    return {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[name]


def verified_bytes(kfile: Path, sha256: str) -> bytes:
    """The kernel file's bytes, read once and checked against ``sha256`` (what is used is what was
    checked: a file swapped after ``plan.load`` verified it is refused, never run)."""
    import hashlib

    data = kfile.read_bytes()
    if hashlib.sha256(data).hexdigest() != sha256:
        raise plan_mod.PlanError(f"plan {kfile.parent.parent}: kernel file kernels/{kfile.name} does not match "
                                 "its sha256 in plan.json (edited after the plan was written); refused")
    return data


def _load_verified(kfile: Path, sha256: str) -> Any:
    """Imports the kernel file's verified bytes (``verified_bytes``) from a private copy."""
    import tempfile

    data = verified_bytes(kfile, sha256)
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
    sha = plan.kernel_sha256.get(f"kernels/{plan_mod.COMPOSED_KERNEL}", "")
    module = _load_verified(kfile, sha)
    overrides, config, _, reasons = read_contract(module, None)
    if not isinstance(getattr(module, "OVERRIDES", None), dict):
        raise plan_mod.PlanError(f"corrupt plan {vdir}: {kfile.name} defines no OVERRIDES dict")
    if reasons:
        raise plan_mod.PlanError(f"corrupt plan {vdir}: {kfile.name}: {'; '.join(reasons)}")
    check_verified_ops(plan, vdir, verified_bytes(kfile, sha).decode(), overrides)
    return LoadedPlan(vdir, plan, overrides, config, variants=_load_variants(plan, vdir, config))


def _load_variants(plan: plan_mod.Plan, vdir: Path, config: dict) -> tuple:
    """Each bucket variant's overrides, imported from its verified bytes; a variant must override exactly the
    ops its members verified and set the plan's CONFIG (one engine config per plan), else ``PlanError``."""
    out = []
    for v in plan.bucket_variants(str(vdir)):
        module = _load_verified(vdir / v.kernel, plan.kernel_sha256.get(v.kernel, ""))
        overrides, vconfig, _, reasons = read_contract(module, None)
        if reasons:
            raise plan_mod.PlanError(f"corrupt plan {vdir}: {v.kernel}: {'; '.join(reasons)}")
        if vconfig != config:
            raise plan_mod.PlanError(f"plan {vdir}: {v.kernel} sets CONFIG {vconfig}, not the plan's {config}; refused")
        _check_variant_ops(plan, vdir, v, overrides)
        out.append((v, overrides))
    return tuple(out)


def _check_variant_ops(plan: plan_mod.Plan, vdir: Path, v: Any, live: Iterable[str]) -> None:
    """A bucket variant's live overrides must be exactly the ops its members verified."""
    from persistent_engine.ops import registry

    ops, live = set(registry.names()), set(live)
    verified = {t for o in plan.optimizations if o.name in v.members for t in o.targets if t in ops}
    if live != verified:
        raise plan_mod.PlanError(f"plan {vdir}: {v.kernel} overrides {', '.join(sorted(live)) or 'nothing'}, "
                                 f"its members verified {', '.join(sorted(verified)) or 'nothing'}; refused")


def verified_ops(plan: plan_mod.Plan, source: str) -> set[str] | None:
    """The ops the plan verified: its optimizations' targets that are registry ops (a config optimization's
    targets are knob names); a plan that records none (written by hand or by older code) falls back on its
    composed source's ``OVERRIDES`` literal, the parse the judge verifies against (None: no complete
    literal either, nothing to compare)."""
    import ast

    from persistent_engine import CandidateSource
    from persistent_engine.ops import registry

    ops = set(registry.names())
    targets = {t for o in plan.optimizations for t in o.targets if t in ops}
    if targets:
        return targets
    values = [n.value for n in ast.parse(source).body if isinstance(n, ast.Assign)
              and any(isinstance(t, ast.Name) and t.id == "OVERRIDES" for t in n.targets)]
    if values and isinstance(values[-1], ast.Dict) and all(
            isinstance(k, ast.Constant) and isinstance(k.value, str) for k in values[-1].keys):
        return set(CandidateSource.parse(source).overrides)
    return None


def check_verified_ops(plan: plan_mod.Plan, vdir: Path, source: str, live: Iterable[str]) -> None:
    """The module's live ``OVERRIDES`` (after its import ran) must override exactly the verified ops: an op
    added at import (by code the literal does not show) was never verified; a missing one is not the plan."""
    verified, live = verified_ops(plan, source), set(live)
    if verified is None or live == verified:
        return
    extra, missing = sorted(live - verified), sorted(verified - live)
    what = "; ".join(([f"overrides {', '.join(extra)}, which the plan never verified"] if extra else []) +
                     ([f"does not override {', '.join(missing)}, which the plan verified"] if missing else []))
    raise plan_mod.PlanError(f"plan {vdir}: kernels/{plan_mod.COMPOSED_KERNEL} {what}; refused")


def load_plan_overrides(path: str | Path) -> tuple[dict[str, Callable], dict]:
    """``(overrides, config)`` of a plan: pass ``overrides`` to ``registry.override``."""
    loaded = load(path)
    return loaded.overrides, loaded.config


@contextlib.contextmanager
def apply_plan(path: str | Path, spot_check: float | None = None) -> Iterator[LoadedPlan]:
    """Context manager: the plan's overrides are active in the op registry inside the block, each
    spot-checked against the reference on a ``spot_check`` fraction of its calls (default
    ``spot_check.DEFAULT_FRACTION``; 0 disables; ``compiler.plan.spot_check``). The checker is
    ``loaded.checker`` inside the block (its counts, its disabled ops)."""
    from compiler.plan.spot_check import DEFAULT_FRACTION, SpotChecker
    from persistent_engine.ops import registry

    loaded = load(path)
    checker = SpotChecker(loaded.overrides, DEFAULT_FRACTION if spot_check is None else spot_check)
    with registry.override(checker.wrapped()):
        yield dataclasses.replace(loaded, checker=checker)
    checker.drain()


TOLERANCE = {"bf16": (5e-2, 2e-2), "fp16": (1e-2, 1e-2), "fp32": (1e-4, 1e-4)}   # (atol, rtol) on logits


@dataclass(frozen=True)
class PointCheck:
    point: WorkloadPoint
    max_abs_diff: float
    max_abs_reference: float
    reference_ms: float
    plan_ms: float
    ok: bool
    served_by: str = f"kernels/{plan_mod.COMPOSED_KERNEL}"     # the plan file that ran it (a bucket variant's)


def check_plan(path: str | Path, *, model: str | None = None, layers: list[int] | None = None,
               device: str = "cpu", dtype: str = "bf16", repeats: int = 5,
               seed: int = 0) -> tuple[LoadedPlan, list[PointCheck]]:
    """Runs the model (``layers`` slice; default the plan's fast tier) at each of the plan's workload points,
    reference then plan, and returns the logit difference (``ok`` within the dtype's tolerance) and median
    step times (ms). The plan's kernels run in a sandboxed executor started by the judge engine, exactly as a
    judged candidate runs (same entry point, environment, module name: harness-blind); this process computes
    the reference, compares and times both sides from outside. Cost: one judge start-up, one executor,
    2 x (repeats + 1) steps per point. A ``model`` (or plan model) naming an HF checkpoint runs its weights."""
    from persistent_engine import checkpoint_of
    from persistent_engine.judge import Engine, EngineConfig
    from persistent_engine.models.spec import ModelSpec

    plan, vdir = plan_mod.load(path)
    kfile = vdir / "kernels" / plan_mod.COMPOSED_KERNEL
    if not kfile.is_file() and plan.optimizations:
        raise plan_mod.PlanError(f"corrupt plan {vdir}: kernels/{plan_mod.COMPOSED_KERNEL} is missing")
    spec = ModelSpec.from_name(model or plan.model)
    if layers is None:
        layers = plan.tiers.get("fast", {}).get("layers") or list(spec.covering_layers())
    if dtype not in TOLERANCE:
        raise plan_mod.PlanError(f"dtype must be one of {', '.join(TOLERANCE)}, got {dtype!r}")
    points = list(plan.workload_points)
    ckpt = checkpoint_of(model or plan.model)
    weights = str(ckpt) if ckpt is not None else None
    restore = _engine_state()
    engine = Engine(EngineConfig(model=model or plan.model, layers=list(layers), device=device, dtype=dtype,
                                 points=points, seed=seed, variants=1, pool_size=1,
                                 inputs={"weights": weights} if weights else {}))
    try:
        ops, config, plan_side = [], {}, engine.baseline
        composed = f"kernels/{plan_mod.COMPOSED_KERNEL}"
        if kfile.is_file() and plan.optimizations:           # an empty plan runs the baseline
            ops, config, plan_side, source = _load_side(engine, vdir, composed, plan.kernel_sha256.get(composed, ""))
            check_verified_ops(plan, vdir, source, ops)     # the module's live OVERRIDES, as it loaded
        check = functools.partial(_check_point, engine, repeats=repeats, tol=TOLERANCE[dtype])
        out = [check(plan_side, i, p, vdir / composed, composed) for i, p in enumerate(points)]
        for v in plan.bucket_variants(str(vdir)):           # the decode points a variant serves: checked with it
            side = engine.baseline                          # no member kept: the reference
            if v.members:
                vops, _, side, _ = _load_side(engine, vdir, v.kernel, plan.kernel_sha256.get(v.kernel, ""))
                _check_variant_ops(plan, vdir, v, vops)
            for i, point in enumerate(points):
                if point.phase == "decode" and v.lo <= point.batch <= v.hi:
                    out[i] = check(side, i, point, vdir / v.kernel, v.kernel)
    finally:
        engine.close()
        restore()
    return LoadedPlan(vdir, plan, dict.fromkeys(ops), config, weights=weights), out


def _load_side(engine: Any, vdir: Path, rel: str, sha256: str) -> tuple[list, dict, Any, str]:
    """(ops, config, executor, source) of a plan file's verified bytes loaded into the judge engine as a
    candidate (captured in CUDA graphs on a GPU, as judged)."""
    from persistent_engine import io_struct as io
    from persistent_engine.judge import ab

    source = verified_bytes(vdir / rel, sha256).decode()
    load = engine.handle(io.LoadCandidate(source=source, name="plan"))
    if not load.ok:
        why = "; ".join(getattr(load, "reasons", None) or [load.message])
        raise plan_mod.PlanError(f"plan kernel {vdir / rel} fails to load: {why}"[:2000])
    side = engine.candidate.executor
    if engine.device.type == "cuda":
        ab.capture(side, sorted(engine.base_graphed))
    return list(load.ops), dict(load.config), side, source


def _check_point(engine: Any, side: Any, i: int, point: WorkloadPoint, kfile: Path, served_by: str, *,
                 repeats: int, tol: tuple[float, float]) -> "PointCheck":
    """Point ``i`` of the engine run by ``side`` (the baseline executor: the reference): its logits against
    the reference's and both sides' median step time."""
    from persistent_engine.judge import ab

    ref = engine.ref[i][0]
    got = ref
    if side is not engine.baseline:
        try:
            got = ab.step_logits(side, i).to(ref.device)
        except RuntimeError as e:
            raise plan_mod.PlanError(f"plan kernel {kfile} raised: {e}"[:2000]) from None
    diff = float((ref.float() - got.float()).abs().max())
    scale = float(ref.float().abs().max())
    ref_ms = ab.time_side(engine.baseline, i, 0, repeats, engine.batch[i], ref)   # k runs a request:
    plan_ms = ab.time_side(side, i, 0, repeats, engine.batch[i], ref)             # its fixed cost amortised
    return PointCheck(point, diff, scale, ref_ms, plan_ms, diff <= tol[0] + tol[1] * scale, served_by)


def op_times_with(spec: Any, layers: list[int], points: list[WorkloadPoint], source: str, *, device: str = "cpu",
                  reps: int = 3, seed: int = 0) -> dict[str, dict[str, float]]:
    """``{"before": {op: ms}, "after": {op: ms}}``: per-op time of the traffic's mean step of the ``layers``
    slice (``compiler.plan.op_time``: the points weighted as the workload table weighs them, both sides with the
    reference's step mix), with the reference and with the candidate ``source`` (a plan's composed
    file), measured the same way in this process by the engine's profiler
    (``persistent_engine.profiler.profile_point``: each outermost op call wrapped, device synchronised
    around it, so a composite op's parts are not counted twice; median over ``reps`` after a warm-up).
    Cost: 2 x (reps + 1) steps per point."""
    import torch

    from compiler.plan.op_time import op_ms_per_step, step_mix

    from persistent_engine import build_model
    from persistent_engine.ops import registry
    from persistent_engine import profile_point
    from persistent_engine import make_workload

    overrides = overrides_of(source)
    dtype = torch.float32 if device == "cpu" else torch.bfloat16
    model = build_model(spec, layers=list(layers), device=device, dtype=dtype, seed=seed)
    per_point: dict[str, list[dict[str, float]]] = {"before": [], "after": []}
    with torch.no_grad(), engine_threads(device):
        for point in points:
            workload = make_workload(model, point, seed)
            for side in ("before", "after"):
                ctx = registry.override(overrides) if side == "after" else contextlib.nullcontext()
                with ctx:
                    prof = profile_point(model, workload, torch.device(device), reps)
                per_point[side].append({op: float(row["ms"]) for op, row in prof.items()})
    mix = step_mix([p.weight for p in points], [sum(ops.values()) for ops in per_point["before"]])
    return {side: op_ms_per_step(mix, rows) for side, rows in per_point.items()}
