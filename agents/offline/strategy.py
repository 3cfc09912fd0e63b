"""Search strategies over the template library, steered by where the time goes.

An *arm* is one template. Its prior is what a kernel at the roofline could take off the baseline
time in its op (``op_priors``): ``sum_p w_p * f_p(op) * headroom_p(op)`` over the workload points, where
``w_p`` is the point's weight, ``f_p`` the op's fraction of the point's profiled time (``op_shares``) and
``headroom = 1 - roofline_ms / measured_ms`` (``agents.roofline.headroom``; 0.5, neither favoured nor
dropped, where the cost model has no roofline for the op or there is no spec or hardware). A share says
how much an op could give at most, not how much is left: on the H200 a Kimi-K3 slice search ordered by
share spent its whole budget on ``moe_experts_situ`` (19% of the step, the reference already near HBM
bandwidth: best candidate 1.007x) and ``linear`` (cuBLAS: GEMV candidates 0.32-0.89x) and never tried
``kda_decode.triton``, 6x faster than the reference at batch 8-32 (0.084 vs 0.533 ms); with headroom
``kda_decode`` (8% of the step at 9% of its roofline) comes first. Both strategies propose one :class:`~agents.templates.Choice` at a time that is valid
at the model's sizes and not in ``tried``:

- :class:`BanditStrategy` (UCB1 weighted by the prior): untried arms in prior order first, then the
  arm with the highest ``share * (mean reward + c * sqrt(ln N / n))``; within the arm, a mutation of
  its best setting so far (or its default first).
- :class:`EvolutionStrategy`: a population of evaluated settings; tournament selection of a parent
  by reward (ties broken by prior), one or two knobs mutated to a neighbouring value; with
  probability ``p_new`` (or while the population is empty) an untried template's default.

Reward of a verdict: ``speedup - 1`` when correct and timed, ``-1`` when rejected (so a crashing
template is not drawn again soon), 0 for a correct but untimed verdict.

A plan keeps only the best setting per op, so what a further pull of an arm can add is an
improvement on its best, not its mean: an arm whose best has not improved for ``n`` pulls has its
positive reward scaled by ``STALE_DECAY ** n`` in both strategies, and yields to the other ops until
they plateau too (a 20-minute H200 run without it spent 85% of its 279 candidates re-tuning one op
whose best had settled after about ten).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any, Iterable, Mapping, Sequence

from agents.roofline import HEADROOM_UNKNOWN
from persistent_engine import WorkloadPoint
from agents.templates import Choice, Template

MAX_DRAWS = 200          # attempts to find an untried valid setting before an arm is declared spent
STALE_DECAY = 0.8        # per pull without a new best: 10 such pulls weigh an arm's gains 0.11x


def op_shares(profile: Mapping[str, Any] | None) -> dict[str, float]:
    """Fraction of baseline time per op from an engine profile: ``sum_p w_p * f_p(op)``, where ``f_p`` is the
    op's fraction of point p's profiled time and ``w_p`` the point's weight (its share of GPU time).

    That is what the judge's speedup can gain from the op: the speedup is ``sum w / sum(w / s_p)`` over the
    points, so making the op r times faster gives ``1 / (1 - (1 - 1/r) sum_p w_p f_p)``. Weighting the op's
    milliseconds by ``w_p`` instead counts a long point's time twice: the Kimi-K3 slice's 220 ms prefill
    (weight 0.17) then ranked its kernels above the decode step's (weight 0.83, 6.6 ms), and the one op the
    decode step could gain most on (``kda_decode``, 6x faster as a template) was never searched.

    Accepts the supervisor's ``{"per_point": [{"point": {..., "weight"}, "ops": {op: {"ms", "calls"}}}]}``
    as well as ``{op: seconds}``, ``{op: {"ms"|"us"|"total_s"...: t}}`` and ``{"ops": {...}}``.

    A region op the profile looked through (``persistent_engine.measure.profiler``: a decoder layer, the K/V write
    around the qkv composite, running its default) has no time of its own: its share is that of the ops whose
    entries name it in ``regions`` (what an override of it replaces), on top of theirs, so the shares of the
    ops alone sum to 1 and a region's overlaps them.
    """
    return _weighted(point_fractions(profile), lambda point, op: 1.0)


def op_priors(profile: Mapping[str, Any] | None, spec: Any = None, hw: str | None = None,
              known_ops: Iterable[str] = (), default: float = HEADROOM_UNKNOWN) -> dict[str, float]:
    """What a kernel at the roofline could take off the baseline time, per op: ``sum_p w_p * f_p(op) *
    headroom_p(op)`` over the profile's points (``agents.roofline.headroom``: ``1 - roofline / measured``
    at that point, ``default`` where the cost model has no roofline for the op or there is no spec or
    hardware), over ``sum_p w_p``. Ordered by prior, highest first."""
    from agents.roofline import headroom

    known = tuple(known_ops)
    rooms: dict[int, dict[str, float]] = {}

    def room(point: WorkloadPoint | None, op: str) -> float:
        if point is None:
            return default
        if id(point) not in rooms:
            rooms[id(point)] = headroom(spec, hw, point, profile or {}, known, default)
        return rooms[id(point)].get(op, default)

    return _weighted(point_fractions(profile), room)


def point_fractions(profile: Mapping[str, Any] | None) -> list[tuple[float, WorkloadPoint | None, dict[str, float]]]:
    """``[(weight, point or None, {op: fraction of the point's profiled time})]`` of a profile (the forms
    :func:`op_shares` accepts; a profile without points is one point of weight 1), a looked-through region
    taking the fractions of the ops run inside it. The profile is JSON (the supervisor's): its point maps
    become typed points here, None where a row's map names no batch."""
    def fractions(ops: Any) -> dict[str, float]:
        if isinstance(ops, Mapping):
            items = ops.items()
        elif isinstance(ops, (list, tuple)):
            items = [(row.get("op"), row) for row in ops if isinstance(row, Mapping)]
        else:
            return {}
        times = [(op, _seconds(value), _regions(value)) for op, value in items]
        times = [(op, t, r) for op, t, r in times if isinstance(op, str) and t is not None and t > 0]
        point_total = sum(t for _, t, _r in times)
        out: dict[str, float] = {}
        for op, t, regions in times:
            for name in (op, *regions):
                out[name] = out.get(name, 0.0) + t / point_total
        return out

    prof = profile or {}
    if isinstance(prof, Mapping) and isinstance(prof.get("per_point"), (list, tuple)):
        rows = []
        for row in prof["per_point"]:
            if isinstance(row, Mapping):
                raw = row.get("point") if isinstance(row.get("point"), Mapping) else {}
                point = WorkloadPoint.from_dict(raw) if "batch" in raw else None
                rows.append((float(raw.get("weight", 1.0) or 0.0), point, fractions(row.get("ops", {}))))
        return rows
    if isinstance(prof, Mapping):
        return [(1.0, None, fractions(prof.get("ops", prof.get("per_op", prof))))]
    return []


def _weighted(rows, factor) -> dict[str, float]:
    """``sum_p w_p * f_p(op) * factor(point, op)``, over the weight of the points that measured anything,
    highest first (with ``factor`` 1 the ops' shares sum to 1, a looked-through region's overlapping them)."""
    totals: dict[str, float] = {}
    weight = 0.0
    for w, point, fractions in rows:
        if fractions:
            weight += w
        for op, f in fractions.items():
            totals[op] = totals.get(op, 0.0) + w * f * factor(point, op)
    return {op: t / weight for op, t in sorted(totals.items(), key=lambda kv: -kv[1])} if weight > 0 else {}


def _regions(value: Any) -> tuple[str, ...]:
    """The looked-through regions an op's profile entry names (``"regions"``), none for other forms."""
    names = value.get("regions") if isinstance(value, Mapping) else None
    return tuple(n for n in names if isinstance(n, str)) if isinstance(names, (list, tuple)) else ()


def _seconds(value: Any) -> float | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, Mapping):
        for key, scale in (("total_s", 1.0), ("time_s", 1.0), ("seconds", 1.0), ("s", 1.0), ("median_s", 1.0),
                           ("ms", 1e-3), ("time_ms", 1e-3), ("median_ms", 1e-3), ("total_ms", 1e-3),
                           ("us", 1e-6), ("time_us", 1e-6), ("median_us", 1e-6), ("total_us", 1e-6),
                           ("ns", 1e-9), ("median_ns", 1e-9)):
            if key in value and isinstance(value[key], (int, float)):
                return float(value[key]) * scale
        vals = [_seconds(v) for k, v in value.items() if k not in ("op", "count", "calls", "weight", "share")]
        vals = [v for v in vals if v is not None]
        return sum(vals) if vals else None
    return None


def reward_of(verdict: Any) -> float:
    correct = bool(getattr(verdict, "correct", False))
    speedup = getattr(verdict, "speedup", None)
    if not correct:
        return -1.0
    return 0.0 if speedup is None else float(speedup) - 1.0


@dataclass
class ArmStats:
    """What is known about one template: evaluated settings and their rewards."""

    pulls: int = 0
    total: float = 0.0
    best_reward: float = -math.inf
    best_knobs: dict | None = None
    spent: bool = False
    since_best: int = 0          # pulls since the best reward last improved
    pending: int = 0             # settings proposed whose verdict is not in yet (``SearchState.propose``)

    @property
    def mean(self) -> float:
        return self.total / self.pulls if self.pulls else 0.0

    def fresh(self, reward: float) -> float:
        """``reward`` as a guide to this arm's next pull: gains discounted by how long it has plateaued."""
        return reward * STALE_DECAY ** self.since_best if reward > 0 else reward


@dataclass
class SearchState:
    """Results so far (one agent's, plus whatever it read from the board); strategies read it."""

    arms: dict[str, ArmStats] = field(default_factory=dict)
    results: list[tuple[Choice, float]] = field(default_factory=list)

    def record(self, choice: Choice, reward: float) -> None:
        s = self.arms.setdefault(choice.template.name, ArmStats())
        s.pulls += 1
        s.total += reward
        if reward > s.best_reward:
            s.best_reward, s.best_knobs, s.since_best = reward, dict(choice.knobs), 0
        else:
            s.since_best += 1
        self.results.append((choice, reward))

    def propose(self, choice: Choice) -> None:
        """``choice`` was proposed and will be evaluated: until its verdict is in (``settle``) its arm counts
        as pulled, so agents proposing at once spread over the untried arms instead of all taking the first
        (the DeepSeek-V4 slice's 4-minute H200 search evaluated five ``linear`` settings and nothing else,
        each of four agents drawing the same untried arm before any verdict had come back)."""
        self.arms.setdefault(choice.template.name, ArmStats()).pending += 1

    def settle(self, choice: Choice) -> None:
        """The verdict of a proposed ``choice`` is in (``record`` it as well)."""
        s = self.arms.get(choice.template.name)
        if s is not None and s.pending > 0:
            s.pending -= 1

    def pulls(self) -> int:
        return sum(a.pulls for a in self.arms.values())


def mutate(template: Template, knobs: Mapping[str, Any], rng: random.Random, n: int = 1) -> dict:
    """``knobs`` with ``n`` knobs moved to a neighbouring (sometimes any other) value."""
    out = dict(knobs)
    movable = [k for k in template.knobs if len(k.values) > 1]
    for knob in rng.sample(movable, min(n, len(movable))):
        values = list(knob.values)
        ordered = sorted(values, key=order_key)
        i = ordered.index(out[knob.name]) if out[knob.name] in ordered else 0
        if rng.random() < 0.75:
            j = min(max(i + rng.choice((-1, 1)), 0), len(ordered) - 1)
            if j == i:
                j = i + 1 if i + 1 < len(ordered) else i - 1
        else:
            j = rng.choice([x for x in range(len(ordered)) if x != i])
        out[knob.name] = ordered[j]
    return out


def order_key(v: Any) -> tuple:
    return (0, v, "") if isinstance(v, (int, float)) else (1, 0, str(v))


def _fresh(template: Template, seeds: Iterable[dict], tried: set[str], dims: Mapping[str, int],
           rng: random.Random) -> Choice | None:
    """The first untried valid setting among ``seeds``, then mutations of them, then random draws."""
    seeds = list(seeds)
    for knobs in seeds:
        c = Choice(template, knobs)
        if c.key() not in tried and not template.check(knobs, dims):
            return c
    base = seeds[0] if seeds else template.default()
    for i in range(MAX_DRAWS):
        if i < MAX_DRAWS // 2:
            knobs = mutate(template, base, rng, n=1 + (i >= MAX_DRAWS // 4))
        else:
            knobs = {k.name: rng.choice(k.values) for k in template.knobs}
        c = Choice(template, knobs)
        if c.key() not in tried and not template.check(knobs, dims):
            return c
    return None


class Strategy:
    """Proposes the next choice to evaluate; ``None`` when every arm is spent."""

    def propose(self, arms: Sequence[Template], shares: Mapping[str, float], state: SearchState,
                tried: set[str], dims: Mapping[str, int], rng: random.Random) -> Choice | None:
        raise NotImplementedError


@dataclass(frozen=True)
class BanditStrategy(Strategy):
    """UCB1 over templates, weighted by the op's share of the step time."""

    c: float = 0.5
    min_share: float = 1e-3

    def propose(self, arms, shares, state, tried, dims, rng):
        live = [t for t in arms if shares.get(t.op, 0.0) >= self.min_share
                and not state.arms.get(t.name, ArmStats()).spent]
        if not live:
            return None
        total = max(state.pulls(), 1)

        def score(t: Template) -> float:
            s = state.arms.get(t.name, ArmStats())
            if s.pulls + s.pending == 0:
                return math.inf
            exploit = s.fresh(0.5 * (s.mean + s.best_reward)) if s.pulls else 0.0
            return shares[t.op] * (exploit + self.c * math.sqrt(math.log(total + 1) / (s.pulls + s.pending)))

        order = sorted(live, key=lambda t: (score(t), shares[t.op], -len(t.name)), reverse=True)
        for t in order:
            s = state.arms.setdefault(t.name, ArmStats())
            seeds = [s.best_knobs] if s.best_knobs else [t.default()]
            c = _fresh(t, seeds, tried, dims, rng)
            if c is not None:
                return c
            s.spent = True
        return None


@dataclass(frozen=True)
class EvolutionStrategy(Strategy):
    """Tournament selection over evaluated settings, mutation of one or two knobs."""

    tournament: int = 3
    p_new: float = 0.25
    min_share: float = 1e-3

    def propose(self, arms, shares, state, tried, dims, rng):
        live = {t.name: t for t in arms if shares.get(t.op, 0.0) >= self.min_share
                and not state.arms.get(t.name, ArmStats()).spent}
        if not live:
            return None
        untried = sorted((t for t in live.values() if t.name not in state.arms),
                         key=lambda t: -shares[t.op])
        pool = [(c, r) for c, r in state.results if c.template.name in live and r > -1.0]
        if untried and (not pool or rng.random() < self.p_new):
            for t in untried:
                c = _fresh(t, [t.default()], tried, dims, rng)
                if c is not None:
                    return c
                state.arms.setdefault(t.name, ArmStats()).spent = True
        for _ in range(len(live) + 1):
            if not pool:
                break
            entrants = rng.sample(pool, min(self.tournament, len(pool)))
            parent, _r = max(entrants, key=lambda cr: (state.arms[cr[0].template.name].fresh(cr[1]) * shares[cr[0].op],
                                                       shares[cr[0].op]))
            t = parent.template
            c = _fresh(t, [mutate(t, parent.knobs, rng, n=rng.choice((1, 1, 2)))], tried, dims, rng)
            if c is not None:
                return c
            state.arms.setdefault(t.name, ArmStats()).spent = True
            pool = [(c2, r) for c2, r in pool if c2.template.name != t.name]
        for t in sorted(live.values(), key=lambda t: -shares[t.op]):
            if not state.arms.get(t.name, ArmStats()).spent:
                c = _fresh(t, [t.default()], tried, dims, rng)
                if c is not None:
                    return c
                state.arms.setdefault(t.name, ArmStats()).spent = True
        return None


STRATEGIES = {"bandit": BanditStrategy, "evolution": EvolutionStrategy}
