"""``tkcc candidate check``: exit 0 correct, 1 rejected (also for a candidate that kills its engine),
2 bad input; ``--json`` prints one document with correct, reasons and speedup."""

import os
import dataclasses
import json
import pathlib
import subprocess
import sys

import pytest

CANDIDATES = pathlib.Path(__file__).parents[1] / "persistent_engine" / "candidates"


def tkcc(*args, timeout=300):
    return subprocess.run([sys.executable, "-m", "compiler", "candidate", "check", *args],
                          capture_output=True, text=True, timeout=timeout)


def test_correct_candidate_exits_0_with_a_speedup():
    out = tkcc(str(CANDIDATES / "good_torch.py"), "--model", "tiny-dense", "--device", "cpu", "--json",
               "--samples", "5")
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["correct"] is True and doc["reasons"] == []
    assert isinstance(doc["speedup"], float) and doc["speedup"] > 0
    assert {"weights", "warmup"} <= set(doc["startup"])


def test_candidate_that_aborts_its_engine_is_rejected_not_crashed():
    out = tkcc(str(CANDIDATES / "abort_sneaky.py"), "--model", "tiny-dense", "--device", "cpu", "--json",
               "--timeout", "120")
    assert out.returncode == 1, out.stderr
    doc = json.loads(out.stdout)
    assert doc["correct"] is False and doc["speedup"] is None
    assert any("SIGABRT" in r for r in doc["reasons"])
    assert "Traceback" not in out.stderr


def test_statically_refused_candidate_is_rejected_without_an_engine():
    out = tkcc(str(CANDIDATES / "wrong_signature.py"), "--model", "tiny-dense", "--json", timeout=60)
    assert out.returncode == 1
    doc = json.loads(out.stdout)
    assert doc["correct"] is False and doc["startup"] == {}
    assert any("signature of rms_norm override" in r for r in doc["reasons"])
    human = tkcc(str(CANDIDATES / "unknown_op.py"), "--model", "tiny-dense", timeout=60)
    assert human.returncode == 1 and "correct:   no" in human.stdout and "rms_normalize" in human.stdout


@pytest.mark.parametrize("args, needle", [
    (["/no/such/file.py", "--model", "tiny-dense"], "not found"),
    ([str(CANDIDATES / "good_torch.py"), "--model", "no-such-model"], "unknown model"),
    ([str(CANDIDATES / "good_torch.py"), "--model", "tiny-dense", "--timeout", "0"], "--timeout"),
    ([str(CANDIDATES / "good_torch.py"), "--model", "tiny-dense", "--layers", "7"], "out of range"),
])
def test_bad_input_exits_2_with_one_line(args, needle):
    out = tkcc(*args, timeout=60)
    assert out.returncode == 2, (out.stdout, out.stderr)
    assert needle in out.stderr and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_a_correct_kernel_for_an_op_the_model_never_calls_is_correct_but_not_applicable():
    """Issue 21: ``correct`` says only whether the code is correct; "no effect on this model" is
    ``applicable: false`` (exit 0), not a rejection."""
    out = tkcc(str(CANDIDATES / "moe_route_torch.py"), "--model", "tiny-dense", "--device", "cpu", "--json",
               "--samples", "3")
    assert out.returncode == 0, out.stdout + out.stderr
    doc = json.loads(out.stdout)
    assert doc["correct"] is True and doc["applicable"] is False and doc["reasons"] == []
    assert doc["not_called"] == ["moe_route"] and doc["speedup"] is None
    out = tkcc(str(CANDIDATES / "good_torch.py"), "--model", "tiny-dense", "--device", "cpu", "--json",
               "--samples", "3")
    assert json.loads(out.stdout)["applicable"] is True


def test_a_wrong_kernel_for_an_op_the_model_never_calls_is_still_rejected(tmp_path):
    wrong = (CANDIDATES / "moe_route_torch.py").read_text().replace("return w * routed_scaling_factor",
                                                                     "return w * routed_scaling_factor * 1.5")
    f = tmp_path / "wrong_route.py"
    f.write_text(wrong)
    out = tkcc(str(f), "--model", "tiny-dense", "--device", "cpu", "--json")
    assert out.returncode == 1, out.stdout + out.stderr
    doc = json.loads(out.stdout)
    assert doc["correct"] is False and any("op-level" in r for r in doc["reasons"])


@pytest.mark.slow
def test_whole_layer_candidate_is_judged_through_the_executor():
    """A dense_gqa_decode_layer override (K/V written in place) on tiny llama-1b: correct; the same writing
    one row past the declared slots: rejected by the op-level check of the cache (~45 s each on 2 cores)."""
    good = tkcc(str(CANDIDATES / "layer_torch.py"), "--model", "llama-1b", "--tiny", "--device", "cpu", "--json",
                "--samples", "3")
    assert good.returncode == 0, good.stderr
    assert json.loads(good.stdout)["correct"] is True
    bad = tkcc(str(CANDIDATES / "layer_wrong_slot.py"), "--model", "llama-1b", "--tiny", "--device", "cpu", "--json",
               "--samples", "3")
    assert bad.returncode == 1, bad.stderr
    reasons = json.loads(bad.stdout)["reasons"]
    assert reasons and "outside its declared slots" in reasons[0]


@pytest.mark.slow
def test_layer_candidate_writing_an_extra_cache_row_only_in_the_model_is_rejected_at_layer_level():
    """Passes the op-level checks (their caches have spare blocks) and leaves the logits unchanged (the row is
    masked); the layer-level cache check names the pool (~45 s on 2 cores)."""
    out = tkcc(str(CANDIDATES / "layer_extra_row_in_model.py"), "--model", "llama-1b", "--tiny", "--device", "cpu",
               "--json", "--samples", "3")
    assert out.returncode == 1, out.stderr
    reasons = json.loads(out.stdout)["reasons"]
    assert reasons and all("KV cache rows other than its new tokens'" in r for r in reasons)


def test_the_text_says_the_spread_and_whether_a_gain_is_above_the_noise():
    """Issue 46: the same file read 0.930x, then 1.048x, with nothing to say which was noise."""
    from compiler.commands.candidate import noise_summary, point_line
    from persistent_engine.io_struct import PointTiming, WorkloadPoint

    at = WorkloadPoint("decode", 1, 24, 1, 0.5)
    clear = PointTiming(at, "decode b1 ctx24", True, 1.0, 0.8, 1.25, baseline_iqr_ms=0.02, candidate_iqr_ms=0.04,
                        speedup_q1=1.2)
    noisy = dataclasses.replace(clear, label="decode b3 ctx40", candidate_ms=0.97, speedup=1.03, speedup_q1=0.96)
    idle = dataclasses.replace(clear, label="prefill", affected=False, speedup=1.0, speedup_q1=None)
    assert "(IQR 2.0%)" in point_line(clear) and "(IQR 5.0%)" in point_line(clear)
    assert point_line(clear).endswith("q1 1.200: above the noise")
    assert point_line(noisy).endswith("q1 0.960: within the noise")
    assert point_line(idle).endswith("(not timed: no override runs here)")
    assert noise_summary([clear, noisy, idle]) == "above the measured noise at 1 of 2 timed point(s)"


def test_ops_lists_what_the_model_calls_with_its_share(tmp_path):
    """Issue 46: nothing listed the ops a model calls, so a user wrote an override that never ran."""
    r = subprocess.run([sys.executable, "-m", "compiler", "ops", "--model", "tiny-dense", "--device", "cpu", "--json"],
                       capture_output=True, text=True, timeout=300, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    by = {row["op"]: row for row in doc["ops"]}
    assert {"attention_decode", "attention_prefill", "lm_head", "embedding"} <= set(by)
    assert abs(sum(row["weighted"] for row in doc["ops"]) - 1.0) < 1e-6
    assert by["attention_prefill"]["share"][0] == 0.0 and by["attention_prefill"]["share"][2] > 0
    assert "linear" in by["add_rms_norm_linear"]["parts"]
    bad = subprocess.run([sys.executable, "-m", "compiler", "ops", "--model", "no-such-model"],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2 and len(bad.stderr.strip().splitlines()) == 1
