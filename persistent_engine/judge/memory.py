"""The judge's device-memory accounting: pure functions of byte counts (the engine measures them).

One GPU can hold two engines (the fast and the slow tier of a run on one device), each with a pool of
warm candidate executors, each judging op-level checks whose two halves (the judge's references, the
executor's runs) allocate at the same time. The fleet's measure lock runs one evaluation at a time per
device (compiler/fleet/local.py), so one op check at a time; but the pools warm meanwhile, and each engine only
sees what is free when it looks, so every figure here subtracts what is still coming:

- ``to_come``: the co-tenant engines' weights not on the device yet (the other tier may still be building
  its slice when this one sizes its pool);
- ``op_check_reserve``: what the largest op-level check needs at its smallest shape (``OpDef.fit`` cannot go
  below it: GLM-5.2's fused MoE keeps 2k = 16 experts, ~19 GB by moe.py's estimate): never handed to a pool;
- ``executor_bytes``: one executor's footprint: the baseline executor's measured one after its warm-up, a
  candidate's own buffers, and the process's own overhead beyond its tensors (CUDA context, cuBLAS/cuDNN
  workspaces, the caching allocator's slack, Triton's loaded modules): ``measured_overhead`` of what the
  baseline executor reports (``memory`` request, executor/worker.py), ``EXECUTOR_OVERHEAD_BYTES`` until then;
- ``pool_plan``: warm executors from a share of what is left after both, counting the two a judge holds out
  of its pool (the candidate's, the one prepared for the next load); fewer when memory is short (one at
  least: a judge without an executor judges nothing), and then none prepared ahead of a load (only the
  candidate's own held out) when one and both held-out ones would eat into the check reserve;
- ``op_check_budget``: a check's bytes (both halves) within what is free minus what is still coming (the
  executors warming, each to take its measured footprint; the co-tenants' weights);
- ``references_ahead``: references the judge computes ahead while the executor runs, within that budget.

On the H200 (GLM-5.2, fast [0, 2, 3] + slow [0..4], 70.8 GB of weights) the fast tier's fused-MoE check
was fitted to 27 experts (a 32.6 GB budget: half of the 65 GB free when verification began); its
bf16 w13 (27 x 4096 x 6144 x 2 B = 1.27 GiB) then found 199 MiB free: the pools were still warming
(each sized at 35% of the free memory it saw, with nothing kept for the checks; the first possibly before
the other tier's weights had landed).

The next run (v3, pools sized as above) still ran a 384 MiB allocation of a fused-MoE check into 91 MiB free:
each pool was one executor plus the two held out (fast 3 x 9.6 GiB in a 20.3 GiB room, slow 3 x 11.0 GiB in
8.3 GiB), and an executor holds more than its tensors (one that failed to start held 8.21 GiB with 6.12 GiB
allocated by torch: 1.42 GiB of allocator slack and 0.67 GiB outside torch, its context and workspaces;
another ran at 13.27 GiB against the 11.0 GiB counted).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["GIB", "POOL_MEMORY_SHARE", "HELD_OUT", "EXECUTOR_MARGIN_BYTES", "EXECUTOR_OVERHEAD_BYTES", "CONTEXT_BYTES", "REFERENCES_AHEAD_BYTES",
           "PoolPlan", "executor_bytes", "measured_overhead", "to_come", "op_check_reserve", "pool_plan", "op_check_budget",
           "references_ahead", "describe_memory"]

GIB = 1 << 30
# of the room left (after the weights to come and the check reserve) one engine's executors may take: the
# first of two engines on a GPU half, the second half of the rest
POOL_MEMORY_SHARE = 0.5
HELD_OUT = 2                           # executors a judge holds beside its pool: the candidate's, the next one
EXECUTOR_MARGIN_BYTES = GIB            # a candidate's own buffers above the baseline executor's measured footprint
# an executor's own device memory beyond the tensors it allocates, until its baseline executor has reported
# (``measured_overhead``): the v3 H200 run's executor held 8.21 GiB with 6.12 GiB allocated by torch, 2.09 GiB
# above (1.42 GiB reserved by the caching allocator but unallocated, 0.67 GiB CUDA context, cuBLAS
# workspace and loaded modules); another ran at 13.27 GiB against the 11.0 GiB counted (2.27 GiB above)
EXECUTOR_OVERHEAD_BYTES = 5 * GIB // 2
CONTEXT_BYTES = 512 << 20              # a process's CUDA context (not in torch's allocator counts)
REFERENCES_AHEAD_BYTES = GIB           # at most this many bytes of references computed ahead


@dataclass(frozen=True)
class PoolPlan:
    """How many warm executors a pool keeps, and the figures that decided it (bytes)."""

    size: int
    each: int               # one executor's footprint
    room: int               # free - to_come - reserve (may be negative: memory short)
    free: int
    to_come: int
    reserve: int
    held_out: int = HELD_OUT   # executors held beside the pool: 2, fewer when even one would not fit

    @property
    def executors(self) -> int:
        """Executors this judge may have alive at once besides its baseline one."""
        return self.size + self.held_out

    def line(self) -> str:
        short = "" if self.held_out == HELD_OUT else " (memory short: no executor prepared ahead)"
        return (f"pool of {self.size} warm executor(s) x {self.each / GIB:.1f} GiB: {self.free / GIB:.1f} GiB free, "
                f"{self.to_come / GIB:.1f} GiB of co-tenant weights still to come, {self.reserve / GIB:.1f} GiB "
                f"kept for op-level checks; with {self.held_out} held out, {POOL_MEMORY_SHARE:.0%} of the "
                f"{max(self.room, 0) / GIB:.1f} GiB left" + short)


def executor_bytes(measured: int, host_arena: int, overhead: int = EXECUTOR_OVERHEAD_BYTES) -> int:
    """One executor's device footprint: the baseline executor's measured one (KV caches, activations,
    context, graphs) or the arena it copies (CPU weights path), plus a candidate's own buffers and the
    process's ``overhead`` beyond its tensors (``measured_overhead``)."""
    return max(measured, host_arena) + EXECUTOR_MARGIN_BYTES + max(0, overhead)


def measured_overhead(report: dict | None) -> int:
    """What a warmed executor may hold beyond its live tensors, from its own ``memory`` report (bytes by
    torch's caching allocator: ``allocated`` now, ``peak_reserved`` since it started): the allocator's
    slack and transients at their peak plus ``CONTEXT_BYTES`` outside torch (context, cuBLAS/cuDNN
    workspaces, Triton modules); ``EXECUTOR_OVERHEAD_BYTES`` without a report (CPU, an executor that could
    not answer) or with no device memory reserved."""
    peak = int((report or {}).get("peak_reserved") or 0)
    if peak <= 0:
        return EXECUTOR_OVERHEAD_BYTES
    return max(0, peak - int(report.get("allocated") or 0)) + CONTEXT_BYTES


def to_come(total: int, free: int, own_held: int, co_tenant_weights: int) -> int:
    """Bytes of the co-tenants' weights not on the device yet: what they will hold less what other processes
    hold now (``total - free - own_held``; everything not ours is counted as theirs, so never overstated)."""
    others_now = max(0, total - free - own_held)
    return max(0, co_tenant_weights - others_now)


def op_check_reserve(floor_bytes: int, margin: float = 1.25) -> int:
    """Bytes no pool may take: the largest op-level check at its smallest shape (one check runs at a time
    on a device), with a margin for its allocator's rounding and the candidate's own buffers."""
    return int(max(0, floor_bytes) * margin)


def pool_plan(wanted: int, free: int, each: int, reserve: int, to_come_bytes: int = 0,
              share: float = POOL_MEMORY_SHARE) -> PoolPlan:
    """``wanted`` warm executors, so that they and the ``HELD_OUT`` ones take at most ``share`` of the room
    left after the co-tenants' weights still to come and the op-check reserve; at least one. When even one
    and the held-out ones exceed the whole room, only the candidate's own is held out (the judge then prepares
    no executor ahead of a load: ``held_out`` 1), so that the check reserve loses one executor less."""
    room = free - to_come_bytes - reserve
    fit = int(share * room) // each - HELD_OUT if room > 0 and each > 0 else 0
    held = HELD_OUT
    while held > 1 and (1 + held) * each > max(room, 0):    # the candidate's own one is always held
        held -= 1
    return PoolPlan(max(1, min(wanted, fit)), each, room, free, to_come_bytes, reserve, held)


def op_check_budget(cap: int, free: int, pending: int) -> int:
    """Bytes one op-level check (both halves) may hold: ``cap`` (a share of the GPU), and at most half of what
    is free once ``pending`` (executors warming, co-tenant weights to come) has landed."""
    return max(0, min(cap, max(0, free - pending) // 2))


def references_ahead(budget: int | None) -> int:
    """Bytes of references the judge may compute ahead of the executor's replies: ``REFERENCES_AHEAD_BYTES``,
    and at most a quarter of the op-check budget (None: no device budget, the CPU)."""
    return REFERENCES_AHEAD_BYTES if budget is None else min(REFERENCES_AHEAD_BYTES, budget // 4)


def describe_memory(device_free: int | None, host_available: int | None) -> str:
    """The memory left when an executor failed to start, for its reason (None: not known)."""
    parts = []
    if device_free is not None:
        parts.append(f"the GPU had {device_free / GIB:.2f} GiB free")
    if host_available is not None:
        parts.append(f"the host {host_available / GIB:.1f} GiB available")
    return "when it failed " + " and ".join(parts) if parts else ""
