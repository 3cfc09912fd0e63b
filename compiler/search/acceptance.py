"""Acceptance and composition (DESIGN.md "How a candidate is judged", step 6).

1. **Fast tier**: the candidate is correct and faster than the reference by more than the measured
   noise: ``speedup > 1 + max(noise_floor, k * noise)``, where ``noise`` is the tier's A/A spread
   (a candidate identical to the reference, timed A/B like any other, at start-up): the largest
   speedup the engine reports for no change at all.
2. **Slow tier A/B**: the same source on the slow-tier engine (many layers, realistic inputs) must be
   correct and beat the slow tier's noise the same way.
3. **Composition**: all accepted candidates (best slow speedup first, one owner per op/knob) are
   composed into one source and re-verified and re-measured on both tiers (a correct result within
   the noise is measured a second time and the mean decides). If the whole set fails or loses to
   its best member, every accepted candidate (best first) is added greedily one at a time and kept
   only while the composition stays correct and keeps beating the noise without getting slower; so
   when a conflict group's winner is not kept, its next-best member takes its place (the deadline
   bounds how many are tried). When the run's budget ran out before any set was measured, the plan is
   the best accepted candidate alone (its own verdicts are its measurement).
4. **Plan-wide PDL** (:meth:`Acceptor.plan_wide_pdl`): the composed source with programmatic dependent launch
   on in every template kernel (``compose.with_pdl``), verified and timed on both tiers, replaces it when it is
   faster on the slow tier beyond the noise (PDL pays only when the neighbouring kernels use it too).
5. **Bucket variants** (:meth:`Acceptor.bucket_variants`, ``compiler.plan.buckets``): where members of the
   composition are slower than the reference at some decode batch sizes (their own per-point speedups), the
   set without them is verified and measured on both tiers and kept for those sizes when it beats the
   composition there by more than the noise (within the composition's deadline).
   The composition keeps up with the search: each acceptance that makes a set of two or more measures the
   running set with it at once (:meth:`Acceptor.running`), so what was accepted is composed and measured
   when the budget ends; the final step reuses those measurements (a set is measured once) and falls back
   on the running set, not on one candidate, when no time is left to measure another.

``evaluate(tier, source) -> CandidateVerdict`` is all this module needs from the fleet.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable

from compiler.fleet.local import unjudged
from compiler.plan.compose import Part, compose, select_compatible, with_pdl
from persistent_engine import CandidateSource, CandidateVerdict, WorkloadPoint
from compiler.plan.artifact import PointSpeedup, seed_parent
from compiler.plan.buckets import losing_runs, spans, speedup_at

TierEvaluate = Callable[[str, str], CandidateVerdict]      # (tier, source) -> its verdict


@dataclass(frozen=True)
class AcceptanceConfig:
    noise_floor: float = 0.01       # never accept less than 1% faster
    noise_k: float = 1.0            # multiples of the measured noise to beat


@dataclass(frozen=True)
class Decision:
    accepted: bool
    stage: str                      # "fast" | "slow" (where it stopped, or "slow" when accepted)
    reason: str
    fast: float | None = None
    slow: float | None = None
    threshold: float = 0.0


@dataclass(frozen=True)
class Accepted:
    """A candidate confirmed on both tiers."""

    name: str
    source: str
    author: str
    targets: tuple[str, ...]
    config_keys: tuple[str, ...]
    fast: float
    slow: float
    per_point: tuple[PointSpeedup, ...]
    noise: float
    description: str = ""
    idea_id: Any = None
    candidate_id: Any = None                     # the board's id of the source


@dataclass(frozen=True)
class Composition:
    """What composing the accepted set gave: the parts kept, the one source, both tiers' speedups."""

    parts: tuple[Accepted, ...]
    source: str
    fast: float
    slow: float
    per_point: tuple[PointSpeedup, ...]
    dropped: tuple[tuple[str, str], ...] = ()      # (name, why)
    vs_torch_compile: float | None = None
    variants: tuple[tuple[int, int, "Composition"], ...] = ()     # (lo, hi, the set serving decode batches lo..hi)
    pdl: bool = False                              # the source runs every template kernel with PDL (plan_wide_pdl)

    @classmethod
    def alone(cls, acc: Accepted, dropped: tuple[tuple[str, str], ...] = ()) -> "Composition":
        """One accepted candidate as a set of one: its own verdicts on both tiers are its measurement."""
        return cls((acc,), compose([Part(acc.name, acc.source, acc.targets, acc.config_keys)]),
                   acc.fast, acc.slow, acc.per_point, dropped)


SHADOWED = "shadowed by a composite override: never called when composed"
_NEVER_CALLED = re.compile(r"override (\S+) never called")


def _never_called(*verdicts) -> set[str]:
    """Op names the engine reported as overridden but never called (the "kernel actually ran" guard)."""
    names: set[str] = set()
    for v in verdicts:
        for r in v.reasons if v is not None else []:
            names.update(_NEVER_CALLED.findall(str(r)))
    return names


def _owned(parts: list[Accepted]) -> set[tuple[str, str]]:
    """("op", name) and ("knob", key) pairs that ``parts`` set."""
    return {("op", t) for a in parts for t in a.targets} | {("knob", k) for a in parts for k in a.config_keys}


def _why_dropped(fv: Any, sv: Any) -> str:
    """Why a composition with a candidate was not kept: incorrect, no gain, or not measured (the fleet
    refused it past the run's budget, or cut it there: ``unjudged``, a verdict about the clock)."""
    bad = [v for v in (fv, sv) if v is not None and not v.correct]
    if not bad:
        return "no gain when composed"
    return "not measured when composed: the run's budget ran out" if unjudged(bad[0]) else "incorrect when composed"


def threshold(noise: float, cfg: AcceptanceConfig) -> float:
    """The speedup a verdict must exceed on a tier whose A/A spread is ``noise``."""
    return 1.0 + max(cfg.noise_floor, cfg.noise_k * noise)


def screen(verdict: CandidateVerdict, noise: float, cfg: AcceptanceConfig, tier: str) -> Decision:
    """Correct and beyond the noise on one tier?"""
    speedup = verdict.speedup
    need = threshold(noise, cfg)
    if not verdict.correct:
        reasons = verdict.reasons or ["incorrect"]
        return Decision(False, tier, f"rejected on the {tier} tier: {reasons[0]}", threshold=need)
    if speedup is None:
        why = getattr(verdict, "untimed", "") or "not timed"
        return Decision(False, tier, f"{why} (the {tier} tier)", threshold=need)
    if speedup <= need:
        return Decision(False, tier, f"{speedup:.3f}x on the {tier} tier is within the noise "
                                     f"(needs > {need:.3f}x)", threshold=need, **{tier: speedup})
    return Decision(True, tier, f"{speedup:.3f}x > {need:.3f}x on the {tier} tier", threshold=need,
                    **{tier: speedup})


def point_speedups(verdict: CandidateVerdict | None) -> dict[tuple, float]:
    """Per-point speedups of a verdict keyed by (phase, batch, context, chunk)."""
    return {entry.point.key: entry.speedup for entry in (verdict.per_point if verdict is not None else ())}


def _mean_at(per_point: tuple[PointSpeedup, ...], keys: set) -> float:
    """Mean speedup over the points ``keys`` (1.0 where a point was not timed)."""
    vals = [speedup_at(pp) for pp in per_point if pp.point.key in keys]
    vals = [1.0 if v is None else v for v in vals]
    return sum(vals) / len(vals) if vals else 1.0


def merge_points(points: list[WorkloadPoint], fast: CandidateVerdict | None,
                 slow: CandidateVerdict | None) -> tuple[PointSpeedup, ...]:
    """The fast and slow speedups at each workload point (None when missing)."""
    f, s = point_speedups(fast), point_speedups(slow)
    return tuple(PointSpeedup(p, f.get(p.key), s.get(p.key)) for p in points)


def name_of(source: str, author: str, n: int) -> str:
    """A short name: author, the ops it overrides (or "config"), and a running number; a seed keeps
    the name it had in the parent plan (``plan.seed_parent``), so a recompile does not lengthen it."""
    if seed_parent(author):
        return seed_parent(author)
    base = f"{author}-{'+'.join(CandidateSource.parse(source).overrides) or 'config'}"
    return f"{base}-{n}"


@dataclass
class Acceptor:
    """Runs steps 1-3 against a fleet. Thread-safe by construction of its callers: the loop calls
    :meth:`consider` from agent threads, and ``evaluate`` serialises per tier."""

    evaluate: TierEvaluate
    points: list[WorkloadPoint]
    noise: dict[str, float]                          # {"fast": x, "slow": y} A/A spreads
    cfg: AcceptanceConfig = field(default_factory=AcceptanceConfig)
    on_accept: Callable[[Accepted], None] | None = None
    accepted: list[Accepted] = field(default_factory=list)
    log: list[dict] = field(default_factory=list)
    running: Composition | None = None               # the measured set composed as acceptances came in
    _measured: dict = field(default_factory=dict, init=False, repr=False)   # composed source -> its result
    _running_lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)

    def outrun_by(self, source: str, verdict: Any) -> tuple[Accepted, ...]:
        """The accepted candidates (two or more) that override exactly the ops and knobs ``source`` does and
        were at least as fast on the fast tier; empty when fewer. The composition keeps one owner per op (the
        faster on the slow tier) and one runner-up is what it falls back on, so a third such candidate's
        slow-tier confirmation would go unused: it is not confirmed, its time goes to the search. On the H200
        (llama-1b, --budget 7m) 12 of 17 slow-tier confirmations were of variants the composition dropped."""
        if verdict.speedup is None:
            return ()
        declared = CandidateSource.parse(source)
        owns = (frozenset(declared.overrides), frozenset(declared.config_keys))
        faster = tuple(a for a in self.accepted if (frozenset(a.targets), frozenset(a.config_keys)) == owns
                       and a.fast >= float(verdict.speedup))
        return faster if len(faster) >= 2 else ()

    def consider(self, source: str, fast_verdict: Any, *, author: str, idea_id: Any = None,
                 candidate_id: Any = None) -> Decision:
        """Given a fast-tier verdict, decide; when it beats the noise (and is not outrun, :meth:`outrun_by`),
        confirm on the slow tier."""
        d = screen(fast_verdict, self.noise.get("fast", 0.0), self.cfg, "fast")
        if not d.accepted:
            self.log.append({"author": author, "stage": "fast", "reason": d.reason})
            return d
        outrun = self.outrun_by(source, fast_verdict)
        if outrun:
            reason = (f"{d.fast:.3f}x on the fast tier, no faster than {len(outrun)} accepted candidates for the "
                      f"same ops ({', '.join(a.name for a in outrun[:2])}): not confirmed on the slow tier")
            self.log.append({"author": author, "stage": "fast", "reason": reason})
            return Decision(False, "fast", reason, fast=d.fast, threshold=d.threshold)
        slow_verdict = self.evaluate("slow", source)
        ds = screen(slow_verdict, self.noise.get("slow", 0.0), self.cfg, "slow")
        decision = Decision(ds.accepted, "slow", ds.reason, fast=d.fast, slow=ds.slow, threshold=ds.threshold)
        self.log.append({"author": author, "stage": "slow", "reason": ds.reason})
        if ds.accepted:
            declared = CandidateSource.parse(source)
            acc = Accepted(name=name_of(source, author, len(self.accepted) + 1), source=source,
                           author=author, targets=declared.overrides, config_keys=declared.config_keys, fast=float(d.fast),
                           slow=float(ds.slow), per_point=merge_points(self.points, fast_verdict, slow_verdict),
                           noise=max(self.noise.get("fast", 0.0), self.noise.get("slow", 0.0)),
                           description=declared.description, idea_id=idea_id, candidate_id=candidate_id)
            self.accepted.append(acc)
            if self.on_accept is not None:
                self.on_accept(acc)
            self._compose_running(acc)
        return decision

    def _compose_running(self, acc: Accepted) -> None:
        """The running set with ``acc`` (taking its ops and knobs from a slower owner), measured on both tiers
        now: it replaces the running set when correct and no slower on the slow tier than it. The first
        acceptance is a set of one, its own verdicts its measurement. The set is chosen and replaced under
        the lock, measured outside it; another acceptance meanwhile measures its own set, and the faster wins."""
        alone = Composition.alone(acc)
        with self._running_lock:
            running = self.running
            if running is None or (len(running.parts) == 1 and _owned(running.parts) == _owned([acc])):
                self.running = max([alone] + ([running] if running else []), key=lambda c: c.slow)
                return
        ranked = sorted([*running.parts, acc], key=lambda a: -a.slow)
        kept, _ = select_compatible([Part(a.name, a.source, a.targets, a.config_keys) for a in ranked])
        names = {p.name for p in kept}
        members = [a for a in ranked if a.name in names]
        if acc not in members:
            return                                   # a faster accepted one owns its ops: nothing new to measure
        src, fv, sv, ok = self._measure(self._measured, members)
        with self._running_lock:
            choices = [self.running, alone]
            if ok and sv.speedup >= running.slow * (1 - self.noise.get("slow", 0.0)):
                choices.append(Composition(tuple(members), src, float(fv.speedup), float(sv.speedup),
                                           merge_points(self.points, fv, sv)))
            self.running = max(choices, key=lambda c: (c.slow, len(c.parts)))

    def compose(self, deadline: float | None = None) -> Composition | None:
        """Step 3. None when nothing was accepted. ``deadline`` (monotonic) bounds the greedy phase."""
        if not self.accepted:
            return None
        ranked = sorted(self.accepted, key=lambda a: -a.slow)
        kept, conflicting = select_compatible([Part(a.name, a.source, a.targets, a.config_keys) for a in ranked])
        measure = functools.partial(self._measure, self._measured)    # sets measured during the search count
        done, shadowed_out = self._compose_compatible(ranked, kept, conflicting, measure)
        if done is not None:
            return done
        found = self._compose_greedy(ranked, conflicting, shadowed_out, measure, deadline)
        if self.running is not None and len(self.running.parts) > 1 and self.running.slow > found.slow:
            names = {a.name for a in self.running.parts}     # the search's set beat what the greedy pass found
            why = dict(found.dropped)
            return dataclasses.replace(self.running, dropped=tuple(
                (a.name, why.get(a.name, "no gain when composed")) for a in ranked if a.name not in names))
        return found

    def plan_wide_pdl(self, composition: Composition, deadline: float | None = None) -> Composition:
        """Step 4: ``composition`` with PDL on in every template kernel (``with_pdl``) when that source is correct
        on both tiers and faster than it on the slow tier beyond the noise; else ``composition``. Cost: two tier
        evaluations when the source has a PDL knob at 0, none past ``deadline``."""
        src = with_pdl(composition.source)
        if src is None or (deadline is not None and time.monotonic() > deadline):
            return composition
        both = self._both_tiers(src)
        if both is None or not both[1].speedup > composition.slow * (1 + self.noise.get("slow", 0.0)):
            return composition
        fv, sv = both
        return dataclasses.replace(composition, source=src, fast=float(fv.speedup), slow=float(sv.speedup),
                                   per_point=merge_points(self.points, fv, sv), pdl=True)

    def bucket_variants(self, composition: Composition, deadline: float | None = None) -> Composition:
        """Step 4: ``composition`` with the variants that serve decode batch sizes where some of its members lose
        (``buckets.losing_runs`` over their own per-point speedups): the set without them, verified on both tiers,
        kept when its mean speedup at those points beats the composition's by more than the noise. Members that
        set CONFIG knobs stay in every variant (a plan has one engine config). Cost: two tier evaluations per
        distinct losing set, none past ``deadline``."""
        per_member = {a.name: {pp.point.key: speedup_at(pp) for pp in a.per_point}
                      for a in composition.parts if not a.config_keys}
        runs = losing_runs(self.points, per_member)
        noise = max(self.noise.values(), default=0.0)
        out = []
        for (lo, hi, names), (start, end, _) in zip(runs, spans(runs, [p.batch for p in self.points
                                                                      if p.phase == "decode"])):
            if deadline is not None and time.monotonic() > deadline:
                break
            variant = self._variant([a for a in composition.parts if a.name not in names], composition.pdl)
            at = {p.key for p in self.points if p.phase == "decode" and lo <= p.batch <= hi}
            if variant is not None and \
                    _mean_at(variant.per_point, at) > _mean_at(composition.per_point, at) * (1 + noise):
                out.append((start, end, variant))
        return dataclasses.replace(composition, variants=tuple(out))

    def _variant(self, parts: list[Accepted], pdl: bool) -> Composition | None:
        """``parts`` composed (with PDL on where the plan has it) and verified on both tiers (None: incorrect or
        not measured); no parts: the reference, which needs no verdict."""
        if not parts:
            return Composition((), compose([]), 1.0, 1.0, tuple(PointSpeedup(p, 1.0, 1.0) for p in self.points))
        src = compose([Part(a.name, a.source, a.targets, a.config_keys) for a in parts])
        src = (with_pdl(src) or src) if pdl else src
        both = self._both_tiers(src)
        if both is None:
            return None
        fv, sv = both
        return Composition(tuple(parts), src, float(fv.speedup), float(sv.speedup), merge_points(self.points, fv, sv))

    def _both_tiers(self, src: str) -> tuple[Any, Any] | None:
        """(fast, slow) verdicts of ``src`` when it is correct and timed on both (the slow tier only after the
        fast one); None otherwise."""
        fv = self.evaluate("fast", src)
        sv = self.evaluate("slow", src) if fv.correct and fv.speedup is not None else None
        return None if sv is None or not sv.correct or sv.speedup is None else (fv, sv)

    def _on_tier(self, tier: str, src: str) -> tuple[Any, bool]:
        """A tier's verdict; a correct one within the noise is measured once more and the mean of
        the two speedups decides (a transient load spike must not drop a proven set)."""
        v = self.evaluate(tier, src)
        noise = self.noise.get(tier, 0.0)
        if screen(v, noise, self.cfg, tier).accepted or not v.correct or v.speedup is None:
            return v, screen(v, noise, self.cfg, tier).accepted
        again = self.evaluate(tier, src)
        if not again.correct or again.speedup is None:
            return again, False
        mean = (float(v.speedup) + float(again.speedup)) / 2
        v = dataclasses.replace(v, speedup=mean)
        return v, mean > threshold(noise, self.cfg)

    def _measure(self, measured: dict, parts: list[Accepted]) -> tuple[str, Any, Any, bool]:
        """Both tiers' verdicts of the composed ``parts``; the same set is measured once (``measured``)."""
        src = compose([Part(a.name, a.source, a.targets, a.config_keys) for a in parts])
        if src in measured:
            return measured[src]
        fv, ok = self._on_tier("fast", src)
        sv, ok = self._on_tier("slow", src) if ok else (None, False)
        if not _why_dropped(fv, sv).startswith("not measured"):   # a refusal for want of time is no result
            measured[src] = (src, fv, sv, ok)
        return src, fv, sv, ok

    def _compose_compatible(self, ranked: list[Accepted], kept: list, conflicting: list,
                            measure) -> tuple[Composition | None, list[Accepted]]:
        """The fastest compatible set at once: its Composition when it holds up (no slower than the best
        single one), else None and the accepted ones that override only ops shadowed in it."""
        by_name = {a.name: a for a in ranked}
        dropped = [(p.name, "overrides an op or knob of a faster accepted candidate") for p in conflicting]
        members = [by_name[p.name] for p in kept]
        src, fv, sv, ok = measure(members)
        shadowed = _never_called(fv, sv)
        shadowed_out: list[Accepted] = []           # all accepted ones overriding only shadowed ops
        if not ok and shadowed:
            # a composite override (e.g. silu_mul_linear) can leave a fine one (silu_and_mul) with no
            # call site left; the engine rejects such a set, so drop those members and measure again
            gone = [a for a in members if a.targets and set(a.targets) <= shadowed]
            if gone and len(gone) < len(members):
                dropped = [(a.name, SHADOWED) for a in gone] + dropped
                shadowed_out = [a for a in ranked if a.targets and set(a.targets) <= shadowed]
                members = [a for a in members if a not in gone]
                src, fv, sv, ok = measure(members)
        best_single = members[0].slow
        if ok and (len(members) == 1 or sv.speedup >= best_single * (1 - self.noise.get("slow", 0.0))):
            return Composition(tuple(members), src, float(fv.speedup), float(sv.speedup),
                               merge_points(self.points, fv, sv), tuple(dropped)), shadowed_out
        return None, shadowed_out

    def _compose_greedy(self, ranked: list[Accepted], conflicting: list, shadowed_out: list[Accepted], measure,
                        deadline: float | None) -> Composition:
        """Greedy over every accepted candidate, best first: when a conflict group's winner is not kept,
        its runner-up is tried in its place, so the conflict reasons are decided here afresh."""
        dropped = [(a.name, SHADOWED) for a in shadowed_out]
        skip = {a.name for a in shadowed_out}
        runners_up = {p.name for p in conflicting}
        chosen: list[Accepted] = []
        best: tuple[str, Any, Any] | None = None
        for a in ranked:                        # keep a candidate only if it helps
            if a.name in skip:
                continue
            if _owned(chosen) & _owned([a]):
                dropped.append((a.name, "overrides an op or knob of a faster accepted candidate"))
                continue
            if deadline is not None and time.monotonic() > deadline and (best is not None or a.name in runners_up):
                dropped.append((a.name, "no time left to re-verify it in the composition"))
                continue
            src, fv, sv, ok = measure(chosen + [a])
            if ok and (best is None or sv.speedup > best[2].speedup):
                chosen.append(a)
                best = (src, fv, sv)
            else:
                dropped.append((a.name, _why_dropped(fv, sv)))
        if best is None and any(why.startswith("not measured") for _, why in dropped):
            # the budget ran out before any set was measured here: the set measured during the search, else
            # the best accepted candidate alone, whose own verdicts on both tiers are its measurement
            if self.running is not None and self.running.slow >= ranked[0].slow:
                names = {a.name for a in self.running.parts}
                return dataclasses.replace(self.running, dropped=tuple((n, w) for n, w in dropped if n not in names))
            return Composition.alone(ranked[0], tuple((n, w) for n, w in dropped if n != ranked[0].name))
        if best is None:
            return Composition((), compose([]), 1.0, 1.0, tuple(
                PointSpeedup(p, 1.0, 1.0) for p in self.points),
                tuple(dropped))
        src, fv, sv = best
        return Composition(tuple(chosen), src, float(fv.speedup), float(sv.speedup),
                           merge_points(self.points, fv, sv), tuple(dropped))
