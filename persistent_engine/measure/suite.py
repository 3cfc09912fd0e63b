"""Measure engine step times at workload points: the input of ``cost_model.calibration.fit``.

    rows = measure_suite([("tiny-dense", None, [point, ...]), ("llama-1b", [0], [...])], device="cpu")
    calib = fit(rows, get_hardware("cpu"))

Each (model, layers) is built once with the engine's decoder (``persistent_engine.models.decoder``)
and a workload (``persistent_engine.inputs.workloads``) is made for each point; then the points are timed
*interleaved*: every round takes one sample of every point, so a burst of load from other processes
hits all points alike instead of ruining one. A point's time is the fastest of its samples on CPU
(noise from sharing the cores only ever adds time) and the median on GPU. Rounds stop at
``rounds`` or when ``budget_s`` is spent (at least ``min_rounds``).

On GPU each point is timed as the engine timed it in process (``persistent_engine.measure.timing``): a step is captured
in a CUDA graph (warm-up on a side stream, one shared memory pool) and a sample is one replay
between CUDA events after an L2 flush (``persistent_engine.measure.timing``), so the host's Python and
launch cost, which serving does not pay, is not in it. A prefill step may read lengths on the host
(the MoE expert loop above its token threshold); a failed capture can leave the allocator
mid-capture, so a prefill step is first run once eagerly under ``torch.cuda.set_sync_debug_mode
("error")`` and captured only when no host sync fired; otherwise, or when a capture fails, it is
timed eagerly. Every row says which (``graph``: true / false, ``graph_error`` the reason; None on
CPU) and that the engine's reference ops ran (``impl``: "reference"), which
``cost_model.calibration`` costs apart.

On CPU the clock is by default the calling thread's CPU time (``clock="thread"``): with one torch
thread every op runs on the calling thread, so the CPU time is the step's own work, and the time the
scheduler gives to other processes (on a loaded 2-core machine, most of the wall time of a 10 ms
step) is not in it. On an idle machine it equals the wall time; ``clock="wall"`` uses the engine's
timer (``persistent_engine.measure.timing``) as on GPU.

Cost: one build per model; per round, the sum of the points' step times. torch and the engine are
imported inside the functions. It lives in the engine (cost_model sees only ``models.spec``); the rows it
returns are plain dicts that ``cost_model.calibration`` reads (``load_measurements``).
"""

from __future__ import annotations

import statistics
import time

from persistent_engine.io_struct import WorkloadPoint


def _d(batch: int, context: int) -> WorkloadPoint:
    return WorkloadPoint("decode", batch, context, 1, 1.0)


def _p(chunk: int, context: int = 0, batch: int = 1) -> WorkloadPoint:
    return WorkloadPoint("prefill", batch, context, chunk, 1.0)


# The CPU suite: the tiny models whole and one llama-1b layer (embeddings and its 128k-vocab lm_head
# included), 28 points of 1-120 ms each on one core, so that the fastest of a few interleaved
# samples is a clean one even on a loaded machine. Each model lists an even number of points,
# decodes then prefills, so that every other point (the calibration / held-out split) covers both.
CPU_SUITE = [
    ("tiny-dense", None, [_d(1, 64), _d(4, 256), _d(8, 512), _d(16, 128), _d(32, 512), _d(16, 1024),
                          _p(32), _p(128), _p(256, 128), _p(64, 0, 2)]),
    ("tiny-moe", None, [_d(1, 128), _d(4, 256), _d(16, 512), _d(8, 64), _p(64), _p(256)]),
    ("tiny-mla", None, [_d(2, 256), _d(8, 512), _d(16, 1024), _d(4, 128), _p(64), _p(128, 64)]),
    ("llama-1b", [0], [_d(1, 256), _d(8, 512), _d(4, 256), _d(2, 1024), _p(64, 128), _p(16)]),
]


def _points_of(suite: list) -> list[tuple[str, object, WorkloadPoint]]:
    return [(model, layers, p) for model, layers, points in suite for p in points]


def measure_suite(suite: list, device: str = "cpu", rounds: int = 15, min_rounds: int = 5,
                  budget_s: float | None = None, seed: int = 0, threads: int | None = 1,
                  clock: str | None = None) -> list[dict]:
    """Measurement dicts (``cost_model.calibration`` format, plus ``samples`` and ``spread``) for
    every point of ``suite`` = [(model name, layers | None, [WorkloadPoint, ...]), ...], in order.

    ``threads``: torch intra-op threads on CPU while measuring (1: the cost model's CPU probe is
    one core's figures, and one thread is what stays repeatable on a shared machine). ``clock``:
    "thread" (CPU default; needs ``threads=1``) or "wall" (GPU default, the engine's timer)."""
    import torch

    from persistent_engine.models.decoder import build_model
    from persistent_engine.measure.timing import make_timer
    from persistent_engine.inputs.workloads import make_workload

    dev = torch.device(device)
    clock = clock or ("thread" if dev.type == "cpu" and threads == 1 else "wall")
    if clock not in ("thread", "wall") or (clock == "thread" and (dev.type != "cpu" or threads != 1)):
        raise ValueError(f"clock {clock!r}: 'wall', or 'thread' on CPU with threads=1")
    old_threads = torch.get_num_threads()
    if dev.type == "cpu" and threads:
        torch.set_num_threads(threads)
    try:
        timer = make_timer(dev)
        models: dict = {}
        runs = []                                   # (row template, step closure, graph replay?)
        pool = torch.cuda.graph_pool_handle() if dev.type == "cuda" else None
        with torch.inference_mode():
            # pass 1: build every workload and step it once, so that whatever a model sizes lazily
            # (rope tables, scratch buffers) has reached its final size before any graph captures
            # its address; pass 2 captures
            built = []
            for model, layers, point in _points_of(suite):
                key = (model, None if layers is None else tuple(layers) if not isinstance(layers, int) else layers)
                if key not in models:
                    models[key] = build_model(model, layers=layers, device=device, seed=seed)
                m = models[key]
                wl = make_workload(m, point, seed)
                m.step(wl)                          # warm-up: allocator, lazy init, caches
                built.append((model, point, m, wl))
            for model, point, m, wl in built:
                row = {"model": model, "layers": list(m.layers), "dtype": "bf16",
                       "point": point.to_dict(), "impl": "reference", "graph": None}
                step, graph = (lambda m=m, wl=wl: m.step(wl)), False
                if dev.type == "cuda":
                    error = None if point.phase == "decode" else _host_sync(torch, m, wl)
                    if error is None:
                        step, error = _capture(torch, m, wl, pool, dev)
                    graph = error is None
                    if error:
                        row["graph_error"] = error
                        step = lambda m=m, wl=wl: m.step(wl)    # noqa: E731
                    row["graph"] = graph
                runs.append((row, step, graph))
            if clock == "thread":
                sample = lambda step, graph: _thread_sample(step)                   # noqa: E731
            else:
                sample = lambda step, graph: timer.sample(step, graph=graph)[0] / 1e3  # noqa: E731
            samples: list[list[float]] = [[] for _ in runs]
            start = time.perf_counter()
            for r in range(rounds):
                if budget_s is not None and r >= min_rounds and time.perf_counter() - start > budget_s:
                    break
                for i, (_, step, graph) in enumerate(runs):
                    samples[i].append(sample(step, graph))              # seconds
    finally:
        torch.set_num_threads(old_threads)
    out = []
    for (row, _, _), s in zip(runs, samples):
        s = sorted(s)
        t = s[0] if dev.type == "cpu" else statistics.median(s)
        out.append({**row, "seconds": t, "samples": len(s), "spread": (statistics.median(s) - s[0]) / s[0],
                    "clock": clock})
    return out


def _host_sync(torch, model, wl) -> str | None:
    """None when one eager step does no host sync (so it can be captured), else the reason."""
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        model.step(wl)
    except RuntimeError as e:
        return f"host sync: {str(e).splitlines()[0][:200] if str(e) else 'RuntimeError'}"
    finally:
        torch.cuda.set_sync_debug_mode("default")
        torch.cuda.synchronize()
    return None


def _capture(torch, model, wl, pool, dev):
    """(replay closure returning the step's static output, None), or (None, error text) when the
    step cannot be captured (the engine's capture: warm-up on a side stream, then the graph)."""
    from persistent_engine.measure.timing import capture_graph

    try:
        g, out = capture_graph(lambda: model.step(wl), dev, pool)
    except Exception as e:  # noqa: BLE001 - not capturable: the caller times this point eagerly
        torch.cuda.synchronize(dev)
        return None, f"{type(e).__name__}: {str(e).splitlines()[0][:200] if str(e) else ''}"
    g.replay()                                  # first replay outside the timed samples
    return (lambda: (g.replay(), out)[1]), None


def _thread_sample(step) -> float:
    """CPU seconds of the calling thread spent in ``step()``."""
    t0 = time.thread_time_ns()
    step()
    return (time.thread_time_ns() - t0) / 1e9
