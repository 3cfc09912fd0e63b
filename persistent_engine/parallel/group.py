"""Process groups on one host: one process per GPU (NCCL) or per CPU worker (gloo), on loopback.

    results = launch(worker, world=2, backend="gloo", args=(...))   # worker(rank, world, *args) -> value
    # results[r] is rank r's return value (picklable); a failure in any rank raises ParallelError

``launch`` picks a free port on 127.0.0.1, starts ``world`` spawned processes, initialises the
default process group in each (rank r uses cuda:r under NCCL), runs the worker, tears the group
down, and collects the return values through a queue. NVLink multicast (NVLS) and torch's
symmetric-memory multicast stay off in every child: NCCL_NVLS_ENABLE=0 and
TORCH_SYMM_MEM_DISABLE_MULTICAST=1 are forced into the environment before the spawn.
"""

from __future__ import annotations

import os
import queue
import socket
import time
import traceback
from typing import Any, Callable

import torch
import torch.distributed as dist

__all__ = ["ParallelError", "SAFE_ENV", "all_reduce", "all_gather_last", "free_port", "launch", "pick_backend"]

# Forced in the parent and every child: multicast over NVLink stays off (device docs: it is not safe
# to enable on the lent machines).
SAFE_ENV = {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1"}


class ParallelError(RuntimeError):
    """A layout the sharded engine cannot run, or a failed multi-process run: one line, exit 2."""

    user_error = True


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def pick_backend(device: str) -> str:
    return "nccl" if device.startswith("cuda") else "gloo"


def all_reduce(x: torch.Tensor, group=None) -> torch.Tensor:
    """Sum ``x`` over the group in place (a no-op outside a group or with one rank)."""
    if dist.is_initialized() and dist.get_world_size(group) > 1:
        dist.all_reduce(x, group=group)
    return x


def all_gather_last(x: torch.Tensor, group=None) -> torch.Tensor:
    """Concatenate every rank's ``x[..., n]`` along the last dim, rank order: [..., world * n]."""
    if not dist.is_initialized() or dist.get_world_size(group) == 1:
        return x
    parts = [torch.empty_like(x) for _ in range(dist.get_world_size(group))]
    dist.all_gather(parts, x.contiguous(), group=group)
    return torch.cat(parts, dim=-1)


def _entry(rank: int, world: int, backend: str, port: int, fn: Callable, args: tuple, results) -> None:
    os.environ.update(SAFE_ENV)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world),
                      LOCAL_RANK=str(rank))
    kw: dict[str, Any] = {}
    if backend == "nccl":
        torch.cuda.set_device(rank)
        kw["device_id"] = torch.device("cuda", rank)
    else:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
    try:
        dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world, **kw)
        try:
            value = fn(rank, world, *args)
        finally:
            dist.destroy_process_group()
        results.put((rank, True, value))
    except BaseException as e:  # noqa: BLE001 - reported to the parent as one line plus the traceback
        results.put((rank, False, f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))
        raise SystemExit(1) from None


def launch(fn: Callable, world: int, backend: str = "gloo", args: tuple = (), timeout_s: float = 600.0) -> list:
    """Run ``fn(rank, world, *args)`` in ``world`` spawned processes inside one process group;
    returns the ranks' return values in rank order. ``fn`` must be importable (module level)."""
    if world < 1:
        raise ParallelError(f"world size must be >= 1, got {world}")
    if backend == "nccl" and torch.cuda.device_count() < world:
        raise ParallelError(f"{world} ranks need {world} GPUs; this machine has {torch.cuda.device_count()}")
    os.environ.update(SAFE_ENV)
    if backend == "gloo":
        os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    import torch.multiprocessing as mp

    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_entry, args=(r, world, backend, port, fn, args, results), daemon=False)
             for r in range(world)]
    for p in procs:
        p.start()
    out: dict[int, Any] = {}
    errors: list[str] = []
    deadline = time.monotonic() + timeout_s
    try:
        while len(out) + len(errors) < world:
            try:
                rank, ok, value = results.get(timeout=0.5)
            except queue.Empty:
                dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0) and r not in out]
                if dead:           # died before reporting (e.g. could not unpickle the worker)
                    errors.append(f"rank {dead[0]} exited with code {procs[dead[0]].exitcode} before reporting")
                elif time.monotonic() > deadline:
                    errors.append(f"no result within {timeout_s:.0f} s")
                else:
                    continue
                break
            if ok:
                out[rank] = value
            else:
                errors.append(f"rank {rank}: {value}")
                break               # the other ranks may be stuck in a collective: stop them below
    finally:
        for p in procs:
            p.join(timeout=5 if errors else timeout_s)
            if p.is_alive():
                p.kill()
                p.join()
    if errors:
        raise ParallelError(errors[0].splitlines()[0] + (f" (details: {errors[0]})" if os.environ.get("TKCC_DEBUG") else ""))
    return [out[r] for r in range(world)]
