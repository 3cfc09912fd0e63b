"""The Fleet contract (``compiler.fleet.local.Fleet``), run against every implementation: ``LocalFleet`` (local
engine processes) and ``RayFleet`` (engines as actors on a local Ray cluster on 127.0.0.1; skipped where
Ray is not installed). One fleet per implementation on tiny-dense, CPU."""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

import pytest

from compiler.fleet.local import Fleet, FleetConfig, LocalFleet
from persistent_engine.io_struct import WorkloadPoint

CANDIDATES = Path(__file__).with_name("candidates")
POINT = WorkloadPoint(phase="decode", batch=2, context=64, chunk=1, weight=1.0)
CFG = FleetConfig(model="tiny-dense", points=(POINT,), fast_layers=(0,), slow_layers=(0, 1), timeout_s=240.0)

pytestmark = pytest.mark.slow


def _ray_fleet(cfg: FleetConfig) -> Fleet:
    pytest.importorskip("ray")
    from compiler.fleet.ray_fleet import RayFleet
    return RayFleet(cfg)        # starts (and at close shuts down) its own local cluster on 127.0.0.1


@pytest.fixture(scope="module", params=["local", "ray"])
def fleet(request):
    make = LocalFleet if request.param == "local" else _ray_fleet
    f = make(CFG)
    with f:
        yield f
    f.close()                   # a second close is harmless


def test_it_is_a_fleet_of_both_tiers(fleet):
    assert isinstance(fleet, Fleet) and fleet.kind in ("local", "ray") and fleet.cfg == CFG
    described = fleet.describe()
    assert sorted(d["tier"] for d in described) == ["fast", "slow"]
    assert {tuple(d["layers"]) for d in described} == {CFG.fast_layers, CFG.slow_layers}
    assert all(d["device"].startswith("cpu") for d in described)
    pids = fleet.engine_pids()
    assert len(pids) == len(described) and all(isinstance(p, int) for p in pids)
    assert os.getpid() not in pids and len(set(pids)) == len(pids)
    assert fleet.restarts() == 0


def test_evaluate_judges_a_correct_and_a_broken_candidate_without_raising(fleet):
    good = fleet.evaluate("fast", (CANDIDATES / "fused_add_rms_norm_fp32.py").read_text())
    assert good.correct and good.speedup is not None and not good.reasons
    bad = fleet.evaluate("fast", "import os\nOVERRIDES = {'rms_norm': lambda x, weight, eps: x}\n")
    assert not bad.correct and any("forbidden import" in r for r in bad.reasons)


def test_profile_is_the_baselines_per_op_time(fleet):
    rows = fleet.profile("fast")["per_point"]
    assert [r["point"]["batch"] for r in rows] == [POINT.batch]
    assert rows[0]["ops"] and all(o["ms"] > 0 for o in rows[0]["ops"].values())


def test_no_evaluation_starts_past_the_deadline(fleet):
    assert fleet.deadline == math.inf
    fleet.deadline = time.monotonic() - 1.0
    try:
        v = fleet.evaluate("slow", (CANDIDATES / "fused_add_rms_norm_fp32.py").read_text())
    finally:
        fleet.deadline = math.inf
    assert not v.correct and v.reasons == ["not evaluated: the run's budget is spent"]
