"""compiler.plan.compare: the plan against torch.compile of the same slice, per point, on CPU (the GPU path
— CUDA-graph plan, reduce-overhead compile — shares this code; it runs in benchmarks/e2e_decode.py)."""

from pathlib import Path

import pytest

from compiler.plan.compare import compare_with_torch_compile
from compiler.plan.compose import compose, Part
from persistent_engine.models.spec import ModelSpec
from persistent_engine.io_struct import WorkloadPoint

SILU = Path(__file__).parent / "candidates" / "silu_fused.py"
DECODE = WorkloadPoint(phase="decode", batch=2, chunk=1, context=24, weight=0.75)


def _source() -> str:
    return compose([Part(name="silu", source=SILU.read_text())])


def test_a_point_that_cannot_run_is_left_out_and_the_ratios_cover_the_rest():
    bogus = WorkloadPoint(phase="verify", batch=1, chunk=1, context=8, weight=0.25)   # no such phase
    res = compare_with_torch_compile(ModelSpec.from_name("tiny-dense"), [0], [DECODE, bogus], _source(),
                                     device="cpu", dtype="fp32", samples=3)
    assert (res["plan_timing"], res["torch_compile_mode"], res["device"]) == ("eager", "default", "cpu")
    assert res["weight_covered"] == 0.75
    good, bad = res["points"]
    assert "error" in bad and "verify" in bad["error"] and "error" not in good
    assert good["how"] == "eager" and good["compile_s"] > 0 and good["compile_cudagraphs"] is None
    for k in ("reference_ms", "plan_ms", "torch_compile_ms"):       # weighted over the point that ran
        assert res[k] == pytest.approx(0.75 * good[k], rel=1e-4) and res[k] > 0
    assert res["plan_vs_torch_compile"] == pytest.approx(res["torch_compile_ms"] / res["plan_ms"], rel=1e-3)
    assert res["plan_vs_reference"] == pytest.approx(res["reference_ms"] / res["plan_ms"], rel=1e-3)


def test_no_point_measurable_raises_with_the_first_error():
    bogus = WorkloadPoint(phase="verify", batch=1, chunk=1, context=8, weight=1.0)
    with pytest.raises(RuntimeError, match="no point could be compared: .*verify"):
        compare_with_torch_compile(ModelSpec.from_name("tiny-dense"), [0], [bogus], _source(),
                                   device="cpu", dtype="fp32", samples=1)
