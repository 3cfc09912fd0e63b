"""report.md and its SVG plots render from a plan record alone."""

import xml.etree.ElementTree as ET

from compiler.plan.plots import bar_chart, scatter_chart
from compiler.plan.report import render
from plan_samples import make_plan


def test_report_has_tables_and_three_wellformed_plots():
    files = render(make_plan(version=3))
    md = files["report.md"]
    assert md.startswith("# tkcc plan v3: tiny-dense projected for h200, measured on cpu")
    assert "differs from the target" in md                 # cpu measured, h200 targeted
    assert "![speedup per workload point](plots/speedup_per_point.svg)" in md
    assert "![time per op](plots/op_time.svg)" in md
    assert "![parallelism Pareto front](plots/parallelism_pareto.svg)" in md
    assert "| offline-0-rms_norm-1 | rms_norm | 1.310x | 1.120x |" in md
    assert "decode b8 ctx512" in md and "tp=1" in md
    for name in ("speedup_per_point", "op_time", "parallelism_pareto"):
        root = ET.fromstring(files[f"plots/{name}.svg"])      # well-formed XML
        assert root.tag.endswith("svg")


def test_bar_lengths_are_proportional_and_labels_escaped():
    svg = bar_chart("t <x>", ["a&b", "c"], {"s": [1.0, 2.0]})
    root = ET.fromstring(svg)
    widths = [float(r.get("width")) for r in root.iter("{http://www.w3.org/2000/svg}rect")
              if r.get("fill") not in ("white",) and r.get("height") != "10"]
    assert len(widths) == 2 and abs(widths[1] / widths[0] - 2.0) < 0.01
    assert "a&amp;b" in svg and "t &lt;x&gt;" in svg


def test_scatter_draws_front_through_highlighted_points_only():
    svg = scatter_chart("p", [(1, 3, "a", True), (2, 2, "b", True), (3, 1, "c", False)], x_label="x", y_label="y")
    root = ET.fromstring(svg)
    line = next(root.iter("{http://www.w3.org/2000/svg}polyline"))
    assert len(line.get("points").split()) == 2


def test_report_without_optimizations_or_layout_says_so():
    plan = make_plan(optimizations=(), parallelism=None, projected=None,
                     plan_speedup={"fast": 1.0, "slow": 1.0, "per_point": []}, baseline={})
    files = render(plan)
    assert "No candidate beat the reference" in files["report.md"]
    assert "none computed" in files["report.md"]
    assert set(files) == {"report.md"}


def test_report_states_the_torch_compile_comparison_its_method_coverage_or_failure():
    tc = {"plan_vs_torch_compile": 1.25, "plan_vs_reference": 2.5, "plan_ms": 1.0, "torch_compile_ms": 1.25,
          "reference_ms": 2.5, "plan_timing": "cuda_graph", "torch_compile_mode": "reduce-overhead",
          "weight_covered": 0.96, "points": [{"point": {"phase": "decode", "batch": 1}, "weight": 0.96},
                                             {"point": {"phase": "prefill", "batch": 1}, "weight": 0.04,
                                              "error": "InductorError: <SliceView>"}]}
    md = render(make_plan(baseline={"op_ms": {}, "torch_compile": tc}))["report.md"]
    assert "against `torch.compile` of the same slice: **1.250x** (plan 1.000 ms, cuda_graph" in md
    assert "mode reduce-overhead" in md and "covers 96.0% of the traffic weight" in md
    assert "left out: prefill b1 (InductorError: <SliceView>)" in md
    failed = render(make_plan(baseline={"op_ms": {}, "torch_compile": {"error": "RuntimeError: no point\n\nmore"}}))["report.md"]
    assert "against `torch.compile` of the same slice: not measured (RuntimeError: no point)\n" in failed
    assert "torch.compile" not in render(make_plan())["report.md"]


def test_report_shows_each_accepted_setting_with_its_goodput_when_an_slo_scored_it():
    from compiler.plan import artifact as plan_mod

    figures = {k: {"before": 10.0, "after": 5.0} for k in ("ttft_mean_ms", "ttft_p99_ms", "tpot_mean_ms",
                                                           "tokens_per_s", "tokens_per_busy_s")}
    plain = plan_mod.PlanOptimization(name="config-ab12", targets=("config",), speedup={"fast": 1.0, "slow": 1.0},
                                  projected={**figures, "modelled": ["the fit"]})
    slo = plan_mod.PlanOptimization(name="config-cd34", targets=("config",), speedup={"fast": 1.0, "slow": 1.0},
                                projected={**figures, "goodput_tokens_per_s": {"before": 32.5, "after": 69.25},
                                           "slo_attained": {"before": 0.304, "after": 1.0}})
    md = render(make_plan(optimizations=(plain, slo)))["report.md"]
    assert "goodput tokens/s (SLO met)" in md
    assert "| config-ab12 | 10.0 → 5.0 ms |" in md and "| no SLO given |" in md
    assert "| 32.5 → 69.25 (0.304 → 1.0) |" in md
