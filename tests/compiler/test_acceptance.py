"""Acceptance: fast tier beyond the measured noise, then slow tier A/B; composition re-measures the
accepted set and falls back to a greedy build when the whole set fails. The engine here is a
deterministic table (speedup per set of ops present in the source): the decision logic is under
test; the real engine is exercised by the loop tests."""

import dataclasses

import pytest

from persistent_engine.io_struct import PointTiming, WorkloadPoint
from persistent_engine.supervisor import CandidateVerdict

from compiler.search.acceptance import AcceptanceConfig, Acceptor, merge_points, screen, threshold
from compiler.plan.compose import parse_targets

POINTS = [WorkloadPoint(phase="decode", batch=4, context=64, chunk=1, weight=0.75),
          WorkloadPoint(phase="prefill", batch=1, context=0, chunk=32, weight=0.25)]


def cand(op: str, tag: str = "") -> str:
    return f'import torch\n\n\ndef f(x):\n    return x\n\n\nOVERRIDES = {{"{op}": f}}\nDESCRIPTION = "{op}{tag}"\n'


def verdict(speedup, correct=True):
    per_point = [] if speedup is None else [
        PointTiming(p, p.label(), True, 1.0, 1.0, speedup * (1.1 if i == 0 else 0.9))
        for i, p in enumerate(POINTS)]
    return CandidateVerdict(correct=correct, reasons=[] if correct else ["op rms_norm: mismatch"],
                            speedup=speedup, per_point=per_point)


class TableEngine:
    """speedup of a source = product of its ops' factors per tier; ``broken`` sets make it incorrect."""

    def __init__(self, fast, slow, broken=()):
        self.fast, self.slow, self.broken, self.calls = fast, slow, [set(b) for b in broken], []

    def __call__(self, tier, source):
        ops = set()
        for line in source.splitlines():
            for op in ("rms_norm", "silu_and_mul", "linear", "embedding"):
                if f"'{op}'" in line or f'"{op}"' in line:
                    ops.add(op)
        self.calls.append((tier, tuple(sorted(ops))))
        if any(b <= ops for b in self.broken):
            return verdict(None, correct=False)
        s = 1.0
        for op in ops:
            s *= (self.fast if tier == "fast" else self.slow).get(op, 1.0)
        return verdict(s)


def test_threshold_uses_noise_and_floor():
    cfg = AcceptanceConfig(noise_floor=0.01, noise_k=2.0)
    assert threshold(0.002, cfg) == 1.01
    assert abs(threshold(0.03, cfg) - 1.06) < 1e-12


def test_screen_reasons():
    cfg = AcceptanceConfig()
    assert not screen(verdict(1.02), 0.05, cfg, "fast").accepted
    assert "within the noise" in screen(verdict(1.02), 0.05, cfg, "fast").reason
    assert screen(verdict(1.2), 0.05, cfg, "fast").accepted
    assert "mismatch" in screen(verdict(None, correct=False), 0.0, cfg, "fast").reason
    assert "not timed" in screen(CandidateVerdict(True, [], None), 0.0, cfg, "slow").reason


def test_only_candidates_beating_noise_reach_the_slow_tier_and_must_hold_there():
    engine = TableEngine(fast={"rms_norm": 1.3, "silu_and_mul": 1.03, "linear": 1.25},
                         slow={"rms_norm": 1.2, "linear": 1.01})
    acc = Acceptor(engine, POINTS, {"fast": 0.05, "slow": 0.02})
    for op in ("rms_norm", "silu_and_mul", "linear"):
        src = cand(op)
        acc.consider(src, engine("fast", src), author="a")
    assert [a.targets for a in acc.accepted] == [("rms_norm",)]
    slow_calls = [c for c in engine.calls if c[0] == "slow"]
    assert slow_calls == [("slow", ("rms_norm",)), ("slow", ("linear",))]      # silu never went slow
    a = acc.accepted[0]
    assert (round(a.fast, 3), round(a.slow, 3)) == (1.3, 1.2)
    assert a.per_point[0].fast == 1.3 * 1.1 and a.per_point[1].slow == 1.2 * 0.9
    assert "within the noise" in acc.log[-1]["reason"]


def test_composition_of_compatible_set_is_remeasured():
    engine = TableEngine(fast={"rms_norm": 1.3, "linear": 1.2}, slow={"rms_norm": 1.2, "linear": 1.1})
    acc = Acceptor(engine, POINTS, {"fast": 0.01, "slow": 0.01})
    for op in ("rms_norm", "linear"):
        acc.consider(cand(op), engine("fast", cand(op)), author="a")
    comp = acc.compose()
    assert {t for p in comp.parts for t in p.targets} == {"rms_norm", "linear"}
    assert abs(comp.slow - 1.32) < 1e-9 and abs(comp.fast - 1.56) < 1e-9
    assert set(parse_targets(comp.source)[0]) == {"rms_norm", "linear"}


def test_composition_falls_back_to_greedy_when_the_set_breaks():
    engine = TableEngine(fast={"rms_norm": 1.3, "linear": 1.2, "embedding": 1.1},
                         slow={"rms_norm": 1.2, "linear": 1.1, "embedding": 1.05},
                         broken=[{"rms_norm", "linear"}])
    acc = Acceptor(engine, POINTS, {"fast": 0.01, "slow": 0.01})
    for op in ("rms_norm", "linear", "embedding"):
        acc.consider(cand(op), engine("fast", cand(op)), author="a")
    comp = acc.compose()
    assert [p.targets for p in comp.parts] == [("rms_norm",), ("embedding",)]
    assert dict(comp.dropped)[acc.accepted[1].name] == "incorrect when composed"
    assert abs(comp.slow - 1.2 * 1.05) < 1e-9


class ShadowingEngine(TableEngine):
    """Like the real engine's "kernel actually ran" guard: with a ``linear`` override present, an
    ``rms_norm`` override has no call site left and the set is rejected, naming it."""

    def __call__(self, tier, source):
        v = super().__call__(tier, source)
        if self.calls[-1][1] == ("linear", "rms_norm"):
            return CandidateVerdict(correct=False, reasons=[
                "layer-level: override rms_norm never called: its implementation did not run"], speedup=None)
        return v


def test_composition_drops_overrides_a_composite_leaves_without_call_sites():
    engine = ShadowingEngine(fast={"rms_norm": 1.3, "linear": 1.4}, slow={"rms_norm": 1.2, "linear": 1.3})
    acc = Acceptor(engine, POINTS, {"fast": 0.01, "slow": 0.01})
    for op in ("rms_norm", "linear"):
        acc.consider(cand(op), engine("fast", cand(op)), author="a")
    assert engine.calls[-1] == ("fast", ("linear", "rms_norm"))   # the running set, measured at acceptance
    n_before = len(engine.calls)
    comp = acc.compose()
    assert [p.targets for p in comp.parts] == [("linear",)]
    assert "shadowed by a composite override" in dict(comp.dropped)[acc.accepted[0].name]
    assert len(engine.calls) - n_before == 2        # the whole set not again; linear on both tiers


def test_conflicting_candidates_keep_the_faster_one():
    engine = TableEngine(fast={"rms_norm": 1.3}, slow={"rms_norm": 1.2})
    acc = Acceptor(engine, POINTS, {"fast": 0.01, "slow": 0.01})
    for tag in ("-a", "-b"):
        acc.consider(cand("rms_norm", tag), engine("fast", cand("rms_norm", tag)), author="x")
    comp = acc.compose()
    assert len(comp.parts) == 1 and len(comp.dropped) == 1
    assert Acceptor(engine, POINTS, {}).compose() is None


def test_merge_points_fills_missing_with_none():
    rows = merge_points(POINTS, verdict(1.2), CandidateVerdict(True, [], 1.1, per_point=[]))
    assert rows[0].fast == 1.2 * 1.1 and rows[0].slow is None and rows[1].point.weight == 0.25
    assert rows[0].to_dict() == {**POINTS[0].to_dict(), "fast": 1.2 * 1.1, "slow": None}      # the plan.json row


def test_workload_points_never_exceed_the_model_context_window():
    from compiler.search.inputs import fit_positions
    pts = [WorkloadPoint(phase="prefill", batch=1, context=29, chunk=4220, weight=0.5),
           WorkloadPoint(phase="decode", batch=8, context=9000, chunk=1, weight=0.5),
           WorkloadPoint(phase="decode", batch=2, context=100, chunk=1, weight=0.0)]
    fitted = fit_positions(pts, 4096)
    assert all(p.context + p.chunk <= 4096 for p in fitted)
    assert fitted[0] == dataclasses.replace(pts[0], context=0, chunk=4096)
    assert fitted[1].context == 4095 and fitted[2] == pts[2]
    twice = fit_positions([pts[0], dataclasses.replace(pts[0], context=5, weight=0.25)], 4096)
    assert twice == [dataclasses.replace(pts[0], context=0, chunk=4096, weight=0.75)]


class TagEngine:
    """speedup of a source = product of the factors of the candidate tags in it (all on one op);
    a tag in ``broken_composed`` makes any composed plan holding it incorrect, alone or not."""

    def __init__(self, slow, broken_composed=()):
        self.slow, self.broken, self.calls = slow, set(broken_composed), []

    def __call__(self, tier, source):
        tags = {t for t in self.slow if f"rms_norm{t}" in source}
        self.calls.append((tier, tuple(sorted(tags))))
        if "tkcc composed plan" in source and tags & self.broken:
            return verdict(None, correct=False)
        s = 1.0
        for t in tags:
            s *= self.slow[t]
        return verdict(s)


def accept_tagged(engine, tags):
    acc = Acceptor(engine, POINTS, {"fast": 0.01, "slow": 0.01})
    for tag in tags:
        acc.consider(cand("rms_norm", tag), engine("fast", cand("rms_norm", tag)), author="x")
    return acc, {a.description: a.name for a in acc.accepted}


def test_conflict_group_falls_back_to_its_runner_up_when_the_winner_fails_composition():
    engine = TagEngine(slow={"-a": 1.47, "-b": 1.3, "-c": 1.2}, broken_composed={"-a"})
    acc, name = accept_tagged(engine, ("-c", "-a", "-b"))
    comp = acc.compose()
    assert [p.name for p in comp.parts] == [name["rms_norm-b"]]
    assert abs(comp.slow - 1.3) < 1e-9 and abs(comp.fast - 1.3) < 1e-9
    why = dict(comp.dropped)
    assert set(why) == {name["rms_norm-a"], name["rms_norm-c"]}          # b is kept, so not listed
    assert why[name["rms_norm-a"]] == "incorrect when composed"
    assert why[name["rms_norm-c"]] == "overrides an op or knob of a faster accepted candidate"
    assert engine.calls.count(("fast", ("-a",))) == 2     # its own fast verdict; composed, measured once


def test_conflict_group_runners_up_are_tried_in_order_until_one_holds():
    engine = TagEngine(slow={"-a": 1.47, "-b": 1.3, "-c": 1.2}, broken_composed={"-a", "-b"})
    acc, name = accept_tagged(engine, ("-c", "-b", "-a"))      # each faster than those before: all confirmed
    comp = acc.compose()
    assert [p.name for p in comp.parts] == [name["rms_norm-c"]]
    assert dict(comp.dropped) == {name["rms_norm-a"]: "incorrect when composed",
                                  name["rms_norm-b"]: "incorrect when composed"}


def test_runners_up_are_not_tried_past_the_composition_deadline():
    engine = TagEngine(slow={"-a": 1.47, "-b": 1.3}, broken_composed={"-a"})
    acc, name = accept_tagged(engine, ("-a", "-b"))
    comp = acc.compose(deadline=0.0)                 # long past: only the winner's own attempt runs
    assert comp.parts == ()
    assert dict(comp.dropped)[name["rms_norm-b"]] == "no time left to re-verify it in the composition"


def test_a_kept_winner_leaves_its_group_dropped_as_conflicting():
    engine = TagEngine(slow={"-a": 1.47, "-b": 1.3})
    acc, name = accept_tagged(engine, ("-b", "-a"))
    comp = acc.compose()
    assert [p.name for p in comp.parts] == [name["rms_norm-a"]]
    assert dict(comp.dropped) == {name["rms_norm-b"]: "overrides an op or knob of a faster accepted candidate"}


def test_the_composition_keeps_up_with_the_search_and_its_set_is_kept_when_time_runs_out():
    """Issue 41: each acceptance measures the running set with it at once, so the budget running out in the
    final composition keeps both accepted candidates, measured, not the best one alone."""
    from compiler.fleet.local import failed_verdict

    engine = TableEngine({"rms_norm": 1.2, "silu_and_mul": 1.1}, {"rms_norm": 1.25, "silu_and_mul": 1.15})
    acc = Acceptor(engine, POINTS, {"fast": 0.01, "slow": 0.01})
    for op in ("silu_and_mul", "rms_norm"):
        acc.consider(cand(op), engine("fast", cand(op)), author="a")
    assert {t for a in acc.running.parts for t in a.targets} == {"rms_norm", "silu_and_mul"}
    assert acc.running.slow == pytest.approx(1.25 * 1.15)
    acc.evaluate = lambda tier, src: failed_verdict("not evaluated: the run's budget is spent")   # noqa: E731
    comp = acc.compose()
    assert len(comp.parts) == 2 and comp.slow == pytest.approx(1.25 * 1.15) and not comp.dropped


def test_a_budget_that_runs_out_in_composition_keeps_the_best_candidate_alone():
    """No set measured during the search either (its measurement refused): the best accepted one alone."""
    from compiler.fleet.local import failed_verdict

    engine = TableEngine({"rms_norm": 1.2, "silu_and_mul": 1.1}, {"rms_norm": 1.25, "silu_and_mul": 1.15})
    acc = Acceptor(engine, POINTS, {"fast": 0.01, "slow": 0.01})
    refused = lambda tier, src: failed_verdict("not evaluated: the run's budget is spent")   # noqa: E731
    acc.consider(cand("silu_and_mul"), engine("fast", cand("silu_and_mul")), author="a")
    acc.evaluate = lambda tier, src: refused(tier, src) if "tkcc composed plan" in src else engine(tier, src)
    acc.consider(cand("rms_norm"), engine("fast", cand("rms_norm")), author="a")
    assert len(acc.accepted) == 2 and [a.targets for a in acc.running.parts] == [("rms_norm",)]
    acc.evaluate = refused
    comp = acc.compose()
    assert [a.targets for a in comp.parts] == [("rms_norm",)]        # the best slow-tier speedup, alone
    assert comp.fast == acc.accepted[1].fast and comp.slow == acc.accepted[1].slow
    assert parse_targets(comp.source)[0] == ("rms_norm",)
    assert dict(comp.dropped)[acc.accepted[0].name].startswith("not measured when composed")


def test_a_third_variant_no_faster_on_the_fast_tier_is_not_confirmed_on_the_slow_tier():
    """A winner and one runner-up per op set are confirmed; a third variant of the same ops that is not
    faster on the fast tier than both is not (its slow-tier time would go unused by the composition);
    one faster than them, or one for other ops, still is."""
    engine = TagEngine(slow={"-a": 1.3, "-b": 1.25, "-c": 1.2, "-d": 1.4})
    acc, _ = accept_tagged(engine, ("-a", "-b"))
    slow_calls = sum(1 for tier, _ in engine.calls if tier == "slow")
    third = acc.consider(cand("rms_norm", "-c"), verdict(1.2), author="x")
    assert not third.accepted and third.stage == "fast" and "not confirmed on the slow tier" in third.reason
    assert sum(1 for tier, _ in engine.calls if tier == "slow") == slow_calls     # no slow-tier evaluation
    assert acc.outrun_by(cand("rms_norm", "-d"), verdict(1.4)) == ()
    assert acc.consider(cand("rms_norm", "-d"), engine("fast", cand("rms_norm", "-d")), author="x").accepted
    assert acc.outrun_by(cand("linear"), verdict(1.0)) == ()                      # other ops: not outrun
    assert len(acc.accepted) == 3


class CompiledAroundEngine(TableEngine):
    """Against the compiled baseline an override can pay alone and cost once another is compiled around it
    (inductor fused the two regions' neighbours only while both were its own): the pair is slower than the
    baseline on the slow tier, though each is faster alone."""

    def __call__(self, tier, source):
        v = super().__call__(tier, source)
        if self.calls[-1][1] == ("linear", "rms_norm") and tier == "slow":
            return verdict(0.97)
        return v


def test_a_plan_is_never_slower_than_its_baseline_on_the_tiers_it_was_measured_on():
    """Issue 39: the composition keeps the baseline for any override that does not pay once composed."""
    engine = CompiledAroundEngine(fast={"rms_norm": 1.3, "linear": 1.2}, slow={"rms_norm": 1.2, "linear": 1.1})
    acc = Acceptor(engine, POINTS, {"fast": 0.01, "slow": 0.01})
    for op in ("rms_norm", "linear"):
        acc.consider(cand(op), engine("fast", cand(op)), author="a")
    comp = acc.compose()
    assert [p.targets for p in comp.parts] == [("rms_norm",)]
    assert dict(comp.dropped)[acc.accepted[1].name] == "no gain when composed"
    assert comp.fast > 1.0 and comp.slow > 1.0 and abs(comp.slow - 1.2) < 1e-9
