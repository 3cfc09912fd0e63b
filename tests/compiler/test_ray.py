"""``--fleet ray``: a local Ray cluster on loopback, engines as Ray actors, a short optimize on
tiny-dense; killing an engine process under an actor does not stop the run."""

import os
import signal
from pathlib import Path

import pytest

ray = pytest.importorskip("ray")

from compiler.plan import artifact as plan_mod  # noqa: E402
from compiler.fleet.local import FleetConfig  # noqa: E402
from compiler.search.loop import OptimizeConfig, optimize  # noqa: E402
from compiler.fleet.ray_fleet import RayFleet  # noqa: E402
from persistent_engine.io_struct import WorkloadPoint

ROOT = Path(__file__).resolve().parents[2]
CONV = str(ROOT / "examples" / "traffic" / "azure2023_conv.csv")
CANDIDATES = Path(__file__).with_name("candidates")
POINT = WorkloadPoint(phase="decode", batch=2, context=64, chunk=1, weight=1.0)

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def cluster():
    ray.init(num_cpus=2, include_dashboard=False, _node_ip_address="127.0.0.1", log_to_driver=False)
    yield
    ray.shutdown()


def test_engines_are_actors_and_survive_a_killed_engine(cluster):
    cfg = FleetConfig(model="tiny-dense", points=(POINT,), fast_layers=(0,), slow_layers=(0, 1))
    with RayFleet(cfg) as fleet:
        assert [d["tier"] for d in fleet.describe()] == ["fast", "slow"]
        pids = fleet.engine_pids()
        assert all(pids) and len(set(pids)) == 2 and os.getpid() not in pids
        os.kill(pids[0], signal.SIGKILL)                   # the fast engine under its actor
        source = (CANDIDATES / "fused_add_rms_norm_fp32.py").read_text()
        verdict = fleet.evaluate("fast", source)
        assert verdict.correct and verdict.restarted, verdict.reasons
        assert fleet.restarts() >= 1 and fleet.engine_pids()[0] != pids[0]


def test_optimize_with_engines_and_agents_as_actors(cluster, tmp_path):
    cfg = OptimizeConfig(model="tiny-dense", hw="h200", traffic=CONV, out=str(tmp_path / "p"), budget_s=45,
                         agents=f"files:{CANDIDATES}", fleet="ray", max_points=1, aa_runs=1, quiet=True)
    res = optimize(cfg)
    plan, _ = plan_mod.load(tmp_path / "p")
    assert plan.run["fleet"] == "ray" and plan.run["tried"] >= 3 and not res.interrupted
    from bulletin_board import Board
    board = Board(f"sqlite:///{tmp_path / 'p' / 'board.db'}")
    run_id = board.list_runs().items[0].id
    everything = board.list_ideas(run_id, limit=1000).items
    ideas = [i for i in everything if i.target != "config"]    # posted from inside the agent actor
    stems = {f"submit {p.stem}" for p in CANDIDATES.glob("*.py")}
    assert {i.author for i in ideas} == {"files-0"} and {i.title for i in ideas} <= stems   # one per file it reached
    assert {i.author for i in everything if i.target == "config"} <= {"config-search"}   # every run's config search
