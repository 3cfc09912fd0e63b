import pytest
import torch

from persistent_engine.models.spec import ALIASES, ModelSpec
from persistent_engine.ops import registry
from persistent_engine.ops.registry import UnknownOpError
from persistent_engine.io_struct import WorkloadPoint

DESIGN_OPS = ["rms_norm", "fused_add_rms_norm", "silu_and_mul", "linear", "embedding", "rotary_embedding",
              "attention_decode", "attention_prefill", "moe_route", "moe_experts", "mla_decode", "mla_prefill",
              "lm_head", "sample"]


def test_every_design_op_is_registered_with_docs():
    assert set(DESIGN_OPS) <= set(registry.names())
    for name in registry.names():
        d = registry.get(name)
        assert d.name == name and name + "(" in d.signature and d.examples
        assert d.tolerance(torch.bfloat16)[0] > d.tolerance(torch.float32)[0]


def test_unknown_op_is_a_user_error():
    with pytest.raises(UnknownOpError, match="known ops: rms_norm"):
        registry.get("rms_nrom")
    with pytest.raises(UnknownOpError):
        registry.set_overrides({"nope": lambda x: x})
    assert UnknownOpError.user_error


def test_override_reaches_call_and_handles_and_restores():
    x, w = torch.ones(2, 4), torch.ones(4)
    handle = registry.op("rms_norm")       # bound before the override is set
    with registry.override({"rms_norm": lambda x, w, eps: x * 0 + 7}):
        assert registry.call("rms_norm", x, w, 1e-6).eq(7).all()
        assert handle(x, w, 1e-6).eq(7).all()
        with registry.override({"silu_and_mul": lambda x: x[..., :2]}):
            assert registry.call("rms_norm", x, w, 1e-6).eq(7).all()      # nested keeps the outer one
            assert "silu_and_mul" in registry.active_overrides()
        assert "silu_and_mul" not in registry.active_overrides()
    assert registry.call("rms_norm", x, w, 1e-6).sub(1).abs().max() < 1e-3
    assert registry.current("rms_norm") is registry.get("rms_norm").reference


def test_set_and_clear_overrides():
    registry.set_overrides({"silu_and_mul": lambda x: x})
    try:
        assert registry.call("silu_and_mul", torch.ones(1, 4)).shape == (1, 4)
        registry.set_overrides({"linear": lambda x, w, b: x})   # replaces, does not add
        assert set(registry.active_overrides()) == {"linear"}
    finally:
        registry.clear_overrides()
    assert registry.active_overrides() == {}
    assert registry.call("silu_and_mul", torch.ones(1, 4)).shape == (1, 2)


def test_make_inputs_is_seeded_and_leaves_global_rng_alone():
    torch.manual_seed(123)
    before = torch.random.get_rng_state()
    for name in registry.names():
        d = registry.get(name)
        a = d.make_inputs(d.examples[0], torch.float32, "cpu", 5)
        b = d.make_inputs(d.examples[0], torch.float32, "cpu", 5)
        c = d.make_inputs(d.examples[0], torch.float32, "cpu", 6)
        ta = [t for t in a if isinstance(t, torch.Tensor)]
        assert all(torch.equal(x, y) for x, y in zip(ta, [t for t in b if isinstance(t, torch.Tensor)]))
        assert not all(torch.equal(x, y) for x, y in zip(ta, [t for t in c if isinstance(t, torch.Tensor)]))
    assert torch.equal(before, torch.random.get_rng_state())


@pytest.mark.parametrize("alias", list(ALIASES))
def test_shapes_for_every_model_and_phase(alias):
    spec = ModelSpec.from_name(alias)
    for phase in ("decode", "prefill"):
        point = WorkloadPoint(phase=phase, batch=2, context=30, chunk=8 if phase == "prefill" else 1, weight=1.0)
        seen = {n: registry.get(n).shapes(spec, point) for n in registry.names()}
        attn = {"mla": "mla_" + phase, "v4": "compressed_attention"}.get(spec.attention, "attention_" + phase)
        assert seen[attn] and seen["linear"] and seen["rms_norm"] and seen["lm_head"]
        experts = seen["moe_experts"] or seen["moe_experts_relu2"] or seen["moe_experts_gelu"]   # Nemotron-H, Gemma-4
        assert bool(experts) == spec.is_moe and not (seen["moe_experts"] and seen["moe_experts_gelu"])
        assert bool(seen["ssd_" + phase]) == ("M" in spec.hybrid_pattern)
        assert bool(seen["hc_pre"]) == bool(seen["moe_experts_clamp"]) == (spec.attention == "v4")
        t = 2 * (8 if phase == "prefill" else 1)
        assert all(s["T"] == t for s in seen["linear"])
