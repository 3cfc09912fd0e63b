"""Drift thresholds: the effect size above which a feature counts as drifted (no pandas/numpy
import, so the CLI can build its parser from them cheaply)."""

from __future__ import annotations

from dataclasses import dataclass, fields


@dataclass(frozen=True)
class DriftThresholds:
    ks: float = 0.10
    wasserstein: float = 0.25
    psi: float = 0.20
    rate: float = 0.50
    burstiness: float = 0.50
    cache_hit: float = 0.10

    @classmethod
    def names(cls) -> list[str]:
        return [f.name for f in fields(cls)]
