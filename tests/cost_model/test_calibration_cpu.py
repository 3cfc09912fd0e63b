"""Calibration against the real engine on CPU (issue 6): step times of the tiny models and one
llama-1b layer at 28 workload points, measured with the engine's decoder; the factors are fitted on
every other point and must predict the other half within a median 15% absolute error.

Runs in ~20-40 s on 2 idle cores (one llama-1b layer with its 0.5 GB lm_head is most of it). The
measurement is robust to other processes: one torch thread, points sampled interleaved, the fastest
sample of each kept (persistent_engine.measure.suite)."""
import numpy as np

from cost_model import evaluate, fit, get_hardware
from persistent_engine.measure.suite import CPU_SUITE, measure_suite

HELD_OUT_LIMIT = 0.15


def _table(rows, before, after) -> str:
    lines = [f"{'model':<10} {'phase':>7} {'B':>3} {'ctx':>5} {'chunk':>5} {'measured ms':>11} {'before ms':>10} "
             f"{'after ms':>9} {'err':>6} set"]
    for i, (r, b, a) in enumerate(zip(rows, before, after)):
        p = r["point"]
        lines.append(f"{r['model']:<10} {p['phase']:>7} {p['batch']:>3} {p['context']:>5} {p['chunk']:>5} "
                     f"{r['seconds'] * 1e3:>11.3f} {b * 1e3:>10.3f} {a * 1e3:>9.3f} "
                     f"{(a - r['seconds']) / r['seconds']:>+6.0%} {'fit' if i % 2 == 0 else 'held-out'}")
    return "\n".join(lines)


def test_cpu_calibration_predicts_held_out_points():
    hw = get_hardware("cpu")
    rows = measure_suite(CPU_SUITE, device="cpu", rounds=12, min_rounds=6, budget_s=25.0)
    assert len(rows) >= 10 and all(r["seconds"] > 0 for r in rows)
    train, held = rows[0::2], rows[1::2]
    calib = fit(train, hw, source="tests/cost_model/test_calibration_cpu.py")
    ev_before, ev_after = evaluate(None, held, hw), evaluate(calib, held, hw)
    everything = evaluate(None, rows, hw)["predicted_s"], evaluate(calib, rows, hw)["predicted_s"]
    print()
    print(_table(rows, *everything))
    print(f"form {calib.form}; factors {calib.split or calib.factors}; kernel overhead "
          f"{calib.kernel_overhead_s * 1e6:.1f} us")
    print(f"fit set ({len(train)} points): median |error| before {calib.error_before:.1%} after {calib.error_after:.1%}")
    print(f"held-out ({len(held)} points): median |error| before {ev_before['median_abs_error']:.1%} "
          f"after {ev_after['median_abs_error']:.1%}")
    # the datasheet-free roofline is far off on eager CPU kernels; the calibration must fix it
    assert ev_before["median_abs_error"] > ev_after["median_abs_error"]
    assert ev_after["median_abs_error"] <= HELD_OUT_LIMIT
    # the fit is a real model of the engine, not a constant: it orders the points as measured
    pred, meas = np.array(ev_after["predicted_s"]), np.array(ev_after["measured_s"])
    assert np.corrcoef(np.log(pred), np.log(meas))[0, 1] > 0.9
