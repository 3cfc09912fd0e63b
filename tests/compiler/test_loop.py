"""The optimize loop end to end on tiny-dense with real engines (CPU): one run shared by the tests of
this module, during which the fast-tier engine process is killed (the run must go on and finish);
then recompile on that plan (no drift: nothing written; drift: a new version beside the old)."""

import dataclasses
import os
import signal
import threading
import time
from pathlib import Path

import pytest

from compiler.plan import artifact as plan_mod
from compiler.search.loop import OptimizeConfig, optimize

ROOT = Path(__file__).resolve().parents[2]
CONV = str(ROOT / "examples" / "traffic" / "azure2023_conv.csv")
CODE = str(ROOT / "examples" / "traffic" / "azure2023_code.csv")
CANDIDATES = Path(__file__).with_name("candidates")

pytestmark = pytest.mark.slow


def engine_children() -> dict[int, str]:
    """pid -> command line of this process's engine children (read from /proc)."""
    out = {}
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            ppid = int((d / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode()
        except (OSError, IndexError, ValueError):
            continue
        if ppid == os.getpid() and "persistent_engine serve" in cmd:
            out[int(d.name)] = cmd
    return out


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    out = tmp_path_factory.mktemp("plans") / "tiny"
    killed: list[int] = []
    stop = threading.Event()

    def killer():
        # kill the fast-tier engine as soon as the first candidate is on the board: its evaluation,
        # or the next candidate's, then meets a dead engine, so a restart must happen (killing after
        # a verdict could land after the last fast-tier call, leaving nothing to restart)
        from bulletin_board import Board
        db, board = out / "board.db", None
        while not stop.is_set():
            time.sleep(0.05)
            try:
                board = board or (Board(f"sqlite:///{db}") if db.exists() else None)
                submitted = board is not None and board.list_candidates(1).total >= 1
            except Exception:  # noqa: BLE001 - board being created
                continue
            if submitted:
                fast = [pid for pid, cmd in engine_children().items() if "--layers 0, " in cmd + " "]
                if fast:
                    os.kill(fast[0], signal.SIGKILL)
                    killed.append(fast[0])
                    return

    t = threading.Thread(target=killer, daemon=True)
    t.start()
    cfg = OptimizeConfig(model="tiny-dense", hw="h200", traffic=CONV, out=str(out), budget_s=60,
                         agents=f"files:{CANDIDATES}", max_points=1, aa_runs=1, quiet=True, vs_torch_compile=True)
    try:
        result = optimize(cfg)
    finally:
        stop.set()
    return result, out, killed


def test_run_writes_a_complete_plan(run):
    result, out, _ = run
    plan, vdir = plan_mod.load(out)
    assert vdir == result.plan_dir == out / "v1" and plan.version == 1 and not result.interrupted
    assert plan.model == "tiny-dense" and plan.hw == "h200"
    assert plan.detected_device["kind"] == "cpu" and plan.detected_device["matches_hw"] is False
    assert plan.run["tried"] >= 2 and len(plan.workload_points) == 1
    assert plan.tiers == {"fast": {"layers": [0], "inputs": {}},          # dense: no routing to rebuild
                          "slow": {"layers": [0, 1], "inputs": {"tokens": "zipf", "routing": {"kind": "uniform"},
                                                                "prefix_share": 0.0}}}
    noise = plan.baseline["noise"]
    kernels = [o for o in plan.optimizations if not o.projected]     # settings: accepted by the traffic replay
    for o in kernels:                               # accepted only beyond the measured noise
        assert o.speedup["fast"] > 1 + max(0.01, noise["fast"])
        assert o.speedup["slow"] > 1 + max(0.01, noise["slow"])
    for o in plan.optimizations:
        assert (vdir / o.kernel).is_file()
    if kernels:
        assert plan.plan_speedup["fast"] > 1 and plan.plan_speedup["slow"] > 1
        tc = plan.baseline["torch_compile"]             # --vs-torch-compile: the slow-tier slice, per point
        assert tc["layers"] == [0, 1] and tc["weight_covered"] == 1.0 and tc["plan_timing"] == "eager"
        assert plan.plan_speedup["vs_torch_compile"] == tc["plan_vs_torch_compile"] > 0
        assert "against `torch.compile` of the same slice: **" in (vdir / "report.md").read_text()
    assert (vdir / "report.md").read_text().startswith("# tkcc plan v1")
    assert (vdir / "kernels" / "composed.py").is_file() and (vdir / "traffic_profile.json").is_file()
    assert plan.baseline["op_ms"], "the baseline profile is recorded"
    assert plan.parallelism and plan.parallelism["best"]


def test_killed_engine_is_restarted_and_the_run_finishes(run):
    result, out, killed = run
    assert killed, "the test killed no engine (no verdict was seen)"
    assert result.plan.run["restarts"] >= 1
    logged = (out / "logs" / "run-1.log").read_text()          # the run's log says so, with the engines' stages
    assert "[supervisor] engine died during" in logged or "[supervisor] restarting the engine" in logged, logged
    assert "[engine] ready on" in logged


def test_board_holds_the_run(run):
    from bulletin_board import Board
    _, out, _ = run
    # closed at the end: a connection left open would checkpoint the WAL whenever it is collected,
    # touching board.db in the middle of a later test
    with Board(f"sqlite:///{out / 'board.db'}") as board:
        r = board.list_runs().items[0]
        assert r.status == "done" and r.message.startswith("plan ")
        assert r.candidates_tried >= 2
        assert board.list_evaluations(r.id).total >= 2


def test_recompile_without_drift_writes_nothing(run):
    from compiler.search.recompile import recompile
    _, out, _ = run
    before = sorted((p, p.stat().st_mtime_ns) for p in out.rglob("*"))
    res = recompile(out, CONV, budget_s=5, quiet=True)
    assert res.drift is False and res.result is None
    assert sorted((p, p.stat().st_mtime_ns) for p in out.rglob("*")) == before


def test_recompile_on_drift_writes_a_new_version_seeded_with_the_plan(run):
    from bulletin_board import Board
    from compiler.search.recompile import recompile
    result, out, _ = run
    res = recompile(out, CODE, budget_s=5, quiet=True, aa_runs=1, max_points=1, agents=f"files:{CANDIDATES}")
    assert res.drift is True and any(f["drifted"] for f in res.features)
    assert res.result.plan_dir == out / "v2"
    new, _ = plan_mod.load(out)
    assert new.version == 2 and new.parent_version == 1 and new.run["origin"] == "drift"
    assert "Recompiled from v1 because traffic drifted." in (out / "v2" / "report.md").read_text()
    assert new.traffic["hash"] != result.plan.traffic["hash"]
    assert plan_mod.versions(out) == [1, 2]
    board = Board(f"sqlite:///{out / 'board.db'}")
    assert board.list_drift_events().total >= 1
    seeds = {o.name for o in result.plan.optimizations}
    authors = {c.author for c in board.list_candidates(board.list_runs().items[0].id).items} if seeds else set()
    # each seed is judged again, or (same shape class) its verdict is remembered and not judged twice
    assert sum(f"seed:{n}" in authors for n in seeds) + new.run["remembered"] >= len(seeds)
    for o in new.optimizations:           # lineage in the parent field; a seed's name and file unchanged
        assert o.parent in seeds | {""} and (not o.parent or o.name == o.parent)
        assert o.kernel == plan_mod.kernel_path((out / "v2" / o.kernel).read_text(), o.targets)


def test_cli_recompile_no_drift_json(run):
    import json
    import subprocess
    import sys
    _, out, _ = run
    versions = plan_mod.versions(out)
    r = subprocess.run([sys.executable, "-m", "compiler", "recompile", "--plan", str(out / "v1"), "--traffic", CONV,
                        "--json"], capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["drift"] is False and doc["written"] is None
    assert {f["name"] for f in doc["features"]} and not any(f["drifted"] for f in doc["features"])
    assert plan_mod.versions(out) == versions


def test_a_second_run_into_the_same_root_continues_from_the_newest_version(run):
    """`tkcc optimize` into a root that already holds versions for the same model and hardware re-verifies
    the newest version's optimizations first and records it as the parent; --fresh starts over."""
    from bulletin_board import Board
    _, out, _ = run
    newest = plan_mod.versions(out)[-1]
    prev, _ = plan_mod.load(out)
    cfg = OptimizeConfig(model="tiny-dense", hw="h200", traffic=CONV, out=str(out), budget_s=5,
                         agents=f"files:{CANDIDATES}", max_points=1, aa_runs=1, quiet=True)
    res = optimize(cfg)
    assert res.plan.version == newest + 1 and res.plan.parent_version == newest
    assert res.plan.run["origin"] == "continued"
    report = (res.plan_dir / "report.md").read_text()
    assert f"Continues v{newest}:" in report and "drifted" not in report
    board = Board(f"sqlite:///{out / 'board.db'}")
    run_id = max(board.list_runs().items, key=lambda r: r.created_at).id
    authors = {c.author for c in board.list_candidates(run_id).items}
    judged_again = {f"seed:{o.name}" for o in prev.optimizations} & authors
    # a seed first judged on this workload's shape class is remembered, not judged twice; the others again
    assert len(judged_again) + res.plan.run["remembered"] >= len(prev.optimizations)
    board.close()
    from compiler.search.loop import continued
    fresh = dataclasses.replace(cfg, continue_plan=False)
    assert continued(cfg, out).parent_version == res.plan.version and continued(fresh, out) == fresh
    assert continued(dataclasses.replace(cfg, model="tiny-moe"), out).seeds == ()
