"""Issue 46: the Triton interpreter's bf16 NaN is no rejection reason on CPU, and nothing else is excused.

Under TRITON_INTERPRET=1 (set by conftest) a bf16 ``x + r`` of masked loads stores NaN (triton 3.9.0), where a
GPU stores the sum. ``verify.op_level(interpreted=True)`` judges such an op on its fp32 cases (same shapes and
seeds) and says so; a kernel wrong or NaN in fp32, a finite 16-bit mismatch, and anything on a GPU stay rejected.
"""

import importlib.util
import pathlib

import pytest
import torch

from persistent_engine.verification import interpreter, verify
from persistent_engine.judge.checks import default_points
from persistent_engine.models.spec import ModelSpec
from persistent_engine.ops import registry

HERE = pathlib.Path(__file__).parent / "candidates"
OP = "fused_add_rms_norm"


def _impl(name: str):
    spec = importlib.util.spec_from_file_location(f"cand_{name}", HERE / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.OVERRIDES[OP]


def _check(impl, interpreted: bool) -> verify.Check:
    (c,) = verify.op_level([OP], {OP: impl}, ModelSpec.from_name("tiny-dense"), default_points("cpu"),
                           torch.device("cpu"), torch.bfloat16, seed=11, interpreted=interpreted)
    return c


def test_interpreter_bf16_nan_is_judged_in_fp32_and_said():
    c = _check(_impl("triton_native_add"), interpreted=True)
    assert c.passed, c.detail
    assert "bf16 checked in fp32" in c.detail and "interpreter's bf16 is not the GPU's" in c.detail


def test_the_same_kernel_is_rejected_where_triton_is_compiled():
    c = _check(_impl("triton_native_add"), interpreted=False)       # a GPU: its own bf16 decides
    assert not c.passed and "bf16" in c.detail and "non-finite" in c.detail


def test_a_kernel_wrong_in_fp32_is_still_rejected():
    c = _check(_impl("triton_native_add_wrong"), interpreted=True)
    assert not c.passed and "fp32" in c.detail and "mismatch" in c.detail


def test_nan_in_fp32_is_still_rejected():
    ref = registry.get(OP).reference

    def nan_everywhere(x, residual, weight, eps):
        out, res = ref(x, residual, weight, eps)
        return out * float("nan"), res
    c = _check(nan_everywhere, interpreted=True)
    assert not c.passed and "fp32" in c.detail and "non-finite" in c.detail


def test_a_finite_bf16_mismatch_is_not_excused():
    ref = registry.get(OP).reference

    def wrong_in_bf16(x, residual, weight, eps):
        out, res = ref(x, residual, weight, eps)
        return (out + 1 if x.dtype == torch.bfloat16 else out), res
    c = _check(wrong_in_bf16, interpreted=True)
    assert not c.passed and "bf16" in c.detail and "mismatch" in c.detail


@pytest.mark.parametrize("reason, dtype", [
    ("op-level: rms_norm bf16 {'x': [5, 64]}: non-finite: 3 values are NaN/inf", "bf16"),
    ("op-level: rms_norm fp16 {'x': [5, 64]}: non-finite: output 1: 3 values", "fp16"),
    ("op-level: rms_norm fp32 {'x': [5, 64]}: non-finite: 3 values are NaN/inf", ""),
    ("op-level: rms_norm bf16 {'x': [5, 64]}: mismatch: 3 of 320 values", ""),
    ("op-level: linear bf16 {'x': [5, 64]}: non-finite: 3 values", ""),
])
def test_only_16_bit_non_finite_reasons_of_the_op_are_excusable(reason, dtype):
    assert interpreter.low_precision_nonfinite("rms_norm", reason) == dtype


def test_only_sources_defining_a_triton_kernel_on_cpu_run_interpreted():
    src = (HERE / "triton_native_add.py").read_text()
    assert interpreter.runs_interpreted(src, "cpu")
    assert not interpreter.runs_interpreted(src, "cuda") and not interpreter.runs_interpreted(src, "cuda:1")
    assert not interpreter.runs_interpreted("import triton\nimport torch\n", "cpu")
