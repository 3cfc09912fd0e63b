"""Per-bucket plan variants: where one composed plan loses at some decode batch sizes, a variant without the
losing optimizations serves those sizes (issue 42: a GEMV searched at batch 1 ran 2-8x slower than cuBLAS at 16).

A plan's ``kernels/composed.py`` serves every step; a variant (``plan.json`` ``variants``) names a range of decode
batch sizes ``[lo, hi]``, the optimizations it keeps (a subset of the plan's) and its own composed file, verified
and measured by the judge like the plan's. ``tkcc serve --plan`` captures the decode CUDA graph of a batch size in
a variant's range with that variant's overrides (eager decodes of that size too); prefill steps run the plan's.

    runs = losing_runs(points, per_member)        # [(lo, hi, names dropped there)] from per-point speedups
    variant_for(24, variants)                     # the variant serving a decode batch of 24, or None
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Mapping, Sequence

from persistent_engine import WorkloadPoint

from compiler.plan.artifact import PlanError, PointSpeedup


@dataclass(frozen=True)
class BucketVariant:
    """One variant as plan.json stores it: decode batch sizes ``lo..hi`` served by ``kernel`` (a composed file
    under ``kernels/``) holding the optimizations ``members``; ``per_point``: its measured speedups."""

    lo: int
    hi: int
    members: tuple[str, ...]
    kernel: str
    per_point: tuple[PointSpeedup, ...] = ()

    def to_dict(self) -> dict:
        return {"batches": [self.lo, self.hi], "members": list(self.members), "kernel": self.kernel,
                "per_point": [p.to_dict() for p in self.per_point]}

    @classmethod
    def from_dict(cls, d: object, where: str) -> "BucketVariant":
        """A variant from plan.json; ``PlanError`` (one line) for a malformed entry."""
        try:
            lo, hi = (int(b) for b in d["batches"])                               # type: ignore[index]
            members = tuple(str(m) for m in d["members"])                         # type: ignore[index]
            kernel = str(d["kernel"])                                             # type: ignore[index]
            pts = tuple(PointSpeedup.from_dict(p) for p in d.get("per_point", ()))  # type: ignore[union-attr]
        except (KeyError, TypeError, ValueError, AttributeError):
            raise PlanError(f"corrupt plan {where}: a variant needs batches [lo, hi], members and kernel") from None
        if not 1 <= lo <= hi or not kernel.startswith("kernels/"):
            raise PlanError(f"corrupt plan {where}: variant batches {lo}..{hi} or kernel {kernel!r} is invalid")
        return cls(lo, hi, members, kernel, pts)


def speedup_at(pp: PointSpeedup) -> float | None:
    """A point's speedup as the plan counts it: the slow tier's, else the fast tier's."""
    return pp.slow if pp.slow is not None else pp.fast


def variant_path(lo: int, hi: int) -> str:
    """The composed file of the variant serving decode batches ``lo..hi``."""
    return f"kernels/bucket_b{lo}-{hi}.py"


def variant_for(batch: int, variants: Sequence[BucketVariant]) -> BucketVariant | None:
    """The variant whose range holds a decode batch of ``batch`` (ranges do not overlap), else None."""
    return next((v for v in variants if v.lo <= batch <= v.hi), None)


def check_disjoint(variants: Sequence[BucketVariant], where: str) -> None:
    """``PlanError`` when two variants' batch ranges overlap (a batch size would have two plans)."""
    spans = sorted((v.lo, v.hi) for v in variants)
    for (_, hi), (lo, _) in zip(spans, spans[1:]):
        if lo <= hi:
            raise PlanError(f"corrupt plan {where}: variant batch ranges overlap at {lo}")


def losing_runs(points: Sequence[WorkloadPoint], per_member: Mapping[str, Mapping[str, float | None]],
                floor: float = 1.0) -> list[tuple[int, int, frozenset[str]]]:
    """``(lo, hi, names)``: runs of consecutive decode batch sizes (ascending) over which the same non-empty set
    of members is slower than the reference (speedup < ``floor``) at every decode point of that batch size.
    ``per_member[name][point.key]`` is the member's own speedup there (None: not timed, not counted as losing).
    Prefill points are not bucketed: a prefill runs the plan's composed file."""
    by_batch: dict[int, set[str] | None] = {}
    for p in points:
        if p.phase != "decode":
            continue
        losing = {n for n, sp in per_member.items() if sp.get(p.key) is not None and sp[p.key] < floor}
        seen = by_batch.get(p.batch)
        by_batch[p.batch] = losing if seen is None else seen & losing
    runs: list[tuple[int, int, frozenset[str]]] = []
    for batch in sorted(by_batch):
        names = frozenset(by_batch[batch] or ())
        if runs and runs[-1][2] == names:
            runs[-1] = (runs[-1][0], batch, names)
        else:
            runs.append((batch, batch, names))
    return [r for r in runs if r[2]]


def spans(runs: list[tuple[int, int, frozenset[str]]], batches: Sequence[int]) -> list[tuple[int, int, frozenset[str]]]:
    """Each run widened to the batch sizes between it and its neighbouring decode points (``batches``: every
    decode point's batch): a size with no point of its own goes to the nearer point, a tie to the larger batch;
    below the smallest point from 1, above the largest without end (``UNBOUNDED``)."""
    points = sorted(set(batches))
    out = []
    for lo, hi, names in runs:
        below = [b for b in points if b < lo]
        above = [b for b in points if b > hi]
        start = -(-(below[-1] + lo) // 2) if below else 1                 # ceil of the midpoint
        end = -(-(hi + above[0]) // 2) - 1 if above else UNBOUNDED
        out.append((start, end, names))
    return out


UNBOUNDED = 1 << 20             # "every larger batch" as a variant's upper bound
