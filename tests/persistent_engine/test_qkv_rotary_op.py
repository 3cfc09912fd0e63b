"""add_rms_norm_qkv_rotary: the attention input of GQA layers without QK-norm (norm, qkv projection, rotary).

Reference = the composition of the fine references; the default dispatches through add_rms_norm_linear and
rotary_embedding (their overrides, and overrides of the ops inside those, still apply); an override of the
composite bypasses them; the decoder calls it once per Llama-style layer and not for QK-norm or MLA models;
the contract accepts the reference and the default and rejects known-bad versions."""

import collections

import pytest
import torch

from persistent_engine.measure import profiler
from persistent_engine.models.decoder import build_model
from persistent_engine.models.spec import ModelSpec
from persistent_engine.ops import registry
from persistent_engine.ops.attention import rope_cache
from persistent_engine.ops.contract import check_op
from persistent_engine.inputs.workloads import make_workload
from persistent_engine.io_struct import WorkloadPoint

NAME = "add_rms_norm_qkv_rotary"
DECODE = WorkloadPoint(phase="decode", batch=2, context=10, chunk=1, weight=1.0)
PREFILL = WorkloadPoint(phase="prefill", batch=1, context=6, chunk=5, weight=1.0)


def _ref(name):
    return registry.get(name).reference


def _inputs(shape_i=0, dtype=torch.float32, seed=0):
    d = registry.get(NAME)
    return d.make_inputs(d.examples[shape_i], dtype, "cpu", seed)


@pytest.fixture(autouse=True)
def _no_overrides_left():
    yield
    assert registry.active_overrides() == {}


# ----------------------------------------------------------------------------- the op itself
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape_i", [0, 1, 2])
def test_reference_is_the_composition_of_the_fine_references(dtype, shape_i):
    x, r, nw, eps, w, b, pos, cs, rot, hq, hk = args = _inputs(shape_i, dtype)
    qkv, new_r = _ref("add_rms_norm_linear")(x, r, nw, eps, w, b)
    t, dh = x.shape[0], w.shape[0] // (hq + 2 * hk)
    q0, k0, v0 = qkv.split([hq * dh, hk * dh, hk * dh], dim=-1)
    want_q, want_k = _ref("rotary_embedding")(pos, q0.reshape(t, hq, dh), k0.reshape(t, hk, dh), cs, rot)
    q, k, v, res = _ref(NAME)(*args)
    assert torch.equal(q, want_q) and torch.equal(k, want_k) and torch.equal(res, new_r)
    assert torch.equal(v, v0.reshape(t, hk, dh))                         # v is not rotated
    assert (q.shape, k.shape, v.shape, res.shape) == ((t, hq, dh), (t, hk, dh), (t, hk, dh), x.shape)
    assert q.dtype == k.dtype == v.dtype == res.dtype == dtype
    if rot < dh:                                                         # partial rotary: the tail passes through
        assert torch.equal(q[..., rot:], q0.reshape(t, hq, dh)[..., rot:])
        assert not torch.equal(q[..., :rot], q0.reshape(t, hq, dh)[..., :rot])


def test_reference_matches_an_independent_float64_formula():
    """norm, projection and a complex-number rotation of pairs (j, j + R/2), written out in float64."""
    x, r, nw, eps, w, b, pos, cs, rot, hq, hk = (a.double() if isinstance(a, torch.Tensor) and a.is_floating_point()
                                                 else a for a in _inputs(1))
    s = x + r
    qkv = (s / (s.pow(2).mean(-1, keepdim=True) + eps).sqrt() * nw) @ w.t() + b
    t, dh, half = x.shape[0], w.shape[0] // (hq + 2 * hk), rot // 2
    heads = qkv.view(t, hq + 2 * hk, dh)
    inv = 1.0 / 10000.0 ** (torch.arange(0, rot, 2, dtype=torch.float64) / rot)
    turn = torch.polar(torch.ones(t, half, dtype=torch.float64), pos.double()[:, None] * inv[None, :])
    rotated = heads.clone()
    z = torch.complex(heads[..., :half], heads[..., half:rot]) * turn[:, None, :]
    rotated[..., :half], rotated[..., half:rot] = z.real, z.imag
    q, k, v, res = _ref(NAME)(x, r, nw, eps, w, b, pos, cs, rot, hq, hk)
    assert torch.allclose(q, rotated[:, :hq], atol=1e-6) and torch.allclose(k, rotated[:, hq:hq + hk], atol=1e-6)
    assert torch.allclose(v, heads[:, hq + hk:], atol=1e-10) and torch.equal(res, s)


@pytest.mark.parametrize("impl", ["reference", "default"])
def test_outputs_never_alias_the_inputs(impl):
    args = _inputs(1)
    out = getattr(registry.get(NAME), impl)(*args)
    inputs = {a.untyped_storage().data_ptr() for a in args if isinstance(a, torch.Tensor)}
    assert not inputs & {o.untyped_storage().data_ptr() for o in out}


def test_default_is_what_runs_and_passes_the_contract():
    d = registry.get(NAME)
    assert d.composite and d.outputs == 4 and registry.current(NAME) is d.default
    assert check_op(NAME, d.reference) == [] and check_op(NAME, d.default) == []


def test_known_bad_versions_are_rejected_by_the_contract():
    def rotated_v(*args):
        q, k, v, res = _ref(NAME)(*args)
        pos, cs, rot = args[6], args[7], args[8]
        return q, k, _ref("rotary_embedding")(pos, v, v, cs, rot)[0], res
    assert any("mismatch: output 2" in m for m in check_op(NAME, rotated_v, dtypes=(torch.float32,)))

    def whole_head_rotary(*args):                  # ignores rotary_dim: wrong on the partial-rotary examples only
        a = list(args)
        dh = a[4].shape[0] // (a[9] + 2 * a[10])
        a[7], a[8] = rope_cache(a[7].shape[0], dh), dh
        return _ref(NAME)(*a)
    reasons = check_op(NAME, whole_head_rotary, dtypes=(torch.float32,))
    assert reasons and all(("'R': 8" in m or "'R': 6" in m) and "mismatch: output" in m for m in reasons)
    assert {m.split("mismatch: output ")[1][0] for m in reasons} == {"0", "1"}       # q and k, never v

    def kv_swapped(*args):
        q, k, v, res = _ref(NAME)(*args)
        return q, v.clone(), k.clone(), res
    assert any("mismatch" in m for m in check_op(NAME, kv_swapped, dtypes=(torch.float32,)))

    def three_outputs(*args):
        return _ref(NAME)(*args)[:3]
    assert any("output count" in m for m in check_op(NAME, three_outputs, dtypes=(torch.float32,)))

    def rotates_in_place(*args):                   # writes the caller's residual: a modified input
        out = _ref(NAME)(*args)
        args[1].add_(1.0)
        return out
    assert any("modified input" in m for m in check_op(NAME, rotates_in_place, dtypes=(torch.float32,)))


# ----------------------------------------------------------------------------- dispatch
def test_default_dispatches_through_fine_op_overrides_at_every_depth():
    seen = collections.Counter()

    def doubled_linear(x, w, b):
        seen["linear"] += 1
        return _ref("linear")(x, w, b) * 2

    def swapped_rotary(pos, q, k, cs, rot):
        seen["rotary_embedding"] += 1
        q2, k2 = _ref("rotary_embedding")(pos, q, k, cs, rot)
        return q2 + 1, k2 - 1
    args = _inputs(1)
    q, k, v, res = _ref(NAME)(*args)
    # linear sits two levels down (inside add_rms_norm_linear inside this composite)
    with registry.override({"linear": doubled_linear, "rotary_embedding": swapped_rotary}):
        q2, k2, v2, r2 = registry.call(NAME, *args)
    assert seen == {"linear": 1, "rotary_embedding": 1}
    assert torch.allclose(q2, q * 2 + 1, atol=1e-4) and torch.allclose(k2, k * 2 - 1, atol=1e-4)
    assert torch.allclose(v2, v * 2, atol=1e-5) and torch.equal(r2, res)

    def fused_arnl(*a):
        seen["add_rms_norm_linear"] += 1
        return _ref("add_rms_norm_linear")(*a)
    seen.clear()
    with registry.override({"add_rms_norm_linear": fused_arnl}):
        out = registry.call(NAME, *args)
    assert seen == {"add_rms_norm_linear": 1} and all(torch.equal(a, b) for a, b in zip(out, (q, k, v, res)))


def test_overriding_the_composite_bypasses_the_fine_ops():
    def boom(*args):
        raise AssertionError("a fine op ran inside an overridden composite")
    args = _inputs(0)
    fine = {n: boom for n in ("add_rms_norm_linear", "rotary_embedding", "linear", "fused_add_rms_norm")}
    with registry.override({**fine, NAME: lambda *a: _ref(NAME)(*a)}):
        out = registry.call(NAME, *args)
    assert all(torch.equal(a, b) for a, b in zip(out, _ref(NAME)(*args)))
    assert registry.current(NAME) is registry.get(NAME).default                                     # restored


# ----------------------------------------------------------------------------- shapes and the decoder
def test_shapes_only_for_gqa_without_qk_norm():
    point = WorkloadPoint(phase="decode", batch=4, context=512, chunk=1, weight=1.0)
    shapes = registry.get(NAME).shapes
    assert shapes(ModelSpec.from_name("llama-1b"), point) == [
        {"T": 4, "H": 2048, "Hq": 32, "Hk": 8, "Dh": 64, "R": 64, "bias": False}]
    for alias in ("qwen3-moe", "glm-4.6", "minimax-m2.5", "deepseek-v3", "tiny-moe", "tiny-mla"):   # QK-norm or MLA
        assert shapes(ModelSpec.from_name(alias), point) == [], alias
    assert shapes(ModelSpec.from_name("tiny-dense"), PREFILL)[0]["T"] == 5


@pytest.fixture(scope="module")
def llama():
    spec = ModelSpec.from_name("llama-1b").replace(vocab_size=512)        # real layer shapes, small vocab
    return build_model(spec, layers=[0, 1])


@pytest.mark.parametrize("point", [DECODE, PREFILL], ids=["decode", "prefill"])
def test_llama_slice_calls_it_once_per_layer_and_matches_the_unfused_path(llama, point):
    wl = make_workload(llama, point, seed=4)
    base = llama.step(wl)
    tree = profiler.call_tree(llama, wl)
    assert tree[NAME] == {"calls": 2, "parts": {"add_rms_norm_linear": 2, "rotary_embedding": 2}}
    assert "rotary_embedding" not in tree and tree["add_rms_norm_linear"]["calls"] == 2       # gate_up only
    calls = profiler.op_calls(llama, wl)
    assert calls["linear"] == 4 * 2 and calls["fused_add_rms_norm"] == 2 * 2 + 1     # qkv, gate_up, o, down; final
    # every op on its plain reference (the composite too): bitwise the same logits
    with registry.override({n: registry.get(n).reference for n in registry.names()}):
        assert torch.equal(llama.step(wl), base)
    # the composite's q/k really feed attention (and v its cache): perturbing them changes the logits
    for i in range(3):
        def off(*a, _i=i):
            out = list(_ref(NAME)(*a))
            out[_i] = out[_i] * 1.5
            return tuple(out)
        with registry.override({NAME: off}):
            assert not torch.equal(llama.step(wl), base), i


def test_qk_norm_models_keep_the_separate_rotary():
    model = build_model("tiny-moe")                                      # per-head QK-norm
    wl = make_workload(model, DECODE, seed=5)
    tree = profiler.call_tree(model, wl)
    assert NAME not in tree and tree["rotary_embedding"]["calls"] == 3 and tree["rms_norm"]["calls"] == 6
