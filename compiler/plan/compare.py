"""The plan against ``torch.compile`` of the same model slice, each run the way a user would run it.

    res = compare_with_torch_compile(spec, layers=[0, 1], points=plan_points, source=composed_source,
                                     device="cuda")
    res["plan_vs_torch_compile"]     # weighted over the points every variant could run

Three variants of one slice, per workload point, on the same model object and the same workload:

- ``reference``: the plain-torch reference ops, eager;
- ``plan``: the plan's overrides as the engine runs them: captured in a CUDA graph and replayed on a
  GPU (eager where the capture fails, said in ``how``), eager on CPU;
- ``torch_compile``: ``torch.compile(model.step)`` of the reference, ``mode="reduce-overhead"`` on a
  GPU (its own CUDA graphs; weights, KV cache and step inputs marked static so no copies are timed),
  the default mode on CPU.

A variant that fails at a point (inductor cannot lower an op of a prefill shape, say) leaves that
point out of all three sums; the error is kept per point and ``weight_covered`` says how much of
the traffic the ratios stand for. Cost per point: one compile (seconds on CPU, tens of seconds on a
GPU) + 3 x (samples + 2) steps. ``benchmarks/e2e_decode.py`` times whole models the same way.
"""

from __future__ import annotations

import time
from typing import Any, Callable

from persistent_engine import WorkloadPoint

from compiler.plan.apply import engine_threads, overrides_of, torch_dtype


def capture(model: Any, wl: Any, overrides: dict, pool: Any = None, compiled: bool = False) -> tuple[Any, Any]:
    """(graph, static logits) of one step with ``overrides`` active, as the engine captures it: warm-up
    steps on a side stream (Triton JIT, allocator), then the capture. ``compiled``: the step as the engine's
    compiled mode runs it (``compiled_step``: inductor around the overrides, each an opaque call), compiled
    on a first call here (dynamo reset first: its graphs are this workload's)."""
    import torch._dynamo

    from persistent_engine import timing
    from persistent_engine import compiled_step, opaque
    from persistent_engine.ops import registry

    step = model.step
    if compiled:
        torch._dynamo.reset()
        step, overrides = compiled_step(model), opaque(overrides)
    with registry.override(overrides):
        if compiled:
            step(wl)
        return timing.capture_graph(lambda: step(wl), pool=pool)


def compile_step(model: Any, wl: Any) -> tuple[Callable[[], Any], float, bool | None]:
    """``torch.compile(model.step)`` warmed up on ``wl`` (``reduce-overhead`` on a GPU, default on CPU):
    (run, seconds the first three calls took (compile + CUDA-graph recording), whether its CUDA graphs
    ran (None on CPU)). Dynamo is reset first: each call compiles for its own workload's shapes."""
    import torch
    import torch._dynamo
    from torch._dynamo.utils import counters

    cuda = model.device.type == "cuda"
    torch._dynamo.reset()
    for t in [*model.params.values(), model.cos_sin, *wl.cache.k.values(), *wl.cache.v.values(), wl.cache.block_tables,
              wl.token_ids, wl.positions, wl.slot_mapping, wl.context_lens, wl.cu_seqlens_q, wl.last_token_index]:
        torch._dynamo.mark_static_address(t)
    skips_before = counters["inductor"]["cudagraph_skips"]
    fn = torch.compile(model.step, mode="reduce-overhead") if cuda else torch.compile(model.step)
    t0 = time.perf_counter()
    for _ in range(3):
        fn(wl)
    if cuda:
        torch.cuda.synchronize()
    graphs = counters["inductor"]["cudagraph_skips"] == skips_before if cuda else None
    return (lambda: fn(wl)), time.perf_counter() - t0, graphs


def _first_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {(str(e).splitlines() or [''])[0]}"[:300]


def compare_with_torch_compile(spec: Any, layers: list[int], points: list[WorkloadPoint], source: str, *,
                               device: str = "cpu", dtype: str = "bf16", samples: int | None = None,
                               seed: int = 0) -> dict:
    """Weighted step times (ms) of the slice ``layers`` over ``points``: ``reference_ms``, ``plan_ms``
    (``source``'s overrides), ``torch_compile_ms``, their ratios, and per point what ran (see the module
    docstring). Raises only when no point could be measured at all."""
    import torch

    from persistent_engine import timing
    from persistent_engine import build_model
    from persistent_engine.ops import registry
    from persistent_engine import make_workload

    overrides = overrides_of(source)
    model = build_model(spec, layers=list(layers), device=device, dtype=torch_dtype(dtype), seed=seed)
    cuda = model.device.type == "cuda"
    n = samples or (50 if cuda else 5)
    timer = timing.make_timer(model.device)

    def ms(run: Callable[[], Any], graph: bool) -> float:
        for _ in range(2):
            run()
        return timing.time_one(timer, run, n, graph=graph).median_ms

    def plan_ms(wl: Any) -> tuple[float, str]:
        if cuda:
            try:
                g, out = capture(model, wl, overrides)
            except RuntimeError as e:           # an override that syncs the host: timed eagerly, as the engine does
                torch.cuda.synchronize()
                how = f"eager (capture failed: {_first_line(e)})"
            else:
                t = ms(lambda: (g.replay(), out)[1], graph=True)
                del g
                return t, "cuda_graph"
        else:
            how = "eager"
        with registry.override(overrides):
            return ms(lambda: model.step(wl), graph=False), how

    rows: list[dict] = []
    t0 = time.monotonic()
    with torch.no_grad(), engine_threads(device):
        for point in points:
            row: dict = {"point": point.to_dict(), "weight": point.weight}       # a plan.json row
            try:
                wl = make_workload(model, point, seed)
                row["reference_ms"] = ms(lambda: model.step(wl), graph=False)
                row["plan_ms"], row["how"] = plan_ms(wl)
                run, row["compile_s"], row["compile_cudagraphs"] = compile_step(model, wl)
                row["torch_compile_ms"] = ms(run, graph=cuda)
            except Exception as e:  # noqa: BLE001 - one point's failure is recorded, the others still count
                row["error"] = _first_line(e)
                if cuda:
                    torch.cuda.synchronize()
            rows.append(row)
    ok = [r for r in rows if "error" not in r]
    if not ok:
        raise RuntimeError(f"no point could be compared: {rows[0]['error'] if rows else 'no points'}")
    total_w = sum(r["weight"] for r in rows) or 1.0
    out: dict = {"layers": list(layers), "dtype": dtype, "device": model.device.type,
                 "plan_timing": "cuda_graph" if cuda else "eager",
                 "torch_compile_mode": "reduce-overhead" if cuda else "default",
                 "weight_covered": round(sum(r["weight"] for r in ok) / total_w, 4),
                 "seconds": round(time.monotonic() - t0, 1), "points": rows}
    for k in ("reference_ms", "plan_ms", "torch_compile_ms"):
        out[k] = round(sum(r["weight"] * r[k] for r in ok), 6)
    out["plan_vs_reference"] = round(out["reference_ms"] / out["plan_ms"], 4) if out["plan_ms"] else None
    out["plan_vs_torch_compile"] = round(out["torch_compile_ms"] / out["plan_ms"], 4) if out["plan_ms"] else None
    return out
