"""How ``e2e_decode.py`` times its variants and runs the independent baseline: one fair timer for every variant.

    entry, logits, kernels = time_variant(timer, run, a, held=True, how="cuda_graph", profile=5)
    fields, entry, logits, kernels = run_gptfast(base, a, timer, "max-autotune-no-cudagraphs")

``time_variant``: ``persistent_engine.measure.timing.FairTimer`` (``--steps`` calls back to back between two events,
the headline; one replay after an L2 flush, median of ``--samples``; host dispatch beside, the stream held while
the host queues a graph-backed variant so its dispatch stays out of the window; CPU: perf_counter_ns, cache
flushed) and the GPU busy time of ``--profile-steps`` profiled calls
(``persistent_engine/measure/kernel_profile.py``). Its entry is the
results JSON's ``timings[variant]``: ``timed`` (how it ran), ``back_to_back_ms``, ``one_replay_ms``,
``dispatch_ms``, ``busy_ms`` and the timer's counts.

``run_gptfast``: the gpt-fast-style model (``baseline_gptfast.py``) compiled ``fullgraph=True`` under
``reduce-overhead`` (inductor's own CUDA graphs; its calls timed held, their dispatch reported beside) or
``max-autotune-no-cudagraphs`` captured in a CUDA graph here (the strongest baseline a careful user writes;
where the capture fails, its calls are timed held and ``timed`` says why). CPU: inductor's CPU backend, no
graphs; ``--no-compile``: the model eager (reduce-overhead's slot) and max-autotune not measured.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

import torch

from benchmarks import baseline_gptfast as gptfast
from persistent_engine.measure.kernel_profile import profile_intervals, summarize
from persistent_engine.measure import timing

__all__ = ["GPTFAST", "GptFast", "gptfast_base", "kernels_per_step", "run_gptfast", "time_variant"]

# compile mode -> the variant's name in the results (``{name}_ms``, ``timings[name]``, ``ratios["vs_" + name]``)
GPTFAST = {"reduce-overhead": "gptfast", "max-autotune-no-cudagraphs": "gptfast_max_autotune"}


def kernels_per_step(run: Callable[[], torch.Tensor], steps: int, wall_ms: float, cuda: bool = True) -> dict:
    """Kernels, busy / idle microseconds per call of ``run`` over ``steps`` profiled calls (kernel_profile.py;
    ``cuda`` False: top-level aten ops stand in, for tests), the 5 heaviest kernels, and ``wall_idle_us`` =
    the timed ``wall_ms`` - busy."""
    try:
        s = summarize(*profile_intervals(run, steps, cuda=cuda), top=5)
    except RuntimeError as e:                          # the profiler saw no kernel in some call
        return {"error": str(e)}
    return {**s, "wall_us": wall_ms * 1e3, "wall_idle_us": wall_ms * 1e3 - s["busy_us"]}


def time_variant(timer: timing.FairTimer, run: Callable[[], torch.Tensor], a, *, held: bool, how: str,
                 eager: bool = False, profile: int = 0) -> tuple[dict, torch.Tensor, dict | None]:
    """``run`` timed both ways: (its ``timings`` entry, a clone of its output, its kernels per step when
    ``profile``). ``eager``: ``--eager-samples`` calls per window and one-replay samples instead of ``--steps`` /
    ``--samples``. ``held``: a graph-backed call (see the module docstring). Cost: warm-up + 10 dispatch calls
    (GPU) + repeats x steps + samples calls, and ``profile`` profiled ones."""
    steps, samples = (a.eager_samples, a.eager_samples) if eager else (a.steps, a.samples)
    t = timer.time(run, steps=steps, samples=samples, repeats=a.repeats, held=held)
    entry: dict[str, Any] = {"timed": how, **t.to_dict(), "busy_ms": None}
    kernels = kernels_per_step(run, profile, t.back_to_back_ms) if profile else None
    if kernels and "busy_us" in kernels:
        entry["busy_ms"] = kernels["busy_us"] / 1e3
    return entry, run().clone(), kernels


@dataclass(frozen=True)
class GptFast:
    """The baseline on a case's weights and cached context, and the step's inputs."""

    model: gptfast.Transformer
    idx: torch.Tensor                    # [B, 1] int64 token ids
    pos: torch.Tensor                    # [1] int64: the position the step writes (the context length)


def gptfast_base(model, wl, config_path, batch: int, context: int) -> GptFast:
    """The baseline on ``model``'s weights (a copy) and ``wl``'s cached context (a static cache of the point);
    raises ``gptfast.Unsupported`` for a family it does not implement."""
    args = gptfast.ModelArgs.from_name(config_path)
    base = gptfast.build_from_tkcc(args, model.params, model.layers, batch, context + 1)
    gptfast.load_paged_context(base, wl.cache.k, wl.cache.v, wl.cache.block_tables, context)
    return GptFast(base, wl.token_ids.view(batch, 1), torch.tensor([context], device=model.device))


def _first_line(e: BaseException) -> str:
    return f"{type(e).__name__}: {(str(e).splitlines() or [''])[0][:200]}"


def _graph_of(run: Callable[[], torch.Tensor], device: torch.device) -> tuple[Callable[[], torch.Tensor], str | None]:
    """``run`` captured in a CUDA graph: (its replay, None), or (``run`` itself, why not) where the capture fails."""
    try:
        g, out = timing.capture_graph(run, device)
    except Exception as e:  # noqa: BLE001 - not capturable: its calls are timed instead
        if not timing.recover_after_capture(device):
            raise
        return run, _first_line(e)
    return (lambda: (g.replay(), out)[1]), None


def run_gptfast(base: GptFast, a, timer: timing.FairTimer,
                mode: str) -> tuple[dict, dict | None, torch.Tensor | None, dict | None]:
    """The baseline under compile ``mode`` (module docstring): ({name}_timed, {name}_compile_s, {name}_note},
    its ``timings`` entry, its logits, its kernels per step); entry and logits None where it was not measured
    (``{name}_note`` says why)."""
    name = GPTFAST[mode]
    cuda = timer.cuda
    row: dict[str, Any] = {f"{name}_timed": None, f"{name}_compile_s": None, f"{name}_note": None}
    if a.no_compile and mode != "reduce-overhead":
        row[f"{name}_note"] = "not measured: --no-compile"
        return row, None, None, None
    step = base.model if a.no_compile else gptfast.compile_decode(base.model, mode)

    def run() -> torch.Tensor:
        with torch.no_grad():
            return step(base.idx, base.pos)

    t0 = time.perf_counter()
    try:
        for _ in range(3):                              # compile (autotune; reduce-overhead: record its graphs)
            run()
        if cuda:
            torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001 - a baseline that does not compile is reported, the run goes on
        torch._dynamo.reset()
        row[f"{name}_note"] = f"not measured: {_first_line(e)}"
        return row, None, None, None
    if not a.no_compile:
        row[f"{name}_compile_s"] = time.perf_counter() - t0
    timed_run, how = run, _how(mode, a.no_compile, cuda)
    if cuda and mode != "reduce-overhead":
        timed_run, failed = _graph_of(run, timer.device)
        how += f" (capture failed: {failed}; its calls timed, held)" if failed else " captured in a CUDA graph"
    entry, logits, kernels = time_variant(timer, timed_run, a, held=cuda and not a.no_compile, how=how,
                                          eager=a.no_compile, profile=a.profile_steps if cuda else 0)
    row[f"{name}_timed"] = how
    torch._dynamo.reset()
    return row, entry, logits, kernels


def _how(mode: str, no_compile: bool, cuda: bool) -> str:
    if no_compile:
        return "eager (--no-compile)"
    if cuda and mode == "reduce-overhead":
        return 'torch.compile(mode="reduce-overhead", fullgraph=True) calls (its CUDA graphs), held'
    if not cuda and mode == "reduce-overhead":
        return "torch.compile(fullgraph=True) (CPU: no CUDA graphs)"
    return f'torch.compile(mode="{mode}", fullgraph=True)' + ("" if cuda else " (CPU: no CUDA graphs)")
