"""A tier's input realism (DESIGN.md "Tiers"): what the engine's workloads and routers look like.

``TierInputs`` travels as a JSON dict (``EngineConfig.inputs``, ``python -m persistent_engine serve
--inputs``)::

    {"tokens": "uniform" | "zipf" | {"ids": [...]},   # token ids of the steps (ids: the trace's own)
     "routing": {"kind": "power_law", "alpha": 1.2} | {"kind": "histogram", "histogram": [[...]]} | {},
     "prefix_share": 0.0..1.0,                 # share of each batch's cached context that is one prefix
     "weights": "PATH" | null}                 # an HF safetensors checkpoint (file or directory)

* tokens: ``zipf`` draws ranks with P(r) ~ 1/r (``workloads._draw_tokens``), a natural-text-like mix;
  ``{"ids": [...]}``: consecutive windows of the trace's logged prompt tokens (real text order), one
  window per sequence, starting at a seed-chosen offset (cyclic);
* routing: the MoE routers rebuilt so the workloads route with that expert load and clear margins
  (``routing.plant_routing``); absent or uniform: the random routers as they are;
* weights: the slice's weights from a checkpoint instead of seeded random ones (both tiers, when given);
  its routers are the trained ones, so ``routing`` stays uniform (nothing rebuilt);
* prefix_share: sequences of a batch share the first ``prefix_share x context`` cached tokens as a prefix
  cache serves them: their block tables point at the first sequence's (full) blocks, so attention reads
  the same pages (the profile's prefix-cache hit rate). New tokens' slots never lie in shared blocks.

The fast tier keeps the defaults (uniform tokens, random routers: quick, balanced screening); the slow
tier gets what the traffic says (``compiler.search.inputs.tier_inputs``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from persistent_engine.io_struct import WorkloadPoint
from persistent_engine.ops.opdef import new_tokens
from persistent_engine.inputs.routing import RoutingError, RoutingSpec, plant_routing
from persistent_engine.inputs.workloads import make_workload

__all__ = ["TierInputs", "share_prefix"]


@dataclass(frozen=True)
class TierInputs:
    tokens: str = "uniform"                 # "uniform" | "zipf" | "ids" (then token_ids)
    routing: RoutingSpec = field(default_factory=RoutingSpec)
    prefix_share: float = 0.0
    weights: str | None = None
    token_ids: tuple[int, ...] = ()

    def __post_init__(self):
        if self.tokens not in ("uniform", "zipf", "ids") or (self.tokens == "ids") != bool(self.token_ids):
            raise RoutingError(f"tokens must be uniform, zipf or a non-empty list of ids, got {self.tokens!r}")
        if not (math.isfinite(self.prefix_share) and 0.0 <= self.prefix_share <= 1.0):
            raise RoutingError(f"prefix_share must be in [0, 1], got {self.prefix_share}")
        if self.weights and self.routing.kind != "uniform":
            raise RoutingError("a checkpoint's routers are trained: routing skew applies to random weights only")

    @classmethod
    def from_dict(cls, d: dict | None) -> "TierInputs":
        d = d or {}
        unknown = set(d) - {"tokens", "routing", "prefix_share", "weights"}
        if unknown:
            raise RoutingError(f"unknown tier input keys {sorted(unknown)}")
        tok = d.get("tokens", "uniform")
        ids = tuple(int(v) for v in tok.get("ids", ())) if isinstance(tok, dict) else ()
        return cls(tokens="ids" if isinstance(tok, dict) else str(tok), token_ids=ids,
                   routing=RoutingSpec.from_dict(d.get("routing")),
                   prefix_share=float(d.get("prefix_share") or 0.0), weights=d.get("weights") or None)

    def to_dict(self) -> dict:
        tokens = {"ids": list(self.token_ids)} if self.tokens == "ids" else self.tokens
        d = {"tokens": tokens, "routing": self.routing.to_dict(), "prefix_share": self.prefix_share}
        return {**d, "weights": self.weights} if self.weights else d

    def workload(self, model, point: WorkloadPoint, seed: int):
        """``make_workload`` with these tokens, then the batch's shared prefix."""
        if self.tokens == "ids":
            wl = make_workload(model, point, seed=seed, token_ids=self._windows(point, seed))
        else:
            wl = make_workload(model, point, seed=seed, tokens=self.tokens)
        if self.prefix_share > 0:
            share_prefix(wl, int(self.prefix_share * wl.context))
        return wl

    def build(self, model, points: list[WorkloadPoint], variants: int, seed: int) -> tuple[list[list], dict]:
        """The engine's workloads ([point][variant], the engine's seeds) and the routing they measured
        after the routers were rebuilt for all of them (``plant``)."""
        ws = [[self.workload(model, p, seed=seed * 1000 + 17 * i + v) for v in range(variants)]
              for i, p in enumerate(points)]
        return ws, self.plant(model, [w for row in ws for w in row], seed)

    def _windows(self, point: WorkloadPoint, seed: int) -> torch.Tensor:
        """[batch * chunk] ids: sequence b's chunk is the trace's tokens from offset + b * (context + chunk)
        on (its cached context precedes them there), cyclic over the logged ids."""
        batch, context, chunk = int(point.batch), int(point.context), new_tokens(point)
        pool = torch.tensor(self.token_ids, dtype=torch.long)
        start = (int(seed) * 7919) % pool.numel()
        seq = start + torch.arange(batch)[:, None] * (context + chunk) + context + torch.arange(chunk)[None, :]
        return pool[seq.flatten() % pool.numel()]

    def plant(self, model, workloads: list, seed: int) -> dict:
        """Rebuild the routers for ``workloads`` (``routing.plant_routing``); the measured routing as a
        JSON dict (``RoutingStats.to_dict``), {} for a model without MoE layers."""
        if not getattr(model.spec, "is_moe", False):
            return {}
        return plant_routing(model, workloads, self.routing, seed).to_dict()


def share_prefix(wl, tokens: int) -> int:
    """Point every sequence's first ``tokens // block_size`` blocks at sequence 0's (in place); returns the
    number of shared blocks. Only blocks wholly below the context are shared, so the step's new tokens
    (positions >= context) still write to blocks of their own."""
    bs = wl.cache.block_size
    n = min(tokens, wl.context) // bs
    if n and wl.batch > 1:
        wl.cache.block_tables[1:, :n] = wl.cache.block_tables[0, :n]
    return n
