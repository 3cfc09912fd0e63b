"""The sharded forward against the single-process reference, run inside a process group.

    rows = check_sharded(world=2, cases=[("tiny-dense", 2, 1), ("tiny-moe", 2, 2), ("llama-8b", 2, 1, [0, 1])])
    # one row per (case, point): max |sharded - reference| logits and whether it is within tolerance

A case is (model, tp, ep) or (model, tp, ep, layers) for a slice. Every rank builds the reference
decoder with the same seed (the check is for small models and slices), its own shard of it (``shard_model``), and the workload of each point; the rank's shard of the
reference cache is taken before either model runs, so both start from the same cached K/V. Each
rank compares the full logits it ends with ([B, V] fp32 after the all-gather) to the reference's;
the check passes when every rank is within ``atol + rtol |reference|`` everywhere.
"""

from __future__ import annotations

import torch

from persistent_engine.io_struct import WorkloadPoint
from persistent_engine.parallel.group import launch, pick_backend

__all__ = ["DEFAULT_POINTS", "check_sharded", "compare_worker"]

DEFAULT_POINTS = (WorkloadPoint("decode", 3, 37, 1, 1.0), WorkloadPoint("prefill", 2, 9, 5, 1.0))
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}
TOLERANCE = {"float32": (2e-4, 2e-4), "bfloat16": (5e-2, 5e-2)}


def compare_worker(rank: int, world: int, cases: list, points: list[WorkloadPoint], seed: int, device: str, dtype: str) -> list[dict]:
    """One rank's comparison of every (model, tp, ep) case at every point."""
    import torch.distributed as dist

    from persistent_engine.models.decoder import build_model
    from persistent_engine.parallel.tensor_parallel import ParallelConfig, shard_model, shard_workload
    from persistent_engine.inputs.workloads import make_workload

    dev = f"cuda:{rank}" if device.startswith("cuda") else "cpu"
    atol, rtol = TOLERANCE[dtype]
    rows = []
    for model_name, tp, ep, *layers in cases:            # (model, tp, ep) or (model, tp, ep, layers)
        if tp != world:
            continue
        cfg = ParallelConfig(tp=tp, ep=ep)
        ref = build_model(model_name, layers=layers[0] if layers else None, device=dev, dtype=DTYPES[dtype],
                          seed=seed)
        sharded = shard_model(ref, cfg, rank, group=dist.group.WORLD)
        for i, point in enumerate(points):
            wl = make_workload(ref, point, seed=seed + i)
            swl = shard_workload(wl, ref.spec, cfg, rank)
            want = ref.step(wl)
            got = sharded.step(swl)
            err = (got - want).abs()
            bound = atol + rtol * want.abs()
            rows.append({"model": model_name, "layout": cfg.label(), "rank": rank, "phase": point.phase,
                         "batch": point.batch, "context": point.context,
                         "shape": list(got.shape), "max_abs_err": float(err.max()),
                         "max_ref": float(want.abs().max()),
                         "qkv_rows": int(sharded.params[f"layers.{ref.layers[0]}.qkv_w"].shape[0]),
                         "ok": bool(got.shape == want.shape and bool((err <= bound).all()))})
    return rows


def check_sharded(world: int, cases: list, points=DEFAULT_POINTS, seed: int = 0, device: str = "cpu",
                  dtype: str = "float32", timeout_s: float = 300.0) -> list[dict]:
    """Run ``compare_worker`` on ``world`` ranks (gloo on CPU, NCCL on GPUs); rows of every rank."""
    per_rank = launch(compare_worker, world, pick_backend(device),
                      args=(list(cases), list(points), seed, device, dtype), timeout_s=timeout_s)
    return [row for rows in per_rank for row in rows]
