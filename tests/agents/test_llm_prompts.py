"""Prompts and the profile digest: built from the run's profile, points, ops and board."""

import time

import pytest

from agents import AgentContext, OpInfo
from agents.prompts import SYSTEM, cycle_prompt, op_costs, to_json
from llm_support import make_board
from persistent_engine.io_struct import WorkloadPoint

ENGINE_PROFILE = {"timer": "perf_counter_ns", "per_point": [
    {"point": {"phase": "decode", "batch": 8, "weight": 0.75},
     "ops": {"linear": {"ms": 2.0, "calls": 7, "share": 0.8}, "rms_norm": {"ms": 0.4}}},
    {"point": {"phase": "prefill", "batch": 1, "weight": 0.25},
     "ops": {"linear": {"ms": 8.0}, "attention_prefill": {"ms": 6.0}}}]}


def test_op_costs_weights_points_and_sorts():
    costs = op_costs(ENGINE_PROFILE)
    assert list(costs) == ["linear", "attention_prefill", "rms_norm"]
    assert costs["linear"] == 0.75 * 2.0 + 0.25 * 8.0 and costs["rms_norm"] == pytest.approx(0.3)
    assert op_costs({"a": 1.0, "b": {"ms": 3.0}, "c": "n/a"}) == {"b": 3.0, "a": 1.0}
    assert op_costs({}) == {}


def test_cycle_prompt_carries_profile_points_ops_board_and_held_idea(tmp_path):
    board = make_board(tmp_path)
    run = board.create_run(model="tiny-dense", hw="cpu")
    idea = board.post_idea(run, author="agent-2", title="split-K linear", target="linear",
                           body="split K by 4 for batch <= 8")
    points = [WorkloadPoint(phase="decode", batch=8, context=512, chunk=1, weight=0.75)]
    ops = {"linear": OpInfo("linear", "linear(x[..., K], weight[N, K], bias[N] | None)", "def linear"),
           "moe_route": OpInfo("moe_route", "moe_route(router_logits[T, E] fp32, ...)", "def moe_route")}
    ctx = AgentContext(board=board, run_id=run.id, evaluate=None, profile=ENGINE_PROFILE,
                       points=points, spec=None, ops=ops, deadline=time.monotonic() + 100)
    text = cycle_prompt(ctx, ideas=board.list_ideas(run).items)
    lines = text.splitlines()
    first_op = lines.index("Where the time goes (baseline, each op timed between two syncs, weighted over the "
                           "workload points):") + 1
    assert lines[first_op].split()[0] == "linear" and "66.0%" in lines[first_op]  # 3.5 of 5.3 ms
    replayed = cycle_prompt(AgentContext(board=board, run_id=run.id, evaluate=None, points=points, spec=None,
                                         profile={**ENGINE_PROFILE, "timer": "cuda graph replays, kernels per op"},
                                         ops=ops, deadline=time.monotonic() + 100))
    assert "(baseline, each op's kernels in a CUDA-graph replay of the step, the gaps before them included," in replayed
    assert "decode batch=8 context=512 chunk=1 weight=0.750" in text
    assert "linear(x[..., K], weight[N, K], bias[N] | None)" in text
    assert "moe_route" not in text and "  (1 more ops in the registry are not run by this model)" in text
    bare = cycle_prompt(AgentContext(board=board, run_id=run.id, evaluate=None, profile={}, points=points, spec=None,
                                     ops=ops, deadline=time.monotonic() + 100))
    assert "moe_route(router_logits" in bare                        # no profile: every signature
    assert f"#{idea.id} [open] linear: split-K linear (by agent-2)" in text
    assert "post_idea" in text.splitlines()[-1]
    held = cycle_prompt(ctx, ideas=[], held=idea)
    assert f"You hold idea #{idea.id} (target linear): split-K linear" in held
    assert "split K by 4" in held and "(none yet)" in held
    assert "OVERRIDES" in SYSTEM and "submit_candidate" in SYSTEM and "read_roofline" in SYSTEM
    board.post(run, author="offline-kernel-1", kind="result", idea=idea,
               body='{"kind": "template", "template": "linear.torch_small_m", "speedup": 1.21}' + " x" * 400)
    seen = cycle_prompt(ctx, posts=board.list_posts(run, sort="-id").items)
    line = next(ln for ln in seen.splitlines() if "offline-kernel-1" in ln)
    assert line.startswith(f"  offline-kernel-1 [result] on #{idea.id}: ") and "linear.torch_small_m" in line
    assert line.endswith("...") and len(line) < 320                     # each post cut to 240 characters
    board.close()


def test_tool_results_are_bounded():
    assert to_json({"a": 1}) == '{"a":1}'
    cut = to_json({"s": "x" * 50_000}, limit=1000)
    assert len(cut) < 1100 and "cut at 1000" in cut
