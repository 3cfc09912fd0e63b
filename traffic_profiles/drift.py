"""Drift: has the traffic moved enough to compile again? Decided on effect sizes, not p-values.

With thousands of requests any test rejects "same distribution" for trivial differences, so each
feature gets an effect size and a threshold (``DriftThresholds``), and the verdict is drift when any
feature passes its threshold. Defaults are calibrated on the Azure 2023 traces: their first and
second halves stay below every threshold (KS <= 0.083, PSI <= 0.09, Wasserstein <= 0.15 of the mean,
rate and burstiness within 30%), code vs conversation exceeds them (KS 0.35 input, 0.81 output,
inter-arrival CV 13 vs 1.1).

| feature                          | statistic                                    | default |
|----------------------------------|----------------------------------------------|---------|
| input_tokens.ks / output_tokens.ks | Kolmogorov-Smirnov distance                | 0.10    |
| *.wasserstein                    | Wasserstein-1 / old mean (relative shift)    | 0.25    |
| *.psi                            | population stability index, old deciles      | 0.20    |
| requests_per_s                   | abs relative change                          | 0.50    |
| interarrival_cv, fano_1s         | abs relative change (burstiness)             | 0.50    |
| prefix_cache_hit_rate            | abs change (both logs must carry cache info) | 0.10    |
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from . import stats
from .profile import TrafficProfile
from .thresholds import DriftThresholds


@dataclass(frozen=True)
class FeatureDrift:
    name: str
    statistic: float | None      # None when a log lacks the information (never drift then)
    threshold: float
    drifted: bool
    old: float | None = None     # the feature's value in each profile, for the table
    new: float | None = None


@dataclass(frozen=True)
class DriftReport:
    drift: bool
    features: tuple[FeatureDrift, ...]
    old_hash: str
    new_hash: str

    @property
    def drifted(self) -> list[str]:
        return [f.name for f in self.features if f.drifted]

    def to_dict(self) -> dict:
        return {"drift": self.drift, "drifted": self.drifted, "old_hash": self.old_hash,
                "new_hash": self.new_hash, "features": [asdict(f) for f in self.features]}


def _feature(name: str, stat: float | None, threshold: float, old=None, new=None) -> FeatureDrift:
    s = None if stat is None else round(float(stat), 6)
    return FeatureDrift(name, s, threshold, s is not None and s > threshold, old, new)


def _relative(old: float | None, new: float | None) -> float | None:
    if old is None or new is None or old <= 0:
        return None
    return abs(new - old) / old


def compare(old: TrafficProfile, new: TrafficProfile, th: DriftThresholds = DriftThresholds()) -> DriftReport:
    """Per-feature effect sizes of ``new`` against ``old`` and one verdict."""
    feats: list[FeatureDrift] = []
    for name in ("input_tokens", "output_tokens"):
        a, b = old.hist(name), new.hist(name)
        mean_old, mean_new = getattr(old, name)["mean"], getattr(new, name)["mean"]
        w = stats.wasserstein_from_hist(a, b)
        feats += [
            _feature(f"{name}.ks", stats.ks_from_hist(a, b), th.ks, mean_old, mean_new),
            _feature(f"{name}.wasserstein", w / mean_old if mean_old > 0 else None, th.wasserstein,
                     mean_old, mean_new),
            _feature(f"{name}.psi", stats.psi_from_hist(a, b), th.psi, mean_old, mean_new),
        ]
    feats.append(_feature("requests_per_s", _relative(old.requests_per_s, new.requests_per_s), th.rate,
                          old.requests_per_s, new.requests_per_s))
    feats.append(_feature("interarrival_cv", _relative(old.interarrival_cv, new.interarrival_cv),
                          th.burstiness, old.interarrival_cv, new.interarrival_cv))
    f_old, f_new = old.fano.get("1s"), new.fano.get("1s")
    feats.append(_feature("fano_1s", _relative(f_old, f_new), th.burstiness, f_old, f_new))
    c_old, c_new = old.prefix_cache_hit_rate, new.prefix_cache_hit_rate
    feats.append(_feature("prefix_cache_hit_rate",
                          None if c_old is None or c_new is None else abs(c_new - c_old),
                          th.cache_hit, c_old, c_new))
    return DriftReport(any(f.drifted for f in feats), tuple(feats), old.hash, new.hash)
