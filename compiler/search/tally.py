"""The one count of an optimize run: what was tried, judged correct, passed the fast tier, accepted,
kept in the plan and dropped (with why). The progress line's final state, the summary and ``--json``,
``plan.json`` (``run.counts``), the report and the UI's run page all read this one record, so they
cannot disagree.

    accepted   kernels confirmed on both tiers + settings accepted by the config replay
    kept       the accepted ones in the composed plan (a subset of accepted)
    dropped    accepted - kept, each with its reason: a composition drop (overrides an op of a faster
               one, never called, not faster together...) or a setting superseded by a better one
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

SUPERSEDED = "a better setting was accepted (one setting is kept)"


@dataclass(frozen=True)
class Tally:
    tried: int
    correct: int
    fast_passed: int
    accepted: int
    kept: int
    dropped: tuple[tuple[str, str], ...]   # (name, why), accepted but not in the plan
    plan_speedup: float | None             # the composed plan's slow-tier speedup; None: nothing kept
    best_single: float | None              # the best accepted candidate alone (slow tier)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["dropped"] = [{"name": n, "why": w} for n, w in self.dropped]
        return d

    @classmethod
    def from_dict(cls, d: dict) -> "Tally":
        return cls(**{**d, "dropped": tuple((x["name"], x["why"]) for x in d.get("dropped", ()))})

    def line(self) -> str:
        """``tried 12, correct 9, fast-pass 4, accepted 3, kept 2, plan 1.210x; dropped 1: why (name)``."""
        plan = "n/a (nothing kept)" if self.plan_speedup is None else f"{self.plan_speedup:.3f}x"
        return (f"tried {self.tried}, correct {self.correct}, fast-pass {self.fast_passed}, accepted "
                f"{self.accepted}, kept {self.kept}, plan {plan}" + dropped_summary(self.dropped))


def tally_of(counts: dict, acceptor: Any, composition: Any) -> Tally:
    """The run's tally from the judge's counters (``tried``/``correct``/``fast_passed``: the progress
    snapshot's), everything the acceptor accepted (``Acceptor`` or ``ConfigAcceptor``: its kernels and
    all its accepted settings, not only the best) and the composition (None: nothing accepted)."""
    inner = getattr(acceptor, "inner", acceptor)
    kernels = list(getattr(inner, "accepted", ()))
    configs = list(getattr(acceptor, "configs", ()))
    parts = tuple(composition.parts) if composition is not None else ()
    kept = {p.name for p in parts}
    dropped = [(n, w) for n, w in (composition.dropped if composition is not None else ()) if n != "*"]
    named = {n for n, _ in dropped}
    dropped += [(c.name, SUPERSEDED) for c in configs if c.name not in kept and c.name not in named]
    dropped += [(a.name, "not in the composition") for a in kernels
                if a.name not in kept and a.name not in named]
    slow = getattr(composition, "slow", None) if parts else None
    return Tally(tried=int(counts.get("tried", 0)), correct=int(counts.get("correct", 0)),
                 fast_passed=int(counts.get("fast_passed", 0)), accepted=len(kernels) + len(configs),
                 kept=len(parts), dropped=tuple(dropped),
                 plan_speedup=None if slow is None or slow != slow else round(float(slow), 4),
                 best_single=max((float(a.slow) for a in kernels + configs), default=None))


def accepted_by_author(acceptor: Any) -> dict[str, int]:
    """How many accepted candidates (kernels and settings) each agent wrote: the agents table's column."""
    inner = getattr(acceptor, "inner", acceptor)
    out: dict[str, int] = {}
    for a in list(getattr(inner, "accepted", ())) + list(getattr(acceptor, "configs", ())):
        out[a.author] = out.get(a.author, 0) + 1
    return out


def dropped_summary(dropped: tuple | list, names: int = 3) -> str:
    """"; dropped N: why (a, b, c, ...)" per reason, most frequent first: a 20-minute run drops hundreds
    of superseded variants, one line each would bury the log (the plan keeps the full list)."""
    by_reason: dict[str, list[str]] = {}
    for name, why in dropped:
        by_reason.setdefault(why, []).append(name)
    parts = []
    for why, who in sorted(by_reason.items(), key=lambda kv: -len(kv[1])):
        shown = ", ".join(who[:names]) + (f", +{len(who) - names} more" if len(who) > names else "")
        parts.append(f"; dropped {len(who)}: {why} ({shown})")
    return "".join(parts)
