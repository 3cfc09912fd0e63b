"""Calibration fits stay physical: bounded least squares, bounds on collinear data, and the
benchmark's ``--refit`` of stored measurements."""
import importlib.util
import json
from pathlib import Path

import numpy as np
import pytest

from cost_model import Efficiency, Layout, estimate_step, fit, get_hardware
from cost_model.calibration import COLUMNS, FORMS, FitBounds, _bvls
from persistent_engine.models.spec import ModelSpec
from traffic_profiles import TrafficPoint

H200 = get_hardware("h200")
ROOT = Path(__file__).resolve().parents[2]


def test_bvls_matches_scipy_on_random_and_collinear_problems():
    optimize = pytest.importorskip("scipy.optimize")
    rng = np.random.default_rng(0)
    for t in range(60):
        m, n = int(rng.integers(3, 30)), int(rng.integers(1, 12))
        a = rng.standard_normal((m, n))
        if t % 2:
            a[:, -1] = 2 * a[:, 0] + 1e-6 * rng.standard_normal(m)      # nearly collinear columns
        b = 3 * rng.standard_normal(m)
        lo = rng.uniform(-1, 0.5, n)
        hi = lo + rng.uniform(0.1, 2, n) if t % 3 else np.full(n, np.inf)
        x = _bvls(a, b, lo, hi)
        ref = optimize.lsq_linear(a, b, bounds=(lo, hi), method="bvls", tol=1e-14).x
        assert np.all(x >= lo) and np.all(x <= hi)
        assert np.sum((a @ x - b) ** 2) <= np.sum((a @ ref - b) ** 2) * (1 + 1e-6) + 1e-12


def _collinear_rows():
    """llama-1b decode at batch 1-8: the GEMM weight reads and the kernel count are (almost) the
    same at every point, so GEMM time and per-kernel overhead are collinear. The times are made
    with a GEMM faster than the datasheet allows (factor 0.3) and 10% noise: an unconstrained fit
    zeroes a factor, the bounded one must not."""
    true = Efficiency(factors={"gemm": 0.3, "attention": 1.5, "moe": 1.0, "elementwise": 3.0, "comm": 1.0},
                      kernel_overhead_s=2e-6)
    spec, rng = ModelSpec.from_name("llama-1b"), np.random.default_rng(1)
    rows = []
    for b in (1, 2, 4, 8):
        for c in (512, 1024, 4096, 16384):
            p = TrafficPoint(phase="decode", batch=b, context=c, chunk=1, weight=1.0)
            t = estimate_step(spec, H200, Layout(), p, eff=true).latency_s * rng.uniform(0.9, 1.1)
            rows.append({"model": "llama-1b", "layers": None, "point": p.to_dict(), "seconds": t, "graph": True})
    return rows


@pytest.mark.parametrize("form", [*FORMS, "auto"])
def test_fit_never_leaves_the_physical_box_on_collinear_data(form):
    bounds = FitBounds.for_hardware(H200)
    calib = fit(_collinear_rows(), H200, form=form)
    lo, hi = bounds.box(calib.form, H200)
    x = calib.vector()
    assert np.all(x >= lo - 1e-12) and np.all(x <= hi + 1e-12), dict(zip(COLUMNS[calib.form], x))
    assert 1e-6 - 1e-12 <= calib.kernel_overhead_s <= 10e-6 + 1e-12
    gemm = calib.split["gemm"] if calib.form == "split" else [calib.factors["gemm"]]
    assert min(gemm) >= min(H200.mem_efficiency, H200.compute_efficiency) - 1e-12 > 0
    if form == "auto":
        assert set(calib.loo_errors) == set(FORMS)


def _benchmark():
    spec = importlib.util.spec_from_file_location("cost_model_accuracy", ROOT / "benchmarks" / "cost_model_accuracy.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_refit_keeps_measured_rows_and_marks_the_result(tmp_path, capsys):
    bench = _benchmark()
    rows = _collinear_rows()
    for i, r in enumerate(rows):                    # what a previous run stored: measured + fitted keys
        r.update(samples=50, spread=0.01, predicted_before_s=1.0, predicted_after_s=1.0,
                 set="train" if i % 2 == 0 else "held_out")
    prev = tmp_path / "prev.json"
    prev.write_text(json.dumps({"hw": "h200", "device": "cuda", "measured_on": "2026-11-29", "rows": rows}))
    out = tmp_path / "out"
    assert bench.main(["--refit", str(prev), "--out-dir", str(out)]) == 0
    res = json.loads((out / "cost_model_accuracy_h200.json").read_text())
    assert res["refit"]["measured_on"] == "2026-11-29" and res["measured_on"] == "2026-11-29"
    assert res["device"] == "cuda" and res["points"] == len(rows)
    for old, new in zip(rows, res["rows"]):
        assert {k: v for k, v in new.items() if k not in bench.DERIVED} == \
               {k: v for k, v in old.items() if k not in bench.DERIVED}
        assert new["predicted_after_s"] != 1.0
    calib = json.loads((out / "cost_model_calibration_h200.json").read_text())
    assert calib["kernel_overhead_s"] >= 1e-6 and min(calib["factors"].values()) > 0
    assert "held_out" in capsys.readouterr().out


def test_refit_of_a_bad_file_is_one_line_exit_2(tmp_path, capsys):
    bench = _benchmark()
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"rows": [{"model": "llama-1b", "seconds": -1}]}))
    assert bench.main(["--refit", str(bad), "--out-dir", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: cannot re-fit") and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()
