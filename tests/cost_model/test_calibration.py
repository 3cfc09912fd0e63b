"""Calibration: the fit recovers known factors, stores per device, and reports its error."""
import json

import pytest

from cost_model import CostModelError, Efficiency, Layout, estimate_step, evaluate, fit, get_hardware, load_calibration
from cost_model.calibration import Calibration, load_measurements
from persistent_engine.models.spec import ModelSpec
from traffic_profiles import TrafficPoint

H200 = get_hardware("h200")
POINTS = [TrafficPoint(phase="decode", batch=b, context=c, chunk=1, weight=1.0)
          for b, c in ((1, 1024), (8, 2048), (64, 4096), (256, 1024), (16, 16384))] + \
         [TrafficPoint(phase="prefill", batch=1, context=c, chunk=n, weight=1.0)
          for c, n in ((0, 512), (0, 4096), (4096, 2048))]
TRUE = Efficiency(factors={"gemm": 1.3, "attention": 2.0, "moe": 1.6, "elementwise": 1.5, "comm": 1.0},
                  kernel_overhead_s=6e-6)


def _synthetic():
    rows = []
    for model, layers in (("llama-1b", None), ("qwen3-moe", [0, 1])):
        spec = ModelSpec.from_name(model)
        for p in POINTS:
            t = estimate_step(spec, H200, Layout(), p, layers, eff=TRUE).latency_s
            rows.append({"model": model, "layers": layers, "point": p.to_dict(), "seconds": t})
    return rows


def test_fit_recovers_known_factors():
    rows = _synthetic()
    calib = fit(rows[0::2], H200)
    assert calib.error_before > 0.2                       # the default roofline is off by the factors
    assert calib.error_after < 0.01
    assert calib.factors["attention"] == pytest.approx(2.0, rel=0.05)
    assert calib.factors["gemm"] == pytest.approx(1.3, rel=0.05)
    assert calib.kernel_overhead_s == pytest.approx(6e-6, rel=0.1)
    held = evaluate(calib, rows[1::2], H200)
    assert held["median_abs_error"] < 0.02 < evaluate(None, rows[1::2], H200)["median_abs_error"]


def test_store_per_device(tmp_path, monkeypatch):
    monkeypatch.setenv("TKCC_CALIBRATION_DIR", str(tmp_path))
    assert load_calibration("h200") is None or load_calibration("h200").source.endswith("h200.json")
    calib = fit(_synthetic(), H200, source="test")
    path = calib.save()
    assert path == tmp_path / "h200.json" and not list(tmp_path.glob(".*.tmp"))
    back = load_calibration("h200")
    assert back.factors == pytest.approx(calib.factors) and back.device == "h200"
    assert back.summary()["median_abs_error_after"] < back.summary()["median_abs_error_before"]
    assert load_calibration("b200") is None or "calibrations" in load_calibration("b200").source


def test_bad_files_are_user_errors(tmp_path):
    bad = tmp_path / "m.json"
    bad.write_text(json.dumps({"measurements": [{"model": "llama-1b", "seconds": -1, "point": {}}]}))
    with pytest.raises(CostModelError):
        load_measurements(bad)
    bad.write_text("{not json")
    with pytest.raises(CostModelError):
        load_measurements(bad)
    with pytest.raises(CostModelError):
        Calibration.from_dict({"kind": "other"})
    with pytest.raises(CostModelError):
        load_calibration("h200", path=tmp_path / "missing.json")


def test_split_form_recovers_memory_and_compute_factors(tmp_path):
    """Kernels that stream then compute (memory and compute times add, at different efficiencies):
    one factor per class cannot fit them, the split form recovers the factors and auto picks it."""
    true = Efficiency(kernel_overhead_s=6e-6, split={"gemm": (1.5, 3.0), "attention": (4.0, 1.2),
                                                     "moe": (2.0, 1.0), "elementwise": (3.0, 1.0)})
    rows = []
    for model, layers in (("llama-1b", None), ("qwen3-moe", [0, 1])):
        spec = ModelSpec.from_name(model)
        for p in POINTS:
            t = estimate_step(spec, H200, Layout(), p, layers, eff=true).latency_s
            rows.append({"model": model, "layers": layers, "point": p.to_dict(), "seconds": t})
    roof = fit(rows[0::2], H200, form="roofline")
    calib = fit(rows[0::2], H200)
    assert calib.form == "split" and calib.error_after < 0.01 < roof.error_after
    assert calib.split["gemm"] == pytest.approx([1.5, 3.0], rel=0.1)
    assert calib.split["attention"][0] == pytest.approx(4.0, rel=0.05)
    assert evaluate(calib, rows[1::2], H200)["median_abs_error"] < 0.02
    # the stored calibration keeps its form; estimates with it reproduce the measurements
    back = load_calibration("h200", path=calib.save(tmp_path / "h200.json"))
    assert back.form == "split" and back.split == pytest.approx(calib.split)
    est = estimate_step(ModelSpec.from_name("llama-1b"), H200, Layout(), POINTS[4], eff=back.efficiency).latency_s
    assert est == pytest.approx(rows[4]["seconds"], rel=0.02)
