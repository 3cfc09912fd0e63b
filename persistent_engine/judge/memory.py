"""The judge's device-memory accounting: pure functions of byte counts (the engine measures them).

One GPU can hold two engines (the fast and the slow tier of a run on one device), each with a pool of
warm candidate executors, and each judging op-level checks whose two halves (the judge's references, the
executor's runs) allocate at the same time. Each engine only sees what is free when it looks, so every
figure here subtracts what is still coming:

- ``to_come``: the co-tenant engines' weights not on the device yet (the other tier may still be building
  its slice when this one sizes its pool);
- ``op_check_reserve``: what the largest op-level check needs at its smallest shape (``OpDef.fit`` cannot go
  below it: GLM-5.2's fused MoE keeps 2k = 16 experts, ~19 GB by moe.py's estimate), once for this engine
  and once for each co-tenant (two tiers may check at once): never handed to a pool;
- ``pool_plan``: warm executors from a share of what is left after both, fewer when memory is short
  (one at least: a judge without an executor judges nothing);
- ``op_check_budget``: a check's bytes (both halves) within what is free minus the executors still
  warming (each will take its measured footprint) and the co-tenants' own checks;
- ``references_ahead``: references the judge computes ahead while the executor runs, within that budget.

On the H200 (GLM-5.2, fast [0, 2, 3] + slow [0..4], 70.8 GB of weights) the fast tier's fused-MoE check
was fitted to 27 experts (a 32.6 GB budget: half of the 65 GB free when verification began); its
bf16 w13 (27 x 4096 x 6144 x 2 B = 1.27 GiB) then found 199 MiB free: both pools were still warming
(each sized at 35% of the free memory it saw, without the other's) and the other tier may check at once.
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["GIB", "POOL_MEMORY_SHARE", "EXECUTOR_MARGIN_BYTES", "CONTEXT_BYTES", "REFERENCES_AHEAD_BYTES",
           "PoolPlan", "executor_bytes", "to_come", "op_check_reserve", "pool_plan", "op_check_budget",
           "references_ahead", "describe_memory"]

GIB = 1 << 30
POOL_MEMORY_SHARE = 0.35               # of the room left (after weights to come and check reserves) a pool may take
EXECUTOR_MARGIN_BYTES = GIB            # a candidate's own buffers above the baseline executor's measured footprint
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

    def line(self) -> str:
        return (f"pool of {self.size} warm executor(s) x {self.each / GIB:.1f} GiB: {self.free / GIB:.1f} GiB free, "
                f"{self.to_come / GIB:.1f} GiB of co-tenant weights still to come, {self.reserve / GIB:.1f} GiB "
                f"kept for op-level checks, {POOL_MEMORY_SHARE:.0%} of the {max(self.room, 0) / GIB:.1f} GiB left")


def executor_bytes(measured: int, host_arena: int) -> int:
    """One executor's device footprint: the baseline executor's measured one (KV caches, activations,
    context, graphs) or the arena it copies (CPU weights path), plus a candidate's own buffers."""
    return max(measured, host_arena) + EXECUTOR_MARGIN_BYTES


def to_come(total: int, free: int, own_held: int, co_tenant_weights: int) -> int:
    """Bytes of the co-tenants' weights not on the device yet: what they will hold less what other processes
    hold now (``total - free - own_held``; everything not ours is counted as theirs, so never overstated)."""
    others_now = max(0, total - free - own_held)
    return max(0, co_tenant_weights - others_now)


def op_check_reserve(floor_bytes: int, co_tenants: int) -> int:
    """Bytes no pool may take: the largest op-level check at its smallest shape, for this engine and each
    co-tenant engine (their checks can run at the same moment)."""
    return max(0, floor_bytes) * (1 + max(0, co_tenants))


def pool_plan(wanted: int, free: int, each: int, reserve: int, to_come_bytes: int = 0,
              share: float = POOL_MEMORY_SHARE) -> PoolPlan:
    """``wanted`` warm executors, at most ``share`` of the room left after the co-tenants' weights still to
    come and the op-check reserve; at least one."""
    room = free - to_come_bytes - reserve
    fit = int(share * room) // each if room > 0 and each > 0 else 0
    return PoolPlan(max(1, min(wanted, fit)), each, room, free, to_come_bytes, reserve)


def op_check_budget(cap: int, free: int, pending: int, co_tenants: int) -> int:
    """Bytes one op-level check (both halves) may hold: ``cap`` (a share of the GPU), and at most half of what
    is free once ``pending`` (executors warming, co-tenant weights to come) has landed, split with each
    co-tenant engine's check."""
    return max(0, min(cap, max(0, free - pending) // (2 * (1 + max(0, co_tenants)))))


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
