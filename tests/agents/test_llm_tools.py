"""The LLM agents' tools against a real board: the roofline per op and workload point (checked against
the cost model's own figures), hardware facts, templates as worked examples, any candidate's source and
verdict (accepted, correct, rejected, crashed) with its lineage, threads, and the bound on every result."""

import json
import time

import pytest

from agents import AgentContext, op_catalog
from agents.llm import RESULT_CHARS, ToolBox, ToolCall
from agents.llm.tools import SOURCE_CHARS
from llm_support import make_board
from persistent_engine.io_struct import WorkloadPoint

POINTS = [WorkloadPoint(phase="decode", batch=4, context=256, chunk=1, weight=0.7),
          WorkloadPoint(phase="prefill", batch=1, context=0, chunk=64, weight=0.3)]
PROFILE = {"per_point": [{"point": POINTS[0].to_dict(), "ops": {"linear": {"ms": 0.8}, "rms_norm": {"ms": 0.1}}},
                         {"point": POINTS[1].to_dict(), "ops": {"linear": {"ms": 3.0}}}]}


@pytest.fixture()
def box(tmp_path):
    from persistent_engine.models.spec import ModelSpec

    board = make_board(tmp_path)
    run = board.create_run(model="tiny-dense", hw="h200", traffic_hash="h")
    ctx = AgentContext(board=board, run_id=run.id, evaluate=None, profile=PROFILE, points=POINTS,
                       spec=ModelSpec.from_name("tiny-dense"), ops=op_catalog(), deadline=time.monotonic() + 60,
                       hw="h200")
    yield ToolBox(ctx, "claude-0", None)
    board.close()


def call(box, tool, **args):
    r = box.run(ToolCall("c1", tool, args))
    assert len(r.content) <= RESULT_CHARS + 60            # the bound (plus the note that says it was cut)
    return r if r.is_error else json.loads(r.content)


def test_roofline_groups_the_cost_model_rows_by_op_and_compares_with_the_measurement(box):
    from cost_model import Layout, get_hardware
    from cost_model.estimate import op_time
    from cost_model.ops_reference import reference_step_ops

    out = call(box, "read_roofline")
    assert out["hardware"] == "h200" and [p["point"]["phase"] for p in out["points"]] == ["decode", "prefill"]
    decode = {o["op"]: o for o in out["points"][0]["ops"]}
    lin = decode["linear"]
    assert sorted(lin["cost_model_rows"]) == ["mlp_down", "mlp_gate_up", "o_proj", "qkv_proj"]
    spec, hw = box.ctx.spec, get_hardware("h200")
    rows = [o for o in reference_step_ops(spec, Layout(), 4, 1, 256, [0], 1.0) if o.name in lin["cost_model_rows"]]
    assert lin["flops"] == pytest.approx(sum(o.flops * o.count for o in rows))
    assert lin["bytes"] == pytest.approx(sum(o.bytes * o.count for o in rows))
    roof = sum(op_time(o, hw) * o.count for o in rows) * 1e3
    assert lin["roofline_ms"] == pytest.approx(roof, rel=1e-4)
    assert lin["measured_ms"] == 0.8 and lin["achieved"] == pytest.approx(roof / 0.8, rel=1e-3)
    assert lin["bound"] == "memory"                      # a batch-4 GEMV streams its weights
    assert decode["rms_norm"]["measured_ms"] == 0.1 and decode["rms_norm"]["roofline_ms"] is None  # no row
    assert decode["attention_decode"]["measured_ms"] is None and decode["attention_decode"]["roofline_ms"] > 0
    assert list(decode)[:2] == ["linear", "rms_norm"]    # ordered by measured time
    only = call(box, "read_roofline", op="fused_add_rms_norm")
    assert [o["op"] for p in only["points"] for o in p["ops"]] == ["fused_add_rms_norm"] * 2


def test_hardware_and_templates(box):
    hw = call(box, "read_hardware")
    assert hw["name"] == "h200" and hw["hbm_gb_per_s"] > 4000 and hw["peak_tflops"]["bf16"] > 900
    index = call(box, "read_templates")
    assert index["device"] == "cuda" and any(t["name"] == "rms_norm.triton_rows" or t["op"] == "rms_norm"
                                             for t in index["templates"])
    name = next(t["name"] for t in index["templates"] if t["op"] == "rms_norm")
    one = call(box, "read_templates", name=name)
    assert "OVERRIDES" in one["source"] and one["op"] == "rms_norm" and set(one["knobs"]) == set(one["knob_space"])
    bad = call(box, "read_templates", name="no.such")
    assert bad.is_error and "unknown template" in bad.content


def _judged(board, run, author, source, verdict, *, parent=None, kind="llm", **metrics):
    cid = board.add_candidate(run, author=author, source=source, parent=parent, author_kind=kind)
    board.add_evaluation(cid, tier="fast", point=None, metrics={"speedup": metrics.pop("speedup", None), **metrics},
                         verdict=verdict, reasons=metrics.pop("reasons", []) if "reasons" in metrics else
                         (["rms_norm: max abs error 3.1 > 0.01"] if verdict == "rejected" else []))
    return cid


def test_candidates_with_verdicts_sources_lineage_and_bounds(box):
    board, run = box.ctx.board, box.ctx.run_id
    good = _judged(board, run, "offline-kernel-0", 'DESCRIPTION = "rows kernel"\nOVERRIDES = {}\n', "correct",
                   kind="program", speedup=1.3, accepted=True)
    bad = _judged(board, run, "claude-0", "OVERRIDES = {}  # wrong\n", "rejected", parent=good, speedup=None)
    crash = _judged(board, run, "gpt-0", "OVERRIDES = {}  # crash\n", "rejected", restarted=True)
    huge = _judged(board, run, "gpt-0", "x = 1\n" * 5000 + "OVERRIDES = {}\n", "correct", speedup=0.9)
    listed = {c["id"]: c for c in call(box, "read_candidates")["candidates"]}
    assert {listed[k]["verdict"] for k in (good, bad, crash, huge)} == {"accepted", "rejected", "crashed",
                                                                         "correct"}
    assert listed[good]["description"] == "rows kernel" and listed[bad]["parent"] == good
    assert [c["id"] for c in call(box, "read_candidates", verdict="accepted")["candidates"]] == [good]
    assert [c["id"] for c in call(box, "read_candidates", verdict="crashed")["candidates"]] == [crash]
    one = call(box, "read_candidate", id=good)
    assert one["children"] == [{"id": bad, "author": "claude-0"}] and one["verdict"] == "accepted"
    assert one["evaluations"][0]["speedup"] == 1.3 and "rows kernel" in one["source"]
    rejected = call(box, "read_candidate", id=bad)
    assert rejected["parent"] == good and "max abs error" in rejected["evaluations"][0]["reasons"][0]
    cut = call(box, "read_candidate", id=huge)
    assert f"[cut at {SOURCE_CHARS} of" in cut["source"]
    missing = call(box, "read_candidate", id="0" * 32)
    assert missing.is_error and "no candidate" in missing.content


def test_threads_and_submitting_a_child_of_an_unknown_parent(box):
    board, run = box.ctx.board, box.ctx.run_id
    idea = board.post_idea(run, author="offline-kernel-1", title="t", body="b", target="rms_norm")
    board.post(run, author="offline-kernel-1", body='{"kind": "template", "speedup": 1.1}', idea=idea, kind="result")
    thread = call(box, "read_thread", idea=idea.id)
    assert thread["idea"]["title"] == "t" and thread["posts"][0]["kind"] == "result"
    r = call(box, "submit_candidate", source="OVERRIDES = {}\n", parent="f" * 32)
    assert r.is_error and "no candidate" in r.content and box.verdicts == []
