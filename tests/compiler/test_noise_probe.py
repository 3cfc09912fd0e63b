"""The A/A noise probe of `tkcc optimize` must be a correct candidate on every architecture: a probe the
engine rejects (e.g. one overriding an op the model never calls) leaves the noise unmeasured, and the
run then falls back to a 5% acceptance threshold (what happened on the H200 with qwen3-moe, whose
layers never call silu_and_mul). Real engines in process."""

import json
import pathlib

import pytest

from compiler.search.baseline import _identity_candidate, measure_noise
from persistent_engine.judge import engine as eng
from persistent_engine import io_struct as io
from persistent_engine.io_struct import WorkloadPoint

QWEN3 = pathlib.Path(eng.__file__).parents[1] / "models" / "configs" / "qwen3-moe.json"
POINTS = [WorkloadPoint(phase="decode", batch=3, context=8, chunk=1, weight=0.6),
          WorkloadPoint(phase="prefill", batch=1, context=0, chunk=8, weight=0.4)]


def _qwen3_small(tmp_path) -> str:
    cfg = json.loads(QWEN3.read_text())
    cfg.update(hidden_size=64, head_dim=16, num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
               moe_intermediate_size=32, num_experts=16, num_experts_per_tok=4, num_hidden_layers=2,
               vocab_size=256, max_position_embeddings=4096)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    return str(path)


@pytest.mark.parametrize("model", ["tiny-dense", "tiny-moe", "tiny-mla", "qwen3-small"])
def test_the_probe_is_correct_and_times_every_point(model, tmp_path):
    name = _qwen3_small(tmp_path) if model == "qwen3-small" else model
    e = eng.Engine(eng.EngineConfig(model=name, variants=1, points=POINTS))
    assert e.handle(io.LoadCandidate(source=_identity_candidate())).ok
    try:
        ver = e.handle(io.Verify(seed=3))
        assert ver.ok, ver.reasons
        bench = e.handle(io.Bench(samples=3))
        assert bench.ok, bench.reasons
    finally:
        e.handle(io.Unload())
    assert all(p.affected for p in bench.per_point)
    assert 0.3 < bench.speedup < 3.0


def test_measure_noise_uses_the_probe_and_falls_back_only_when_it_is_rejected():
    calls = []

    def evaluate(tier, source):
        calls.append((tier, source))
        return type("V", (), {"correct": True, "speedup": 1.02})()

    assert measure_noise(evaluate, 3) == {"fast": 0.02, "slow": 0.02}
    assert len(calls) == 6 and all("linear" in s for _, s in calls)
    rejected = lambda tier, source: type("V", (), {"correct": False, "speedup": None})()   # noqa: E731
    events = []
    assert measure_noise(rejected, 2, events.append) == {"fast": 0.05, "slow": 0.05}
    assert any("A/A probe was rejected on the fast tier" in e for e in events)
    assert any("slow-tier noise unmeasured; assuming 5%" in e for e in events)


def test_rounds_alternate_the_tiers_so_the_deadline_leaves_both_with_as_many_runs(monkeypatch):
    import compiler.search.baseline as baseline

    clock = [0.0]
    monkeypatch.setattr(baseline.time, "monotonic", lambda: clock[0])
    calls = []

    def evaluate(tier, source):
        calls.append(tier)
        clock[0] += 10.0                        # each evaluation: 10 s
        return type("V", (), {"correct": True, "speedup": 1.01 if tier == "fast" else 1.03})()

    assert measure_noise(evaluate, 3, deadline=25.0) == {"fast": 0.01, "slow": 0.03}
    assert calls == ["fast", "slow", "fast", "slow"]     # round 2 started at 20 s < 25 s; round 3 not at 40 s
    calls.clear()
    clock[0] = 100.0
    assert measure_noise(evaluate, 3, deadline=0.0) == {"fast": 0.01, "slow": 0.03}
    assert calls == ["fast", "slow"]                     # past the deadline: one round of both


def test_the_baseline_gets_a_quarter_of_what_is_left_before_the_search_ends():
    from compiler.search.budget import Budget

    b = Budget(360.0, start=0.0)
    assert b.search_end == 360.0 - 30.0 - 90.0            # writing's 15% capped at 30 s, composing's 25%
    assert b.baseline_end(now=78.0) == 78.0 + 0.25 * (240.0 - 78.0)


def test_a_noisy_tier_is_timed_with_longer_samples_and_its_noise_measured_again():
    import threading
    import types

    from compiler.search import loop

    lengthened, calls, events = [], [], []

    class Fleet:
        def lengthen_samples(self, tier, factor):
            lengthened.append((tier, factor))
            return 21 * factor

    def timed(tier, source):
        calls.append(tier)
        return type("V", (), {"correct": True, "speedup": 1.021})()      # the longer samples' spread: 2.1%

    run = types.SimpleNamespace(stop=threading.Event(), cfg=types.SimpleNamespace(aa_runs=3),
                                budget=types.SimpleNamespace(baseline_end=lambda: float("inf")),
                                progress=types.SimpleNamespace(event=events.append))
    got = loop._longer_samples(run, Fleet(), {"fast": 0.013, "slow": 0.063}, timed)
    assert got == {"slow": 0.021} and lengthened == [("slow", loop.NOISY_SAMPLES)] and calls == ["slow"] * 3
    assert "slow 63 pairs, noise ±2.1% (was ±6.3%)" in events[-1]
    # quiet tiers, or a fleet that cannot lengthen its samples (Ray's): nothing changes, nothing is timed
    assert loop._longer_samples(run, Fleet(), {"fast": 0.01, "slow": 0.02}, timed) == {}
    assert loop._longer_samples(run, object(), {"fast": 0.01, "slow": 0.2}, timed) == {}
    # one A/A round (--aa-runs 1) is one draw of the noise: the samples stay as they are
    run.cfg.aa_runs = 1
    assert loop._longer_samples(run, Fleet(), {"fast": 0.013, "slow": 0.063}, timed) == {}
    assert calls == ["slow"] * 3 and len(lengthened) == 1


def test_the_local_fleet_lengthens_one_tiers_samples():
    import threading
    import types

    from compiler.fleet.local import FleetConfig, LocalFleet, Placement, TierEngine

    fleet = LocalFleet(FleetConfig(model="tiny-dense", points=(), fast_layers=(0,), slow_layers=(0, 1)))
    lock = threading.Lock()
    fleet.engines = [TierEngine(Placement(t, "cpu", (0,)), types.SimpleNamespace(samples=0), lock)
                     for t in ("fast", "slow")]
    assert fleet.lengthen_samples("slow", 3) == 63                 # 3 x the CPU's 21 pairs
    assert [e.supervisor.samples for e in fleet.engines] == [0, 63]
