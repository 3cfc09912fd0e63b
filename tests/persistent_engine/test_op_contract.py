import dataclasses

import pytest
import torch

from persistent_engine.ops import registry
from persistent_engine.ops.contract import check_op
from persistent_engine.io_struct import WorkloadPoint


@pytest.mark.parametrize("name", registry.names())
def test_reference_passes_its_own_contract(name):
    assert check_op(name, registry.get(name).reference) == []


def _ref(name):
    return registry.get(name).reference


def test_wrong_values_fail_as_mismatch():
    bad = lambda x, w, eps: _ref("rms_norm")(x, w, eps) * 1.05            # noqa: E731
    reasons = check_op("rms_norm", bad, dtypes=(torch.float32,))
    assert reasons and all("mismatch" in r for r in reasons)
    assert reasons[0].startswith("rms_norm fp32 {'x': [5, 64]}: mismatch")


def test_lower_precision_fails_in_fp32_but_passes_in_bf16():
    def via_bf16(x, w, b):
        return torch.nn.functional.linear(x.bfloat16(), w.bfloat16(), None if b is None else b.bfloat16()).to(x.dtype)
    assert check_op("linear", via_bf16, dtypes=(torch.bfloat16,)) == []
    assert any("mismatch" in r for r in check_op("linear", via_bf16, dtypes=(torch.float32,)))


def test_modifying_an_input_is_caught():
    def inplace(x):
        out = _ref("silu_and_mul")(x)
        x.zero_()
        return out
    assert all("modified input: argument 0" in r for r in check_op("silu_and_mul", inplace))


def test_nondeterminism_is_caught():
    calls = []

    def flaky(x, w, eps):
        calls.append(1)
        out = _ref("rms_norm")(x, w, eps)
        return out + (len(calls) % 2) * 1e-7 * out.abs().max()
    assert any("nondeterministic" in r for r in check_op("rms_norm", flaky, dtypes=(torch.float32,)))


def test_wrong_dtype_shape_count_and_exceptions():
    assert any("dtype: torch.bfloat16" in r for r in
               check_op("lm_head", lambda x, w: x @ w.t(), dtypes=(torch.bfloat16,)))
    assert any("shape:" in r for r in check_op("silu_and_mul", lambda x: x))
    assert any("output count" in r for r in
               check_op("fused_add_rms_norm", lambda x, r, w, e: _ref("rms_norm")(x + r, w, e)))
    reasons = check_op("embedding", lambda ids, w: 1 / 0)
    assert reasons and all("raised: ZeroDivisionError" in r for r in reasons)


def test_nan_output_is_caught():
    def holes(x):
        out = _ref("silu_and_mul")(x).clone()
        out[0, 0] = float("nan")
        return out
    assert all("non-finite" in r for r in check_op("silu_and_mul", holes))


def test_topk_order_is_free_but_ids_are_not():
    def reversed_order(*args):
        w, ids = _ref("moe_route")(*args)
        return w.flip(-1), ids.flip(-1)
    assert check_op("moe_route", reversed_order) == []

    def wrong_expert(*args):
        w, ids = _ref("moe_route")(*args)
        return w, torch.where(ids == ids.max(), (ids + 1) % args[0].shape[1], ids)
    assert any("integer values differ" in r for r in check_op("moe_route", wrong_expert))


def test_candidate_runs_before_the_reference(monkeypatch):
    order = []
    d = registry.get("silu_and_mul")

    def logged_ref(x):
        order.append("reference")
        return d.reference(x)

    def impl(x):
        order.append("impl")
        return d.reference(x)
    monkeypatch.setitem(registry._OPS, "silu_and_mul", dataclasses.replace(d, reference=logged_ref))
    assert check_op("silu_and_mul", impl, dtypes=(torch.float32,), shapes=[{"x": [2, 8]}]) == []
    assert order[:2] == ["impl", "impl"] and set(order[2:]) == {"reference"}


def test_explicit_shapes_from_a_model():
    from persistent_engine.models.spec import ModelSpec
    spec = ModelSpec.from_name("tiny-mla")
    point = WorkloadPoint(phase="decode", batch=3, context=20, chunk=1, weight=1.0)
    for name in ("mla_decode", "mla_q_absorb", "moe_route", "moe_experts"):
        shapes = registry.get(name).shapes(spec, point)
        assert shapes and check_op(name, _ref(name), shapes=shapes) == []
