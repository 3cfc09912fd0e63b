"""Issue 46's charts: every series in the legend, Pareto points labelled by what tells them apart, the
op-time chart weighted as the workload table, projections named for the device they are for."""

import dataclasses
import xml.etree.ElementTree as ET

import pytest

from compiler.search.baseline import op_ms
from compiler.plan.plots import bar_chart, scatter_chart, text_width
from compiler.plan.report import layout_labels, render
from compiler.ui.charts import op_breakdown
from persistent_engine import WorkloadPoint
from plan_samples import make_plan

SVG = "{http://www.w3.org/2000/svg}"


def _legend(svg: str, width: float) -> list[str]:
    """The legend's entry names, each asserted to lie inside the chart's width."""
    root = ET.fromstring(svg)
    group = next(g for g in root.iter(f"{SVG}g") if g.get("class") == "legend")
    names = []
    for t in group.iter(f"{SVG}text"):
        assert float(t.get("x")) + text_width(t.text) <= width, t.text
        names.append(t.text)
    return names


def test_every_bar_series_has_a_legend_entry_inside_the_chart():
    names = ["judging", "compile", "executor_wait", "other", "idle", "queue_wait"]
    svg = bar_chart("where time went", ["engine-0"], {n: [1.0] for n in names}, unit=" s")
    assert _legend(svg, 720) == names
    long = {"before (reference, measured on cpu)": [1.0], "after (plan, measured on cpu)": [0.5]}
    assert _legend(bar_chart("ops", ["linear"], long, width=400), 400) == list(long)


def test_scatter_legend_names_each_kind_of_point_drawn():
    both = scatter_chart("p", [(1, 3, "a", True), (3, 1, "c", False)], x_label="x", y_label="y",
                         front_name="front", other_name="rest")
    assert _legend(both, 720) == ["front", "rest"]
    assert _legend(scatter_chart("p", [(1, 3, "a", True)], x_label="x", y_label="y"), 720) == ["Pareto front"]


def test_pareto_points_are_labelled_by_what_differs_and_never_alike():
    same = {"tp": 1, "pp": 1, "ep": 1, "dp": 1, "dcp": 1, "dtype": "fp8", "kv_dtype": "bf16", "pd": "colocated",
            "replicas": 1}
    configs = [{**same, "batch": b} for b in (2048, 1024, 512, 256, 128, 64, 32, 16, 8, 4, 2, 1)]
    labels = layout_labels(configs)
    assert labels[0] == "tp1 pp1 ep1 dp1 fp8 b2048" and labels[-1] == "tp1 pp1 ep1 dp1 fp8 b1"
    assert len(set(labels)) == 12
    mixed = layout_labels([{**same, "batch": 8}, {**same, "batch": 8}, {**same, "batch": 8, "dtype": "bf16",
                                                                      "kv_dtype": "fp8", "tp": 2}])
    assert mixed == ["tp1 pp1 ep1 dp1 fp8 kv-bf16", "tp1 pp1 ep1 dp1 fp8 kv-bf16 #2", "tp2 pp1 ep1 dp1 bf16 kv-fp8"]
    plan = make_plan(parallelism={"configs": [{**c, "fits": True, "pareto": True, "tokens_per_s_per_gpu": 100.0 * i,
                                               "tokens_per_s_per_user": 1000.0 / i}
                                              for i, c in enumerate(configs, 1)], "best": configs[0]})
    svg = render(plan)["plots/parallelism_pareto.svg"]
    assert all(f"<title>{label}: " in svg for label in labels)       # every point's tooltip; drawn labels never overlap
    drawn = [t for t in ET.fromstring(svg).iter(f"{SVG}text") if t.get("font-size") == "10"]
    assert 1 < len(drawn) <= 12 and {t.text for t in drawn} <= set(labels)
    boxes = [(float(t.get("x")), float(t.get("y")) - 9, float(t.get("x")) + text_width(t.text, 10), float(t.get("y")) + 2)
             for t in drawn]
    assert not any(a[0] < b[2] and b[0] < a[2] and a[1] < b[3] and b[1] < a[3] for i, a in enumerate(boxes)
                   for b in boxes[i + 1:])


def _profile(weights=(0.5, 0.5)):
    """Two points with the same GPU-time share: decode steps of 1 ms, prefill steps of 100 ms."""
    return {"per_point": [
        {"point": {"phase": "decode", "batch": 8, "context": 512, "chunk": 1, "weight": weights[0]},
         "step_ms": 1.0, "ops": {"attention_decode": {"ms": 0.75}, "linear": {"ms": 0.25}}},
        {"point": {"phase": "prefill", "batch": 1, "context": 0, "chunk": 256, "weight": weights[1]},
         "step_ms": 100.0, "ops": {"attention_prefill": {"ms": 40.0}, "linear": {"ms": 60.0}}}]}


def test_op_time_gives_each_point_its_workload_table_weight_in_the_report_and_the_ui():
    points = [WorkloadPoint("decode", 8, 512, 1, 0.5), WorkloadPoint("prefill", 1, 0, 256, 0.5)]
    got = op_ms(_profile(), points)
    decode_steps, prefill_steps = got["attention_decode"] / 0.75, got["attention_prefill"] / 40.0
    assert got["linear"] == pytest.approx(decode_steps * 0.25 + prefill_steps * 60.0, rel=1e-4)
    # decode's ops hold its 50% of the chart's time, as the workload table says (w * step ms gave it 1%)
    decode_ms, prefill_ms = decode_steps * 1.0, prefill_steps * 100.0
    assert decode_ms / (decode_ms + prefill_ms) == pytest.approx(0.5, rel=1e-4)
    assert sum(got.values()) == pytest.approx(decode_ms + prefill_ms, rel=1e-4)
    before, after = op_breakdown(_profile(), [])            # the UI: the same function, the same figures
    assert before == got and after == got
    # a profile row the run's points do not hold weighs nothing (it is not in the table)
    extra = _profile()
    extra["per_point"].append({"point": {"phase": "decode", "batch": 64, "context": 64, "chunk": 1},
                               "step_ms": 2.0, "ops": {"linear": {"ms": 2.0}}})
    assert op_ms(extra, points) == got


def test_report_names_the_target_it_projects_for_and_the_device_it_measured_on():
    files = render(make_plan(version=3))                      # cpu measured, h200 targeted
    md = files["report.md"]
    assert md.startswith("# tkcc plan v3: tiny-dense projected for h200, measured on cpu\n")
    assert "- measured on: cpu (not on the target h200)" in md
    assert "Projected full-model figures for h200 (cost model for h200, not measured; this run measured on cpu" in md
    pareto = files["plots/parallelism_pareto.svg"]
    assert "projected for h200" in pareto and "this run measured on cpu, not on h200" in pareto
    assert "measured on cpu" in files["plots/op_time.svg"]
    on_gpu = make_plan(detected_device={"kind": "cuda", "name": "NVIDIA H200", "matches_hw": True})
    md = render(on_gpu)["report.md"]
    assert md.startswith("# tkcc plan v0: tiny-dense on h200\n") and "- measured on: NVIDIA H200\n" in md
    assert "this run measured on" not in render(on_gpu)["plots/parallelism_pareto.svg"]


def test_ui_run_names_target_and_measured_device():
    from compiler.ui.views import hw_words

    @dataclasses.dataclass
    class Run:
        hw: str
        config: dict

    assert hw_words(Run("h200", {"device": "cpu", "matches_hw": False})) == "projected for h200, measured on cpu"
    assert hw_words(Run("h200", {"device": "cpu"})) == "projected for h200, measured on cpu"   # older runs
    assert hw_words(Run("h200", {"device": "cuda", "device_name": "NVIDIA H200", "matches_hw": True})) == "on h200"
    assert hw_words(Run("h200", {"device": "cuda", "device_name": "NVIDIA H100", "matches_hw": False})) == \
        "projected for h200, measured on NVIDIA H100"


def test_optimize_summary_names_the_target_and_the_device_measured_on(capsys, tmp_path):
    import json

    from compiler.commands.optimize import _summary

    _summary(tmp_path, make_plan(version=3), False)
    assert capsys.readouterr().out.startswith("plan v3 (projected for h200, measured on cpu): ")
    _summary(tmp_path, make_plan(version=3), True)
    doc = json.loads(capsys.readouterr().out)
    assert (doc["hw"], doc["measured_on"]) == ("h200", "cpu")


def test_an_evaluation_not_better_is_told_from_rejected_and_from_not_judged():
    from types import SimpleNamespace as V

    from compiler.search.acceptance import AcceptanceConfig, Decision, screen
    from compiler.search.judging import evaluation_status

    cfg = AcceptanceConfig()
    within = screen(V(correct=True, speedup=1.001, reasons=[]), 0.02, cfg, "fast")
    wrong = V(correct=False, speedup=None, reasons=["max abs diff 3.1"])
    untimed = V(correct=True, speedup=None, reasons=[], untimed="interpreted Triton is not timed")
    assert evaluation_status(V(correct=True), within) == "not better"
    assert evaluation_status(wrong, screen(wrong, 0.02, cfg, "fast")) == "rejected"
    assert evaluation_status(untimed, screen(untimed, 0.02, cfg, "fast")) == "not judged"
    replay = Decision(False, "fast", "config replay x0.981 does not beat the baseline setting by 1% without a loss")
    assert evaluation_status(V(correct=True), replay) == "not better"
    assert evaluation_status(V(correct=True), Decision(True, "slow", "1.2x", fast=1.2, slow=1.2)) == "accepted"
